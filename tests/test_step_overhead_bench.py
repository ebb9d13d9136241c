"""bench/step_overhead.py's reading of the probe's per-step records."""

from __future__ import annotations

from bench.step_overhead import DRAFT_GRAPH_KERNELS, DRAFT_GRAPH_OPS, summarise


def _record(batch: int, ops: int, draft: int | None, kernels: tuple[int, int] | None = None) -> dict:
    """A probed step's record: `kernels` (outside the forward, in the drafting pass) as a newer probe writes."""
    record = {"batch_size": batch, "counted": True, "ops_outside_forward": ops, "host_syncs": 2}
    if kernels is not None:
        record.update(kernels_outside_forward=kernels[0], draft_pass_kernels=kernels[1])
    return record if draft is None else {**record, "draft_pass_ops": draft}


def test_a_drafting_pass_counts_as_one_graph_replay_and_a_step_without_one_keeps_its_ops():
    records = [_record(1, 237, 170), _record(1, 239, 170), _record(4, 223, 0), _record(1, 240, None)]
    one = summarise(records, 1)
    assert one["ops_outside_forward"] == 239 and one["ops_outside_forward_max"] == 240
    # 237 - 170 + 3, 239 - 170 + 3, and 240 from a record without the field (a plain server's)
    assert one["ops_with_draft_graph"] == 239 - 170 + DRAFT_GRAPH_OPS
    assert one["ops_with_draft_graph_max"] == 240
    assert summarise(records, 4)["ops_with_draft_graph"] == 223  # no drafting pass: nothing replaced


def test_kernels_leave_out_the_views_and_count_the_drafting_pass_as_its_replays_kernels():
    records = [_record(1, 237, 170, (170, 110)), _record(1, 239, 170, (172, 110)), _record(4, 223, 0, (160, 0))]
    one = summarise(records, 1)
    assert one["kernels_outside_forward"] == 171 and one["kernels_outside_forward_max"] == 172
    assert one["kernels_with_draft_graph"] == 171 - 110 + DRAFT_GRAPH_KERNELS
    assert summarise(records, 4)["kernels_with_draft_graph"] == 160
    # an older probe's records (no kernel counts): none, not zero
    assert summarise([_record(1, 237, 170)], 1)["kernels_outside_forward"] is None


def test_host_work_comes_from_probed_steps_less_the_probe_and_its_growth_compares_the_end_sizes():
    from bench.step_overhead import host_growth, markdown

    def probed(batch: int, beyond: float, inside: float, probe: float) -> dict:
        return {
            **_record(batch, 160, 80),
            "host_beyond_ops_ms": beyond,
            "device_op_ms": inside,
            "probe_ms": probe,
            "host_work_ms": beyond - probe,
        }

    timed = {"batch_size": 1, "counted": False, "host_ms": 50.0, "forward_ms": 100.0, "step_ms": 150.0}
    one = summarise([probed(1, 10.0, 5.0, 8.0), probed(1, 12.0, 7.0, 8.0), probed(1, 14.0, 6.0, 10.0), timed], 1)
    assert (one["host_beyond_ops_ms"], one["device_op_ms"], one["host_ms"]) == (12.0, 6.0, 50.0)
    assert (one["host_work_ms"], one["probe_ms"]) == (4.0, 8.0)
    sixteen = summarise([probed(16, 15.0, 80.0, 10.0)], 16)
    assert sixteen["host_beyond_ops_ms"] == 15.0 and sixteen["host_ms"] is None  # no timed step at 16
    results = {"jetspec-16": {"greedy": {"1": one, "16": sixteen}, "sampled": {"1": one}}}
    # the goal's ratio is the host's own work's (5 / 4), not the probe-inflated one's (15 / 12)
    assert host_growth(results) == {("jetspec-16", "greedy"): 1.25}  # one size alone has no growth
    assert host_growth(results, "host_beyond_ops_ms") == {("jetspec-16", "greedy"): 1.25}
    sixteen["host_work_ms"] = 6.0
    assert host_growth(results) == {("jetspec-16", "greedy"): 1.5}
    meta = {"cpu": "CPU", "dtype": "float32", "commit": "abc", "command": "cmd"}
    text = markdown(results, meta)
    assert "| 12.0 (6.0) | 4.0 (8.0) |" in text
    assert "at most 1.5):\n\n- jetspec-16 greedy: 1.5" in text
    # an older probe's records (no such fields): none
    assert summarise([_record(1, 160, 80)], 1)["host_beyond_ops_ms"] is None
    assert summarise([_record(1, 160, 80)], 1)["host_calls_outside_forward"] is None


def test_host_calls_are_summarised_and_their_growth_reported():
    from bench.step_overhead import host_growth, markdown

    one = summarise([{**_record(1, 160, 80), "host_calls_outside_forward": n} for n in (40, 44, 42)], 1)
    sixteen = summarise([{**_record(16, 160, 80), "host_calls_outside_forward": 84}], 16)
    assert (one["host_calls_outside_forward"], one["host_calls_outside_forward_max"]) == (42, 44)
    results = {"jetspec-16": {"greedy": {"1": one, "16": sixteen}}}
    assert host_growth(results, "host_calls_outside_forward") == {("jetspec-16", "greedy"): 2.0}
    text = markdown(results, {"cpu": "CPU", "dtype": "float32", "commit": "abc", "command": "cmd"})
    assert "| 42 (44) |" in text and "Host calls, largest batch over batch 1:\n\n- jetspec-16 greedy: 2.0" in text
