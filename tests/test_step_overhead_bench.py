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
