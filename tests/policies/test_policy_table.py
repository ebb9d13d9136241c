"""Pushed tables: validation names the field, the runtime applies/expires them, the endpoint guards them."""

from __future__ import annotations

import copy
import json

import pytest

from policies.control_api import handle_get_internal_state, handle_set_internal_state
from policies.loader import parse_policy_text
from policies.problems import PolicyError
from policies.runtime import ActivePolicy
from policies.table import default_table, validate_table

POLICY = parse_policy_text("""\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 16, 64], default: 16}
  - {name: bs2-8, min_batch: 2, max_batch: 8, budgets: [0, 4, 8], default: 4}
gate: {probe_share: 0.05}
controller: {interval_s: 10, ttl_s: 90}
""")

KEY = "secret"


def table(**changes) -> dict:
    data = default_table(POLICY).model_dump(mode="json")
    data["cohorts"][0].update(changes)
    return data


def rejected(data) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        validate_table(data, POLICY)
    return [str(p) for p in caught.value.problems]


def test_default_table_round_trips():
    data = table(budget=64, probe={"budget": 16, "share": 0.05})
    parsed = validate_table(data, POLICY)
    assert parsed.budgets() == {"bs1": 64, "bs2-8": 4}
    assert parsed.cohorts[0].probe.budget == 16
    assert validate_table(json.loads(parsed.model_dump_json()), POLICY) == parsed


@pytest.mark.parametrize("changes, expected", [
    ({"budget": 32}, "cohorts[0].budget 32 is not a candidate of 'bs1' -- use one of [0, 4, 16, 64]"),
    ({"budget": "16"}, "cohorts[0].budget must be a whole number, got '16'"),
    ({"budget": -4}, "cohorts[0].budget = -4 is out of range -- use a value >= 0"),
    ({"colour": "red"}, "unknown key 'colour' in cohorts[0]"),
    ({"probe": {"budget": 64, "share": 0.7}}, "cohorts[0].probe.share = 0.7 is out of range -- use a value <= 0.5"),
    ({"probe": {"budget": 64, "share": 0.5}}, "cohorts[0].probe.share 0.5 exceeds gate.probe_share 0.05"),
    ({"probe": {"budget": 16, "share": 0.05}}, "cohorts[0].probe.budget 16 is not another candidate of 'bs1'"),
    ({"max_batch": 2}, "cohorts[0] is 'bs1' 1..2 but the server policy has 'bs1' 1..1"),
])
def test_bad_pushes_are_rejected_naming_the_field(changes, expected):
    problems = rejected(table(**changes))
    assert any(expected in p for p in problems), problems
    assert all(" -- " in p for p in problems)


def test_missing_ttl_and_wrong_cohort_count():
    data = table()
    del data["ttl_s"]
    assert rejected(data) == ["ttl_s is missing -- add the key 'ttl_s' (see policies/README.md)"]
    data = table()
    data["cohorts"].pop()
    assert rejected(data)[0].startswith("cohorts has 1 entries, the server policy has 2")


def test_active_policy_applies_expires_and_counts_generations():
    active = ActivePolicy(POLICY)
    assert active.state(0.0).source == "yaml" and active.state(0.0).generation == 0
    state = active.apply(table(budget=64), now=100.0)
    assert (state.source, state.expires_at, state.generation) == ("pushed", 190.0, 1)
    assert active.table(189.9).budgets()["bs1"] == 64
    expired = active.state(190.0)
    assert (expired.source, expired.expires_at, expired.generation) == ("yaml", None, 2)
    assert expired.table == default_table(POLICY)


def test_invalid_push_keeps_the_running_table():
    active = ActivePolicy(POLICY)
    active.apply(table(budget=64), now=0.0)
    with pytest.raises(PolicyError):
        active.apply(table(budget=33), now=1.0)
    assert active.state(2.0).table.budgets()["bs1"] == 64
    assert active.state(2.0).generation == 1


def test_probe_share_is_exact_and_evenly_spread():
    active = ActivePolicy(POLICY)
    active.apply(table(budget=16, probe={"budget": 64, "share": 0.05}), now=0.0)
    picks = [active.budget_for_step(1, now=1.0) for _ in range(1000)]
    probe_steps = [i for i, (_, budget) in enumerate(picks) if budget == 64]
    assert len(probe_steps) == 50
    assert max(b - a for a, b in zip(probe_steps, probe_steps[1:])) <= 21
    assert {cohort for cohort, _ in picks} == {"bs1"}


def test_batches_beyond_the_last_cohort_use_it():
    active = ActivePolicy(POLICY)
    assert active.budget_for_step(8, now=0.0) == ("bs2-8", 4)
    assert active.budget_for_step(500, now=0.0) == ("bs2-8", 4)


def _push(active, payload, authorization=f"Bearer {KEY}", admin_key=KEY):
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return handle_set_internal_state(active, body, authorization, admin_key, now=10.0)


def test_endpoint_requires_the_admin_key():
    active = ActivePolicy(POLICY)
    payload = {"server_args": {"jetspec_policy": table(budget=64)}}
    assert _push(active, payload, authorization=None)[0] == 401
    assert _push(active, payload, authorization="Bearer wrong")[0] == 401
    assert _push(active, payload, admin_key=None)[0] == 403
    assert active.state(11.0).source == "yaml"
    status, answer = _push(active, payload)
    assert status == 200 and answer["jetspec_policy"]["table"]["cohorts"][0]["budget"] == 64
    assert handle_get_internal_state(active, now=11.0)["jetspec_policy"]["expires_at"] == 100.0


def test_endpoint_rejects_bad_bodies_with_the_field_named():
    active = ActivePolicy(POLICY)
    assert _push(active, b"{not json")[0] == 400
    status, answer = _push(active, {"server_args": {"other": 1}})
    assert status == 400 and "server_args.jetspec_policy is missing" in answer["error"]
    bad = copy.deepcopy(table())
    bad["cohorts"][1]["budget"] = 16
    status, answer = _push(active, {"server_args": {"jetspec_policy": bad}})
    assert status == 400
    assert answer["problems"] == ["jetspec_policy: cohorts[1].budget 16 is not a candidate of 'bs2-8' "
                                  "-- use one of [0, 4, 8]"]
