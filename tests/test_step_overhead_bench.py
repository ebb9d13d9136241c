"""bench/step_overhead.py's reading of the probe's per-step records."""

from __future__ import annotations

from bench.step_overhead import DRAFT_GRAPH_OPS, summarise


def _record(batch: int, ops: int, draft: int | None) -> dict:
    record = {"batch_size": batch, "counted": True, "ops_outside_forward": ops, "host_syncs": 2}
    return record if draft is None else {**record, "draft_pass_ops": draft}


def test_a_drafting_pass_counts_as_one_graph_replay_and_a_step_without_one_keeps_its_ops():
    records = [_record(1, 237, 170), _record(1, 239, 170), _record(4, 223, 0), _record(1, 240, None)]
    one = summarise(records, 1)
    assert one["ops_outside_forward"] == 239 and one["ops_outside_forward_max"] == 240
    # 237 - 170 + 3, 239 - 170 + 3, and 240 from a record without the field (a plain server's)
    assert one["ops_with_draft_graph"] == 239 - 170 + DRAFT_GRAPH_OPS
    assert one["ops_with_draft_graph_max"] == 240
    assert summarise(records, 4)["ops_with_draft_graph"] == 223  # no drafting pass: nothing replaced
