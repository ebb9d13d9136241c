"""Where a JETSPEC step's time goes, from a torch profiler trace of the SGLang server (`/start_profile`).

    python -m bench.gpu.profile_summary TRACE.json.gz [--top 30]

SGLang's `/start_profile` (with_stack on, its default) records every Python function call as a
`python_function` event, every aten op as `cpu_op`, every CUDA runtime call (`cudaLaunchKernel`,
`cudaMemcpyAsync`, `cudaStreamSynchronize`, ...) as `cuda_runtime` on the calling thread, and every
kernel and device copy with the runtime call's `correlation` id. This attributes, per function of
the plugin (and the target forward and scheduler step around it), what happened inside its calls:
wall time, aten ops, kernel launches, host syncs and the time spent waiting in them, device-to-host
copies, and the device time of the kernels it launched. Times are inclusive (a function's row
contains its callees') and per verify step (calls of the worker's `_verify`); a second table lists the
aten ops inside the verify steps by host time (it showed cuDNN attention building a plan per step).
On a CPU trace only wall time and aten ops are filled.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# a with_stack event name: "<path>/<file>.py(<line>): <function>"
_FRAME = re.compile(r"(?P<path>[^\s(]+)\.py\((?P<line>\d+)\): (?P<function>[\w<>]+)$")
# regions outside the plugin worth a row: the target's forward and the scheduler's step around the worker
_SGLANG_REGIONS = {
    ("tp_worker", "forward_batch_generation"),
    ("scheduler", "run_batch"),
    ("scheduler", "process_batch_result"),
    ("scheduler", "get_next_batch_to_run"),
}
STEP_FUNCTION = "adapter/worker:_verify"
# names several classes of one module define (nn.Module.forward, comprehensions)
_AMBIGUOUS = {"forward", "<listcomp>", "<genexpr>", "<lambda>", "__init__", "__post_init__"}
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def region_label(event_name: str) -> str | None:
    """`.../sglang_jetspec/core/tree_drafting.py(88): draft_trees` -> `core/tree_drafting:draft_trees`, with the
    line where one file has several functions of that name (the head's modules' `forward`s:
    `core/head:forward@145`); SGLang's regions by file stem; None for every other frame."""
    match = _FRAME.search(event_name)
    if match is None:
        return None
    path, function = match["path"], match["function"]
    if "sglang_jetspec/" in path:
        line = f"@{match['line']}" if function in _AMBIGUOUS else ""
        return f"{path.rsplit('sglang_jetspec/', 1)[1]}:{function}{line}"
    stem = path.rsplit("/", 1)[-1]
    return f"sglang {stem}:{function}" if (stem, function) in _SGLANG_REGIONS else None


@dataclass
class Region:
    calls: int = 0
    wall_us: float = 0.0
    ops: int = 0
    launches: int = 0
    syncs: int = 0
    sync_us: float = 0.0
    d2h: int = 0
    kernel_us: float = 0.0


@dataclass
class _Track:
    """One thread's events of one kind, by start time, with prefix sums for range queries."""

    starts: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def prefix(self) -> None:
        order = sorted(range(len(self.starts)), key=self.starts.__getitem__)
        self.starts = [self.starts[i] for i in order]
        sums, total = [0.0], 0.0
        for i in order:
            total += self.values[i]
            sums.append(total)
        self.values = sums

    def within(self, start: float, end: float) -> float:
        lo, hi = bisect.bisect_left(self.starts, start), bisect.bisect_right(self.starts, end)
        return self.values[hi] - self.values[lo]


@dataclass
class Profile:
    steps: int  # verify steps (calls of the worker's _verify)
    regions: dict[str, Region]  # per region label, its totals over the trace
    ops: dict[str, list[float]]  # per aten op run inside a verify step: [calls, host us]


