"""Per-process set-up for running SGLang's CPU engine on the test-only sgl-kernel stand-in.

Python imports ``sitecustomize`` at start-up from ``sys.path``; with ``tests/sglang_cpu/stub`` first on
``PYTHONPATH`` this file runs in the server process and in every child it spawns (scheduler,
detokenizer), which inherit the environment. It does nothing unless ``JETSPEC_SGLANG_CPU_STANDIN=1``
is set, and it lives under tests/, so a normal install never sees it.

When switched on, it makes SGLang's platform report ``has_amx=True`` so
``arg_groups/overrides.py::_attention_backend_platform_fallbacks`` keeps ``--attention-backend
intel_amx`` instead of switching to ``torch_native``. It uses SGLang's public
``sglang.srt.runtime_context.override_platform(has_amx=True).install()``, applied by a post-import hook
right after ``sglang.srt.runtime_context`` is first imported (this process imports nothing of SGLang
itself). Only that platform fact changes: ``cpu_has_amx_support()``, which decides whether layers use
AMX kernels, stays False because the stand-in defines no ``convert_weight_packed``.

With ``JETSPEC_TEST_STEP_PROFILE`` also set, the same hook installs the benchmark's scheduler-side
step timer (``step_profile.py``) when ``sglang.srt.managers.scheduler`` is imported; with
``JETSPEC_TEST_STEP_OVERHEAD`` set, the per-step overhead probe (``step_overhead.py``); with
``JETSPEC_TEST_VERIFY_REGION`` set, the host-sync count of the verify's captured region (``verify_region.py``).

Any other ``sitecustomize`` further down ``sys.path`` still runs afterwards.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

ENABLE_ENV = "JETSPEC_SGLANG_CPU_STANDIN"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _report_amx(module) -> None:
    module.override_platform(has_amx=True).install()


# the scheduler-side instruments a benchmark switches on: variable -> module under stub/ with install(scheduler)
_SCHEDULER_PROBES = {
    "JETSPEC_TEST_STEP_PROFILE": "step_profile",
    "JETSPEC_TEST_STEP_OVERHEAD": "step_overhead",
    "JETSPEC_TEST_VERIFY_REGION": "verify_region",
}


def _install_scheduler_probes(module) -> None:
    sys.path.insert(0, _HERE)
    try:
        probes = [importlib.import_module(name) for env, name in _SCHEDULER_PROBES.items() if os.environ.get(env, "").strip()]
    finally:
        sys.path.remove(_HERE)
    for probe in probes:
        probe.install(module)


# module -> what runs right after it is first imported
_HOOKS = {"sglang.srt.runtime_context": _report_amx}
if any(os.environ.get(env, "").strip() for env in _SCHEDULER_PROBES):
    _HOOKS["sglang.srt.managers.scheduler"] = _install_scheduler_probes


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Finds each module of _HOOKS through the other finders and runs its hook after it executes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner) -> None:
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        _HOOKS.pop(module.__name__)(module)
        if not _HOOKS:
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PostImportHook)]

    def __getattr__(self, name):  # get_source, get_filename, is_package, ... of the real loader
        return getattr(self._inner, name)


def _install() -> None:
    for name in [n for n in _HOOKS if n in sys.modules]:
        _HOOKS.pop(name)(sys.modules[name])
    if _HOOKS:
        sys.meta_path.insert(0, _PostImportHook())


def chain_next_sitecustomize(stub_dir: str, this_file: str) -> None:
    """Run the sitecustomize that the one in `stub_dir` shadows, if any (one later on sys.path).
    The GPU stand-in's sitecustomize (tests/sglang_gpu/stub) calls this too."""
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != stub_dir]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None or spec.origin == this_file:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # at interpreter start-up; loaded under another name, it only defines
    if os.environ.get(ENABLE_ENV) == "1":
        _install()
    chain_next_sitecustomize(_HERE, __file__)
