"""What a decode step would cost a GPU outside the target's forward, counted on any device (a CPU included).

`StepProbe` is a torch function mode and a torch dispatch mode together. Inside it:

- **device ops**: every aten op dispatched on the device's data, the proxy for a kernel launch on a GPU.
  Work on host data (a tree walked in Python, a list turned into a tensor to ship) launches nothing and
  is not counted. **Kernel ops** are the device ops less the views (`slice`, `view`, `transpose`, ...:
  an op whose schema says its output aliases its input without writing it), which change a tensor's
  metadata on the host and launch nothing on a GPU either.
- **host syncs**: every read of device data by the host: `.item()`, `.tolist()`, `.cpu()`, `.numpy()`,
  truthiness, `int()` / `float()`, and the ops whose output shape depends on the data (`nonzero`,
  boolean indexing, `masked_select`, `unique`, ...). Each is filed under its caller's `file:line`.
- **fused on CUDA**: a function that a CUDA build dispatches as one fused kernel while a CPU build
  decomposes it (`F.rms_norm`: one `_fused_rms_norm` on CUDA, five elementwise ops on a CPU, under
  no_grad as SGLang runs a step) is counted as that one kernel (FUSED_ON_CUDA; tests/test_step_probe.py
  checks each entry against the installed torch's dispatch of a fake CUDA tensor).
- **host calls**: every torch call on host data alone (a factory without a device, an op on host
  tensors, a host tensor's method): host work done one tensor op at a time, which a per-request loop
  multiplies by the batch size (a call made inside another host call is not counted again).
- **device-op seconds**: the wall time spent inside the counted device ops (and the stand-in kernels) themselves.
  On a CPU each op computes where it is dispatched, so a step's wall time outside the forward less these
  seconds is what the host spends on everything else (Python, building host tensors, dispatch, the probe's
  own few microseconds an op): what a GPU step would still pay on its host while the ops run on the device.
- `paused()` excludes a region (the target's forward) from every count.
- `strict=True` raises `HostSyncError` at the first sync instead: what a graph-captured region must pass.

Which tensors are host data, on a machine where everything is on one device (the CPU harness): tensors
made inside the probe by a factory without a `device` argument (`torch.tensor(list)`, `torch.arange(n)`,
`torch.rand(n, generator=g)`), what `.cpu()` returns, what `mark_host` names, and whatever is computed
from host data alone. Everything else (the model's weights and pools, the batch's tensors, a factory's
output on an explicit device, anything computed with device data) is device data: a tensor of unknown
origin counts as device, so the counts err high, never low. `.to(device)` of host data is device data
(a copy on a GPU; on a CPU the probe returns a copy too, so the host tensor keeps its class).
"""

from __future__ import annotations

import gc
import math
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

_T = torch.Tensor
# reads of a tensor's values by the host
_READS = {_T.item, _T.tolist, _T.numpy, _T.__bool__, _T.__int__, _T.__float__, _T.__index__, _T.cpu}
# ops whose output's shape depends on the data: the host must read it before it can allocate
_DATA_SHAPED = {
    torch.nonzero,
    _T.nonzero,
    torch.argwhere,
    _T.argwhere,
    torch.masked_select,
    _T.masked_select,
    torch.unique,
    _T.unique,
    torch.unique_consecutive,
    _T.unique_consecutive,
    torch.bincount,
    _T.bincount,
}
_INDEXING = {_T.__getitem__, _T.__setitem__, _T.index_put_, _T.index_put}
_FACTORIES = {
    torch.tensor,
    torch.as_tensor,
    torch.zeros,
    torch.ones,
    torch.empty,
    torch.full,
    torch.arange,
    torch.eye,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.randperm,
    torch.linspace,
}
# function -> the one op a CUDA build dispatches for it, where a CPU build dispatches its decomposition
FUSED_ON_CUDA = {torch.nn.functional.rms_norm: "_fused_rms_norm.default"}
_HERE = __file__


class HostSyncError(RuntimeError):
    """A host sync inside a region that must have none (a CUDA graph's)."""


@dataclass
class StepCounts:
    device_ops: int = 0
    kernel_ops: int = 0  # the device ops a GPU launches a kernel for: every one but the views
    host_syncs: int = 0
    sync_sites: Counter = field(default_factory=Counter)  # "file:line (what)" -> syncs there
    op_names: Counter = field(default_factory=Counter)  # aten op -> device dispatches
    op_sites: Counter = field(default_factory=Counter)  # "file:line" -> device dispatches there
    device_op_s: float = 0.0  # wall seconds inside the counted device ops and stand-in kernels
    host_calls: int = 0  # torch calls on host data alone: host work done a tensor op at a time
    # wall seconds the probe's handlers spent on their own bookkeeping while counting (see `_Overhead`),
    # and how many handler calls there were (torch's mode machinery costs each one more: `machinery_seconds`)
    probe_s: float = 0.0
    handler_calls: int = 0

    def probe_cost_s(self, machinery_s: float) -> float:
        """The probe's whole cost so far: its handlers' own time and `machinery_s` for each handler call."""
        return self.probe_s + self.handler_calls * machinery_s


