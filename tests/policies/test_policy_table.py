"""Pushed tables: validation names the field, the runtime applies/expires them, the endpoint guards them."""

from __future__ import annotations

import json

import pytest

from policies.control_api import (
    handle_server_info,
    handle_set_internal_state,
    policy_readback,
    table_from_flat_args,
    table_to_flat_args,
)
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


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"budget": 32}, "cohorts[0].budget 32 is not a candidate of 'bs1' -- use one of [0, 4, 16, 64]"),
        ({"budget": "16"}, "cohorts[0].budget must be a whole number, got '16'"),
        ({"budget": -4}, "cohorts[0].budget = -4 is out of range -- use a value >= 0"),
        ({"colour": "red"}, "unknown key 'colour' in cohorts[0]"),
        ({"probe": {"budget": 64, "share": 0.7}}, "cohorts[0].probe.share = 0.7 is out of range -- use a value <= 0.5"),
        ({"probe": {"budget": 64, "share": 0.5}}, "cohorts[0].probe.share 0.5 exceeds gate.probe_share 0.05"),
        ({"probe": {"budget": 16, "share": 0.05}}, "cohorts[0].probe.budget 16 is not another candidate of 'bs1'"),
        ({"max_batch": 2}, "cohorts[0] is 'bs1' 1..2 but the server policy has 'bs1' 1..1"),
    ],
)
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
    picks = [active.step_plan(1, now=1.0) for _ in range(1000)]
    probe_steps = [i for i, plan in enumerate(picks) if plan.budget == 64]
    assert len(probe_steps) == 50
    assert max(b - a for a, b in zip(probe_steps, probe_steps[1:])) <= 21
    assert {plan.cohort for plan in picks} == {"bs1"}


def test_batches_beyond_the_last_cohort_use_it():
    active = ActivePolicy(POLICY)
    assert active.step_plan(8, now=0.0) == ("bs2-8", 4, 0, 0, "head", None, "top_k", True)
    assert active.step_plan(500, now=0.0) == ("bs2-8", 4, 0, 0, "head", None, "top_k", True)


def _push(active, payload, authorization=f"Bearer {KEY}", admin_key=KEY):
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return handle_set_internal_state(active, body, authorization, admin_key, now=10.0)


def flat(**changes) -> dict:
    """A flat push (what SGLang's /set_internal_state admits) of table(**changes)."""
    return {"server_args": table_to_flat_args(validate_table(table(**changes), POLICY))}


# POLICY's default table with bs1 at budget 64 probing 16 on 5% of steps, in SGLang's flat form: numbers
# only (tests/controller/test_controller_push.py: what the push client sends).
FLAT_BS1_64_PROBING_16 = {
    "jetspec_policy.ttl_s": 90.0,
    "jetspec_policy.bs1.budget": 64,
    "jetspec_policy.bs1.draft_rounds": 0,
    "jetspec_policy.bs1.tree_width": 0,
    "jetspec_policy.bs1.drafter": 0,
    "jetspec_policy.bs1.sampled_children": 0,
    "jetspec_policy.bs1.probe_budget": 16,
    "jetspec_policy.bs1.probe_share": 0.05,
    "jetspec_policy.bs2-8.budget": 4,
    "jetspec_policy.bs2-8.draft_rounds": 0,
    "jetspec_policy.bs2-8.tree_width": 0,
    "jetspec_policy.bs2-8.drafter": 0,
    "jetspec_policy.bs2-8.sampled_children": 0,
}


def test_flat_keys_are_numbers_and_round_trip():
    pushed = validate_table(table(budget=64, probe={"budget": 16, "share": 0.05}), POLICY)
    assert table_to_flat_args(pushed) == FLAT_BS1_64_PROBING_16
    assert table_from_flat_args(table_to_flat_args(pushed), POLICY) == pushed


def test_the_drafter_travels_as_its_index():
    args = {**flat()["server_args"], "jetspec_policy.bs1.drafter": 1}
    assert [c.drafter for c in table_from_flat_args(args, POLICY).cohorts] == ["hybrid", "head"]
    without = {k: v for k, v in args.items() if not k.endswith(".drafter")}
    assert [c.drafter for c in table_from_flat_args(without, POLICY).cohorts] == ["head", "head"]  # the YAML's


