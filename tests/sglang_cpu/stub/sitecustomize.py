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

Any other ``sitecustomize`` further down ``sys.path`` still runs afterwards.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

ENABLE_ENV = "JETSPEC_SGLANG_CPU_STANDIN"
HOOKED_MODULE = "sglang.srt.runtime_context"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _report_amx(module) -> None:
    module.override_platform(has_amx=True).install()


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Finds HOOKED_MODULE through the other finders and runs `_report_amx` after it executes."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != HOOKED_MODULE:
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
        _report_amx(module)
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PostImportHook)]

    def __getattr__(self, name):  # get_source, get_filename, is_package, ... of the real loader
        return getattr(self._inner, name)


def _install() -> None:
    if HOOKED_MODULE in sys.modules:
        _report_amx(sys.modules[HOOKED_MODULE])
    else:
        sys.meta_path.insert(0, _PostImportHook())


def _chain_next_sitecustomize() -> None:
    """Run the sitecustomize this file shadows, if any (one later on sys.path)."""
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None or spec.origin == __file__:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if os.environ.get(ENABLE_ENV) == "1":
    _install()

_chain_next_sitecustomize()