def _bool_index(index) -> bool:
    return any(isinstance(leaf, _T) and leaf.dtype == torch.bool for leaf in tree_leaves(index))


def _caller() -> str:
    """The first frame outside torch, contextlib and this module: where the sync is written."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path != _HERE and "/torch/" not in path and not path.endswith("contextlib.py"):
            parts = path.split("/")
            short = "/".join(parts[-2:])
            return f"{short}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class _Overhead:
    """One probe handler's own time: its whole call less the stretches `outside()` marks (the real
    function it wraps, in which inner handlers time themselves), added to the counts' `probe_s` while
    counting. What a probed step's wall time holds beyond the step's own work, to subtract from it."""

    def __init__(self, probe: "StepProbe") -> None:
        self.probe = probe
        self.start = time.perf_counter()
        self.excluded = 0.0

    @contextmanager
    def outside(self):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.excluded += time.perf_counter() - start

    def close(self) -> None:
        if self.probe.counting:
            self.probe.counts.probe_s += time.perf_counter() - self.start - self.excluded
            self.probe.counts.handler_calls += 1


class _Dispatch(TorchDispatchMode):
    def __init__(self, probe: "StepProbe") -> None:
        super().__init__()
        self.probe = probe

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        probe = self.probe
        with probe.own_time() as own:
            if probe.counting and not probe.in_host_call:
                probe.counts.device_ops += 1
                probe.counts.kernel_ops += not func.is_view
                probe.counts.op_names[func.__name__] += 1
                if probe.op_sites:
                    probe.counts.op_sites[_caller()] += 1
                with own.outside():
                    start = time.perf_counter()
                    try:
                        return func(*args, **(kwargs or {}))
                    finally:
                        probe.counts.device_op_s += time.perf_counter() - start
            with own.outside():
                return func(*args, **(kwargs or {}))


class _Functions(TorchFunctionMode):
    def __init__(self, probe: "StepProbe") -> None:
        super().__init__()
        self.probe = probe

    def __torch_function__(self, func, types, args=(), kwargs=None):
        with self.probe.own_time() as own:
            return self._handle(func, args, kwargs or {}, own)

    def _handle(self, func, args, kwargs, own: "_Overhead"):
        probe = self.probe
        tensors = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, _T)]
        on_device = [t for t in tensors if not probe.is_host(t)]
        if func in _FACTORIES:
            device = kwargs.get("device")
            host = device is None or device == "cpu"
        else:
            host = not on_device
        if host and probe.counting and not probe.in_host_call:
            probe.counts.host_calls += 1
        if on_device and self._syncs(func, args, kwargs):
            probe.sync(func)
        if on_device and func in FUSED_ON_CUDA:
            with probe.kernel(FUSED_ON_CUDA[func]), own.outside():
                return func(*args, **kwargs)
        if func is _T.to and tensors and not on_device and _to_device(args, kwargs):
            with own.outside():
                out = self._call(func, args, kwargs, host=False)  # host -> device: one copy, a device tensor
                return out.clone() if out is args[0] else out
        with own.outside():
            out = self._call(func, args, kwargs, host=host)
        if func in (_T.cpu, _T.numpy) and on_device:
            out = out.clone() if isinstance(out, _T) and out is args[0] else out
            probe.mark_host(out)
        elif host:
            probe.mark_host(out)
        return out

    def _call(self, func, args, kwargs, host: bool):
        probe = self.probe
        outer, probe.in_host_call = probe.in_host_call, host or probe.in_host_call
        try:
            return func(*args, **kwargs)
        finally:
            probe.in_host_call = outer

    def _syncs(self, func, args, kwargs) -> bool:
        if func in _READS or func in _DATA_SHAPED:
            return True
        if func in (torch.where, _T.where) and len(args) + len(kwargs) == 1:
            return True  # torch.where(cond) is nonzero
        if func in _INDEXING and len(args) > 1 and _bool_index(args[1]):
            # a boolean mask that lives on the device selects a data-dependent number of elements
            return not all(self.probe.is_host(t) for t in tree_leaves(args[1]) if isinstance(t, _T))
        return False


def _to_device(args, kwargs) -> bool:
    """`.to(...)` names a device (not only a dtype)."""
    for value in (*args[1:], kwargs.get("device")):
        if isinstance(value, (torch.device, str)) or (isinstance(value, int) and not isinstance(value, bool)):
            return True
    return False


class StepProbe:
    """Counts device ops and host syncs while entered (see the module docstring); `paused()` excludes a
    region; `strict` raises at the first sync. Reusable: `take()` returns the counts so far and resets."""

    def __init__(self, strict: bool = False, op_sites: bool = False) -> None:
        self.strict, self.op_sites = strict, op_sites  # op_sites: file each device op under its caller
        self.counts = StepCounts()
        self.counting = False
        self.in_host_call = False
        self._host = WeakIdKeyDictionary()
        self._modes: list = []
        self.started = 0.0

    def is_host(self, tensor: torch.Tensor) -> bool:
        return tensor in self._host

    def mark_host(self, *values) -> None:
        """Every tensor in `values` (nested lists, tuples, dicts) is host data."""
        for leaf in tree_leaves(values):
            if isinstance(leaf, _T):
                self._host[leaf] = True

    def mark_host_within(self, obj, depth: int = 4) -> None:
        """Every tensor held by `obj` (its attributes, lists, dicts, to `depth` levels): state that lives on
        the host, made before the probe started (a learner's tables, a lookup store)."""
        seen: set[int] = set()

        def walk(value, left: int) -> None:
            if id(value) in seen or left < 0:
                return
            seen.add(id(value))
            if isinstance(value, _T):
                self._host[value] = True
            elif isinstance(value, dict):
                for item in value.values():
                    walk(item, left - 1)
            elif isinstance(value, (list, tuple, set)):
                for item in value:
                    walk(item, left - 1)
            elif hasattr(value, "__dict__") and not isinstance(value, (type, torch.nn.Module)):
                for item in vars(value).values():
                    walk(item, left - 1)

        walk(obj, depth)

    @contextmanager
    def own_time(self):
        """A handler's call, its own time (less what it marks `outside()`) billed to `probe_s`."""
        own = _Overhead(self)
        try:
            yield own
        finally:
            own.close()

    @contextmanager
    def kernel(self, name: str):
        """A context for one call of a stand-in for a single device kernel (a CPU harness's PyTorch code
        where a GPU launches one kernel): counted as one device op (its seconds as device-op seconds), its
        insides neither ops nor syncs."""
        counting = self.counting
        if counting:
            self.counts.device_ops += 1
            self.counts.kernel_ops += 1
            self.counts.op_names[name] += 1
            if self.op_sites:
                self.counts.op_sites[_caller()] += 1
        start = time.perf_counter()
        try:
            with self.paused():
                yield
        finally:
            if counting:
                self.counts.device_op_s += time.perf_counter() - start

    def sync(self, func) -> None:
        if not self.counting:
            return
        site = f"{_caller()} ({getattr(func, '__name__', func)})"
        if self.strict:
            raise HostSyncError(f"host sync inside a region that must have none: {site}")
        self.counts.host_syncs += 1
        self.counts.sync_sites[site] += 1

    def take(self) -> StepCounts:
        counts, self.counts = self.counts, StepCounts()
        return counts

    @contextmanager
    def paused(self):
        was, self.counting = self.counting, False
        try:
            yield
        finally:
            self.counting = was

    def __enter__(self) -> "StepProbe":
        self._modes = [_Functions(self), _Dispatch(self)]
        for mode in self._modes:
            mode.__enter__()
        self.counting = True
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.counting = False
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        self._modes = []


def machinery_seconds(calls: int = 4000, repeats: int = 3) -> float:
    """Seconds per probe handler call that torch's mode machinery adds outside the handler's own timing
    (entering Python from the dispatcher, popping and pushing the mode), measured on this machine: a loop
    of small device ops and host calls timed bare and under the probe, the difference less the handlers'
    own time and the ops' time over the handler calls. The loop's ops are tiny, so their own time left in
    the bare run makes this err low: a step's host work with it subtracted errs high, never low."""
    device = torch.zeros(16)

    def loop() -> float:
        start = time.perf_counter()
        y = device
        for i in range(calls // 2):
            y = y + 1  # a device op
            torch.tensor([i, i])  # a host call
        return time.perf_counter() - start

    with StepProbe(op_sites=True):
        loop()  # the modes' first use imports modules: not a per-call cost
    bare = min(loop() for _ in range(repeats))
    best = math.inf
    for _ in range(repeats):
        gc.disable()  # as a probed step runs (tests/sglang_cpu/stub/step_overhead.py)
        try:
            with StepProbe(op_sites=True) as probe:
                wall = loop()
        finally:
            gc.enable()
        counts = probe.take()
        best = min(best, (wall - bare - counts.probe_s - counts.device_op_s) / max(counts.handler_calls, 1))
    return max(best, 0.0)
