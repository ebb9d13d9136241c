"""Per-process set-up for SGLang on the device machine with the test-only GPU stand-in.

Python imports ``sitecustomize`` at start-up from ``sys.path``; with ``tests/sglang_gpu/stub`` first on
``PYTHONPATH`` this runs in the server and in every process it spawns. It does nothing unless
``JETSPEC_SGLANG_GPU_STANDIN=1``. When on, it registers ``jetspec_gpu_standin_dual_gemm`` as
``sglang.kernels.ops.gemm.cutedsl_dual_gemm`` (see that file: the real one imports CUTLASS's DSL,
which does not travel). The stand-in ``sgl_kernel`` package beside this file needs no set-up.
Any other ``sitecustomize`` further down ``sys.path`` still runs afterwards.
"""

from __future__ import annotations

import importlib.util
import os
import sys

ENABLE_ENV = "JETSPEC_SGLANG_GPU_STANDIN"
DUAL_GEMM = "sglang.kernels.ops.gemm.cutedsl_dual_gemm"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _install() -> None:
    sys.path.insert(0, _HERE)
    try:
        import jetspec_gpu_standin_dual_gemm as standin
    finally:
        sys.path.remove(_HERE)
    sys.modules.setdefault(DUAL_GEMM, standin)


def _chain_next_sitecustomize() -> None:
    """The CPU stand-in's chaining (its sitecustomize, loaded under another name, only defines)."""
    path = os.path.join(_HERE, os.pardir, os.pardir, "sglang_cpu", "stub", "sitecustomize.py")
    spec = importlib.util.spec_from_file_location("_jetspec_cpu_stub_site", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.chain_next_sitecustomize(_HERE, __file__)


if os.environ.get(ENABLE_ENV) == "1":
    _install()

_chain_next_sitecustomize()