def summarize(events: list[dict]) -> Profile:
    kernel_us: dict[int, float] = defaultdict(float)
    d2h_ids: set[int] = set()
    for e in events:
        cat, correlation = e.get("cat"), (e.get("args") or {}).get("correlation")
        if correlation is None:
            continue
        if cat == "kernel":
            kernel_us[correlation] += e.get("dur", 0.0)
        elif cat == "gpu_memcpy" and "DtoH" in e.get("name", ""):
            d2h_ids.add(correlation)
    # per thread: counts (value 1) and durations of what a region may contain
    tracks: dict[tuple[str, object, object], _Track] = defaultdict(_Track)
    regions, ops = [], []
    for e in events:
        if e.get("ph") != "X":
            continue
        thread, cat, name, ts = (e.get("pid"), e.get("tid")), e.get("cat"), e.get("name", ""), e.get("ts", 0.0)
        correlation = (e.get("args") or {}).get("correlation")

        def add(kind: str, value: float = 1.0) -> None:
            track = tracks[(kind, *thread)]
            track.starts.append(ts)
            track.values.append(value)

        if cat == "python_function":
            label = region_label(name)
            if label is not None:
                regions.append((label, thread, ts, e.get("dur", 0.0)))
        elif cat == "cpu_op":
            add("ops")
            ops.append((name, thread, ts, e.get("dur", 0.0)))
        elif cat in ("cuda_runtime", "cuda_driver"):
            if name in LAUNCHES:
                add("launches")
                add("kernel_us", kernel_us.get(correlation, 0.0))
            elif name in SYNCS:
                add("syncs")
                add("sync_us", e.get("dur", 0.0))
            if correlation in d2h_ids:
                add("d2h")
                if name not in SYNCS:  # a blocking copy waits for the device as a sync would
                    add("syncs")
                    add("sync_us", e.get("dur", 0.0))
    for track in tracks.values():
        track.prefix()
    totals: dict[str, Region] = defaultdict(Region)
    empty = _Track(values=[0.0])
    for label, thread, ts, dur in regions:
        region = totals[label]
        region.calls += 1
        region.wall_us += dur
        for kind in ("ops", "launches", "syncs", "sync_us", "d2h", "kernel_us"):
            value = tracks.get((kind, *thread), empty).within(ts, ts + dur)
            setattr(
                region, kind, getattr(region, kind) + (int(value) if kind not in ("sync_us", "kernel_us") else value)
            )
    steps = totals[STEP_FUNCTION].calls if STEP_FUNCTION in totals else 0
    return Profile(steps, dict(totals), _ops_in_steps(ops, [r for r in regions if r[0] == STEP_FUNCTION]))


def _ops_in_steps(ops: list[tuple], steps: list[tuple]) -> dict[str, list[float]]:
    """Aten ops (nested ones too: an op's row contains the ops it calls) that ran inside a verify step."""
    spans: dict[object, list[tuple[float, float]]] = defaultdict(list)
    for _, thread, ts, dur in steps:
        spans[thread].append((ts, ts + dur))
    starts = {thread: sorted(s) for thread, s in spans.items()}
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, thread, ts, dur in ops:
        thread_spans = starts.get(thread, [])
        i = bisect.bisect_right(thread_spans, (ts, float("inf"))) - 1
        if i >= 0 and ts <= thread_spans[i][1]:
            out[name][0] += 1
            out[name][1] += dur
    return dict(out)


def summary_markdown(profile: Profile, top: int = 30, top_ops: int = 12) -> str:
    steps, totals = profile.steps, profile.regions
    per = max(1, steps)
    rows = sorted(totals.items(), key=lambda kv: -kv[1].wall_us)[:top]
    lines = [
        f"{steps} verify steps profiled; per step, inclusive (a row contains its callees'):",
        "",
        "| function | calls | wall ms | aten ops | launches | syncs (ms waiting) | D2H copies | kernel ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, r in rows:
        lines.append(
            f"| {label} | {r.calls / per:.1f} | {r.wall_us / per / 1e3:.2f} | {r.ops / per:.0f} | "
            f"{r.launches / per:.0f} | {r.syncs / per:.1f} ({r.sync_us / per / 1e3:.2f}) | {r.d2h / per:.1f} | "
            f"{r.kernel_us / per / 1e3:.2f} |"
        )
    ops = sorted(profile.ops.items(), key=lambda kv: -kv[1][1])[:top_ops]
    lines += [
        "",
        "Aten ops inside the verify steps by host time per step (inclusive: an op contains the ops it calls):",
        "",
        "| aten op | calls | host ms |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {calls / per:.1f} | {us / per / 1e3:.2f} |" for name, (calls, us) in ops]
    return "\n".join(lines) + "\n"


def load_trace(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path, help="a chrome trace from SGLang's /start_profile (.json or .json.gz)")
    p.add_argument("--top", type=int, default=30, help="rows, by wall time per step")
    args = p.parse_args(argv)
    print(summary_markdown(summarize(load_trace(args.trace)), top=args.top), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
