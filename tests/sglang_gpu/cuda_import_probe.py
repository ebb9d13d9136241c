"""Import SGLang's server modules as a CUDA machine would, on any machine, and report what they needed.

    python tests/sglang_gpu/cuda_import_probe.py [--block DIST ...] [MODULE ...]

Runs in its own process (it patches torch): without a GPU, ``torch.cuda`` reports one Hopper GPU, so SGLang's
module-level ``if is_cuda():`` imports run; ``sgl_kernel`` is the GPU stand-in (``stub/``, put first
on ``sys.path`` here); each distribution named by ``--block`` is made absent (import raises
ModuleNotFoundError and ``find_spec`` answers None, as on the device image, which lacks it) so
SGLang takes its without-it paths. Prints one JSON object: ``imported`` / ``failed`` modules, and
``distributions``, every installed distribution whose top-level package ended up in
``sys.modules``. Nothing is executed beyond imports (no CUDA call is made).

Used by bench/gpu/missing_packages.py (what the device image lacks) and tests/sglang_gpu (the stand-in
provides every name the CUDA import path asks for).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import json
import os
import sys
import traceback

STUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stub")

# What the scheduler, tokenizer manager and HTTP server of a Llama target with Triton attention,
# the pytorch sampler, xgrammar grammars and the JETSPEC plugin import.
SERVER_MODULES = [
    "sglang.launch_server",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.models.llama",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.layers.sampler",
    "sglang.srt.constrained.xgrammar_backend",
    "sglang.srt.speculative.ngram_worker",
    "sglang_jetspec.sglang_plugin",
    "sglang_jetspec.adapter.worker",
]


def _top_levels_of(distributions: list[str]) -> set[str]:
    wanted = {d.lower().replace("_", "-") for d in distributions}
    return {
        top
        for top, dists in md.packages_distributions().items()
        if any(d.lower().replace("_", "-") in wanted for d in dists)
    }


def _pretend_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        return  # a real GPU answers for itself
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_name = lambda *a, **k: "stand-in Hopper"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", nargs="*", default=[], help="distributions to make unimportable")
    parser.add_argument("modules", nargs="*", default=SERVER_MODULES)
    args = parser.parse_args()
    sys.path.insert(0, STUB)
    sys.modules.pop("sgl_kernel", None)
    for top in _top_levels_of(args.block) - {"sgl_kernel"}:
        sys.modules[top] = None  # import raises ModuleNotFoundError, find_spec answers None: as if absent
    os.environ.setdefault("SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "1")
    _pretend_cuda()
    imported, failed = [], {}
    for name in args.modules:
        try:
            importlib.import_module(name)
            imported.append(name)
        except Exception as exc:  # report every module's failure, not only the first
            failed[name] = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    # top-level packages that came from an installed distribution (not the stand-in, not absent)
    loaded = {
        name.split(".")[0]
        for name, module in list(sys.modules.items())
        if module is not None and not (getattr(module, "__file__", None) or "").startswith(STUB)
    }
    owners = md.packages_distributions()
    distributions = sorted({d for top in loaded for d in owners.get(top, [])})
    json.dump(
        {
            "imported": imported,
            "failed": failed,
            "distributions": distributions,
            "sgl_kernel": getattr(sys.modules.get("sgl_kernel"), "__file__", None),
        },
        sys.stdout,
        indent=1,
    )
    print()


if __name__ == "__main__":
    main()