def test_tree_sizing_travels_as_its_index_and_reaches_the_step_plan():
    args = {**flat()["server_args"], "jetspec_policy.bs1.tree_sizing": 1}
    table_ = table_from_flat_args(args, POLICY)
    assert [c.tree_sizing for c in table_.cohorts] == ["adaptive", None]  # None: the YAML's, i.e. the server's own
    assert table_to_flat_args(table_)["jetspec_policy.bs1.tree_sizing"] == 1
    assert "jetspec_policy.bs2-8.tree_sizing" not in table_to_flat_args(table_)
    active = ActivePolicy(POLICY)
    assert _push(active, {"server_args": args})[0] == 200
    assert active.step_plan(1, now=10.0).tree_sizing == "adaptive" and active.step_plan(4, now=10.0).tree_sizing is None


def test_sampled_children_travel_as_their_index_and_reach_the_step_plan():
    args = {**flat()["server_args"], "jetspec_policy.bs1.sampled_children": 1}
    table_ = table_from_flat_args(args, POLICY)
    assert [c.sampled_children for c in table_.cohorts] == ["drawn", "top_k"]
    assert table_to_flat_args(table_)["jetspec_policy.bs1.sampled_children"] == 1
    active = ActivePolicy(POLICY)
    assert _push(active, {"server_args": args})[0] == 200
    assert (
        active.step_plan(1, now=10.0).sampled_children == "drawn"
        and active.step_plan(4, now=10.0).sampled_children == "top_k"
    )


@pytest.mark.parametrize(
    "field, codes",
    [
        ("drafter", "{0: 'head', 1: 'hybrid'}"),
        ("tree_sizing", "{0: 'fixed', 1: 'adaptive'}"),
        ("sampled_children", "{0: 'top_k', 1: 'drawn'}"),
    ],
)
def test_a_bad_code_for_a_field_sent_as_its_index_is_refused_naming_the_codes(field, codes):
    with pytest.raises(PolicyError) as caught:
        table_from_flat_args({**flat()["server_args"], f"jetspec_policy.bs2-8.{field}": 2}, POLICY)
    assert [str(p) for p in caught.value.problems] == [
        f"jetspec_policy.bs2-8.{field} 2 is not a {field} code -- send one of {codes}"
    ]


@pytest.mark.parametrize(
    "key, expected",
    [
        ("ttl_s", "unknown key ttl_s"),  # the prefix is part of the key
        ("bs1.budget", "unknown key bs1.budget"),
        ("jetspec_policy.bs9.budget", "unknown key jetspec_policy.bs9.budget"),
        ("jetspec_policy.bs1.colour", "unknown key jetspec_policy.bs1.colour"),
    ],
)
def test_flat_keys_outside_the_scheme_are_unknown(key, expected):
    with pytest.raises(PolicyError) as caught:
        table_from_flat_args({**flat()["server_args"], key: 4}, POLICY)
    assert [str(p) for p in caught.value.problems] == [
        f"{expected} -- send jetspec_policy.ttl_s and "
        "jetspec_policy.<cohort>.{budget,draft_rounds,tree_width,drafter,tree_sizing,"
        "sampled_children,probe_budget,probe_share} "
        "for cohorts ['bs1', 'bs2-8']"
    ]


def test_endpoint_requires_the_admin_key():
    active = ActivePolicy(POLICY)
    payload = flat(budget=64)
    assert _push(active, payload, authorization=None) == (
        401,
        {"error": "Unauthorized -- send 'Authorization: Bearer <admin key>'"},
    )
    assert _push(active, payload, authorization="Bearer wrong")[0] == 401
    assert _push(active, payload, authorization=KEY)[0] == 401  # no scheme
    status, answer = _push(active, payload, admin_key=None)
    assert status == 403 and "start the server with an admin API key" in answer["error"]
    assert active.state(11.0).source == "yaml"
    assert _push(active, payload, authorization=f"bearer {KEY}") == (200, [True])  # SGLang's answer, any case
    readback = handle_server_info(active, now=11.0)["internal_states"][0]["jetspec_policy"]
    assert readback == policy_readback(active, now=11.0)
    assert (readback["source"], readback["expires_at"], readback["table"]["cohorts"][0]["budget"]) == (
        "pushed",
        100.0,
        64,
    )


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"{not json", "body: not JSON"),
        ({"server_args": "jetspec_policy.ttl_s=9"}, "server_args: missing or not an object"),
        (
            {"server_args": {"jetspec_policy": table()}},  # the nested table SGLang's request type refuses
            "server_args.jetspec_policy is an object -- SGLang's /set_internal_state takes numbers only",
        ),
    ],
)
def test_endpoint_refuses_bodies_sglang_would_not_take(payload, message):
    active = ActivePolicy(POLICY)
    status, answer = _push(active, payload)
    assert status == 400 and any(p.startswith(message) for p in answer["problems"]), answer
    assert (answer["object"], answer["code"]) == ("error", 400)  # SGLang's ErrorResponse shape
    assert active.state(11.0).source == "yaml"


