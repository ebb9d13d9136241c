"""bench.gpu.profile_summary: a synthetic chrome trace with known contents gives exact per-step rows."""

from __future__ import annotations

import gzip
import json

import pytest

import bench.gpu.profile_summary

ROOT = "/site/sglang_jetspec"


@pytest.fixture(scope="module")
def summary():
    return bench.gpu.profile_summary


def _x(cat, name, ts, dur=1.0, tid=1, correlation=None):
    event = {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}
    if correlation is not None:
        event["args"] = {"correlation": correlation}
    return event


def _step(t0: float, correlation: int) -> list[dict]:
    """One verify step at t0: a draft with two launches and an item() (D2H copy + sync), then a
    target forward with one launch; the device runs each kernel for a known time."""
    return [
        _x("python_function", f"{ROOT}/adapter/worker.py(328): _verify", t0, 100),
        _x("python_function", f"{ROOT}/core/tree_drafting.py(88): draft_trees", t0 + 1, 40),
        _x("cpu_op", "aten::mm", t0 + 2),
        _x("cuda_runtime", "cudaLaunchKernel", t0 + 3, correlation=correlation),
        _x("kernel", "gemm", t0 + 5, dur=4.0, tid=99, correlation=correlation),
        _x("cuda_runtime", "cudaLaunchKernel", t0 + 6, correlation=correlation + 1),
        _x("kernel", "softmax", t0 + 8, dur=2.0, tid=99, correlation=correlation + 1),
        _x("cuda_runtime", "cudaMemcpyAsync", t0 + 10, dur=3.0, correlation=correlation + 2),
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", t0 + 12, tid=99, correlation=correlation + 2),
        _x("cuda_runtime", "cudaStreamSynchronize", t0 + 14, dur=5.0),
        _x("python_function", "/site/sglang/srt/managers/tp_worker.py(300): forward_batch_generation", t0 + 50, 40),
        _x("cuda_runtime", "cudaLaunchKernel", t0 + 55, correlation=correlation + 3),
        _x("kernel", "attention", t0 + 60, dur=20.0, tid=99, correlation=correlation + 3),
        # frames of no interest: neither a region nor counted anywhere but inside the regions around them
        _x("python_function", "/usr/lib/python3.11/threading.py(10): wait", t0 + 60, 5),
        _x("cpu_op", "aten::mm", t0 + 200),  # between steps
    ]


def test_per_step_rows_hold_exactly_what_ran_inside_each_function(summary):
    profile = summary.summarize(_step(0, 1) + _step(1000, 11))
    totals = profile.regions
    assert profile.steps == 2
    assert set(totals) == {
        "adapter/worker:_verify",
        "core/tree_drafting:draft_trees",
        "sglang tp_worker:forward_batch_generation",
    }
    draft = totals["core/tree_drafting:draft_trees"]
    assert (draft.calls, draft.wall_us, draft.ops, draft.launches, draft.d2h) == (2, 80.0, 2, 4, 2)
    # the stream sync and the blocking D2H copy, and their time waiting
    assert (draft.syncs, draft.sync_us) == (4, 16.0)
    assert draft.kernel_us == 12.0  # its two kernels, twice; not the target's attention
    target = totals["sglang tp_worker:forward_batch_generation"]
    assert (target.launches, target.kernel_us, target.syncs) == (2, 40.0, 0)
    step = totals["adapter/worker:_verify"]
    assert (step.launches, step.kernel_us) == (6, 52.0)  # inclusive: the draft's and the target's
    assert profile.ops == {"aten::mm": [2, 2.0]}  # the op after the last step is outside every step


def test_nested_forwards_of_one_module_get_their_own_rows(summary):
    events = [
        _x("python_function", f"{ROOT}/adapter/worker.py(328): _verify", 0, 100),
        _x("python_function", f"{ROOT}/core/head.py(145): forward", 1, 50),
        _x("python_function", f"{ROOT}/core/head.py(83): forward", 2, 45),
    ]
    assert set(summary.summarize(events).regions) == {
        "adapter/worker:_verify",
        "core/head:forward@145",
        "core/head:forward@83",
    }


def test_markdown_is_per_step_and_sorted_by_wall_time(summary, tmp_path):
    trace = tmp_path / "t.trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": _step(0, 1) + _step(1000, 11)}, f)
    text = summary.summary_markdown(summary.summarize(summary.load_trace(trace)))
    functions = text.split("\n\nAten ops")[0]
    rows = [line for line in functions.splitlines() if line.startswith("| ") and not line.startswith("| function")]
    assert [r.split(" | ")[0] for r in rows] == [
        "| adapter/worker:_verify",
        "| core/tree_drafting:draft_trees",
        "| sglang tp_worker:forward_batch_generation",
    ]
    # draft_trees per step: 1 call, 0.04 ms, 1 op, 2 launches, 2 syncs waiting 0.008 ms, 1 D2H, 0.006 ms of kernels
    assert rows[1] == "| core/tree_drafting:draft_trees | 1.0 | 0.04 | 1 | 2 | 2.0 (0.01) | 1.0 | 0.01 |"
    assert text.startswith("2 verify steps profiled")
    assert text.rstrip().endswith("| aten::mm | 1.0 | 0.00 |")


def test_region_labels(summary):
    assert summary.region_label(f"{ROOT}/core/head.py(12): forward") == "core/head:forward@12"
    assert summary.region_label(f"{ROOT}/core/tree_drafting.py(88): draft_trees") == "core/tree_drafting:draft_trees"
    assert summary.region_label("/x/sglang/srt/managers/scheduler.py(9): run_batch") == "sglang scheduler:run_batch"
    assert summary.region_label("/x/sglang/srt/managers/scheduler.py(9): other") is None
    assert summary.region_label("aten::mm") is None