def test_endpoint_applies_a_table_whole_or_not_at_all():
    active = ActivePolicy(POLICY)
    assert _push(active, flat(budget=64)) == (200, [True])
    bad = flat()
    bad["server_args"]["jetspec_policy.bs2-8.budget"] = 16  # not a candidate of bs2-8
    bad["server_args"]["jetspec_policy.bs1.probe_budget"] = 4  # without its probe_share
    status, answer = _push(active, bad)
    assert status == 400 and answer["message"] == "invalid jetspec_policy push, nothing changed"
    assert answer["problems"] == ["cohort bs1: probe_budget and probe_share come together -- send both or neither"]
    del bad["server_args"]["jetspec_policy.bs1.probe_budget"]
    assert _push(active, bad)[1]["problems"] == [
        "cohorts[1].budget 16 is not a candidate of 'bs2-8' -- use one of [0, 4, 8]"
    ]
    unknown = flat(budget=0)
    unknown["server_args"]["pp_max_micro_batch_size"] = 8  # the reference server has no other knobs
    assert "unknown key pp_max_micro_batch_size" in _push(active, unknown)[1]["problems"][0]
    assert active.state(11.0).table.budgets() == {"bs1": 64, "bs2-8": 4}


ROUNDS_POLICY = parse_policy_text("""\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 16, 64], default: 16, draft_rounds: 1}
  - {name: bs2-8, min_batch: 2, max_batch: 8, budgets: [0, 4, 8], default: 4}
head: {max_draft_rounds: 2}
""")


def test_draft_rounds_come_from_the_yaml_until_a_push_changes_them():
    active = ActivePolicy(ROUNDS_POLICY)
    assert active.step_plan(1, now=0.0) == ("bs1", 16, 1, 0, "head", None, "top_k", True)
    assert active.step_plan(3, now=0.0) == ("bs2-8", 4, 0, 0, "head", None, "top_k", True)
    flat_args = table_to_flat_args(default_table(ROUNDS_POLICY))
    flat_args["jetspec_policy.bs2-8.draft_rounds"] = 2
    del flat_args["jetspec_policy.bs1.draft_rounds"]  # missing: the cohort's YAML value
    active.apply(table_from_flat_args(flat_args, ROUNDS_POLICY), now=0.0)
    assert active.step_plan(1, now=1.0) == ("bs1", 16, 1, 0, "head", None, "top_k", True)
    assert active.step_plan(3, now=1.0) == ("bs2-8", 4, 2, 0, "head", None, "top_k", True)
    assert active.step_plan(3, now=90.0) == (
        "bs2-8",
        4,
        0,
        0,
        "head",
        None,
        "top_k",
        True,
    )  # expired: back to the YAML default


def test_draft_rounds_above_the_policy_limit_are_refused_and_nothing_changes():
    active = ActivePolicy(ROUNDS_POLICY)
    flat_args = table_to_flat_args(default_table(ROUNDS_POLICY))
    flat_args["jetspec_policy.bs1.draft_rounds"] = 3
    status, answer = _push(active, {"server_args": flat_args})
    assert status == 400 and answer["problems"] == [
        "cohorts[0].draft_rounds 3 is above the server policy's head.max_draft_rounds 2 -- use 0..2"
    ]
    assert (
        active.step_plan(1, now=11.0) == ("bs1", 16, 1, 0, "head", None, "top_k", True)
        and active.state(11.0).source == "yaml"
    )
    with pytest.raises(
        PolicyError, match=r"cohorts\[0\].draft_rounds 1 is above the server policy's head.max_draft_rounds 0"
    ):
        validate_table(table(draft_rounds=1), POLICY)  # POLICY leaves max_draft_rounds at its default, 0
