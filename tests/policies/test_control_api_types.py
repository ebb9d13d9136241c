"""A pushed table is checked for JSON types before values (policies/control_api.table_from_flat_args):
no payload raises anything but PolicyError, one refusal names every problem, and only well-typed,
in-range tables are applied. Hostile payloads from a probe of the real server, then generated ones."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.control_api import (
    FLAT_FIELDS,
    handle_set_internal_state,
    max_flat_keys,
    table_from_flat_args,
    table_to_flat_args,
)
from policies.head import HeadCapacity
from policies.problems import PolicyError
from policies.runtime import ActivePolicy
from policies.schema import MAX_TREE_WIDTH, MAX_TTL_S
from policies.table import default_table
from tests.policies.push_strategies import broken_tables, valid_tables
from tests.policies.test_policy_table import POLICY  # two cohorts: bs1 budgets 0-64, bs2-8 budgets 0-8

HEAD = HeadCapacity("test-head", block_size=4, tree_width=8)
KEY = "secret"


def valid_flat() -> dict:
    return table_to_flat_args(default_table(POLICY))


def problems_of(flat: dict, head: HeadCapacity | None = HEAD) -> list[str]:
    try:
        table_from_flat_args(flat, POLICY, head)
    except PolicyError as exc:
        return [str(p) for p in exc.problems]
    return []


@pytest.mark.parametrize(
    "key, value, expected",
    [
        (
            "jetspec_policy.bs1.drafter",
            1.0,
            "jetspec_policy.bs1.drafter is a number with a fraction (1.0) -- send an integer",
        ),
        (
            "jetspec_policy.bs1.tree_sizing",
            1.0,
            "jetspec_policy.bs1.tree_sizing is a number with a fraction (1.0) -- send an integer",
        ),
        ("jetspec_policy.bs1.drafter", True, "jetspec_policy.bs1.drafter is a boolean (true) -- send an integer"),
        ("jetspec_policy.bs1.budget", "4", "jetspec_policy.bs1.budget is a string ('4') -- send an integer"),
        (
            "jetspec_policy.bs1.budget",
            4.0,
            "jetspec_policy.bs1.budget is a number with a fraction (4.0) -- send an integer",
        ),
        ("jetspec_policy.bs1.budget", None, "jetspec_policy.bs1.budget is null (null) -- send an integer"),
        (
            "jetspec_policy.bs1.drafter",
            2,
            "jetspec_policy.bs1.drafter 2 is not a drafter code -- send one of {0: 'head', 1: 'hybrid'}",
        ),
        (
            "jetspec_policy.bs1.sampled_children",
            -1,
            "jetspec_policy.bs1.sampled_children -1 is not a sampled_children code",
        ),
        (
            "jetspec_policy.ttl_s",
            float("inf"),
            "jetspec_policy.ttl_s is a number with a fraction (Infinity) -- send a finite number",
        ),
        (
            "jetspec_policy.ttl_s",
            float("nan"),
            "jetspec_policy.ttl_s is a number with a fraction (NaN) -- send a finite number",
        ),
        ("jetspec_policy.ttl_s", "90", "jetspec_policy.ttl_s is a string ('90') -- send a finite number"),
        ("jetspec_policy.ttl_s", 1e308, f"ttl_s = 1e+308 is out of range -- use a value <= {MAX_TTL_S}"),
        (
            "jetspec_policy.bs1.tree_width",
            1_000_000,
            f"cohorts[0].tree_width = 1000000 is out of range -- use a value <= {MAX_TREE_WIDTH}",
        ),
        ("jetspec_policy.bs1.tree_width", 9, "cohorts[0].tree_width 9 is wider than head test-head's tree_width 8"),
        ("jetspec_policy.bs1.budget", 2**40, "cohorts[0].budget 1099511627776 is not a candidate of 'bs1'"),
        (
            "jetspec_policy.bs1.budget",
            [4],
            "server_args.jetspec_policy.bs1.budget is an array -- SGLang's /set_internal_state takes numbers only",
        ),
    ],
)
def test_hostile_values_are_refused_with_their_json_type_or_bound(key, value, expected):
    flat = {**valid_flat(), key: value}
    found = problems_of(flat)
    assert len(found) == 1 and expected.lower() in found[0].lower(), found


def test_one_refusal_names_every_problem():
    flat = {
        **valid_flat(),
        "jetspec_policy.bs1.drafter": 1.0,
        "jetspec_policy.bs2-8.budget": "4",
        "jetspec_policy.ttl_s": True,
        "jetspec_policy.bs9.budget": 4,
    }
    found = problems_of(flat)
    assert len(found) == 4 and [p.split(" ")[0] for p in found] == [
        "jetspec_policy.ttl_s",
        "jetspec_policy.bs1.drafter",
        "jetspec_policy.bs2-8.budget",
        "unknown",
    ], found


def test_a_push_of_ten_thousand_keys_is_one_problem():
    flat = {**valid_flat(), **{f"jetspec_policy.x{i}.budget": 4 for i in range(10_000)}}
    (problem,) = problems_of(flat)
    assert problem.startswith(
        f"{len(flat)} jetspec_policy.* keys, more than a table of cohorts ['bs1', 'bs2-8'] has "
        f"({max_flat_keys(POLICY)})"
    )


def test_without_a_head_the_absolute_width_bound_holds():
    assert problems_of({**valid_flat(), "jetspec_policy.bs1.tree_width": 9}, head=None) == []
    assert problems_of({**valid_flat(), "jetspec_policy.bs1.tree_width": MAX_TREE_WIDTH + 1}, head=None)


# ---- generated payloads ----

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
KEYS = st.one_of(
    st.sampled_from(
        ["jetspec_policy.ttl_s"] + [f"jetspec_policy.{c}.{f}" for c in ("bs1", "bs2-8") for f in FLAT_FIELDS]
    ),
    st.text(max_size=30),
)


@settings(max_examples=300, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, JSON_VALUES, max_size=24))
def test_no_payload_raises_anything_but_a_policy_error(flat):
    try:
        table = table_from_flat_args(flat, POLICY, HEAD)
    except PolicyError as exc:
        assert exc.problems and all(str(p) for p in exc.problems)
    else:  # accepted: every value had its type
        assert all(type(v) is int or (type(v) is float and math.isfinite(v)) for v in flat.values())
        assert table.ttl_s == flat["jetspec_policy.ttl_s"]


@settings(max_examples=150, derandomize=True)
@given(valid_tables(POLICY, HEAD))
def test_a_valid_table_is_applied_and_read_back_as_pushed(flat):
    active = ActivePolicy(POLICY, HEAD)
    status, answer = handle_set_internal_state(
        active, json.dumps({"server_args": flat}).encode(), f"Bearer {KEY}", KEY, now=0.0
    )
    assert (status, answer) == (200, [True])
    assert table_to_flat_args(active.table(0.0)) == {**table_to_flat_args(table_from_flat_args(flat, POLICY, HEAD))}
    assert {k: v for k, v in table_to_flat_args(active.table(0.0)).items() if k in flat} == {
        k: (float(v) if k.endswith(("ttl_s", "probe_share")) else v) for k, v in flat.items()
    }


@settings(max_examples=150, derandomize=True)
@given(broken_tables(POLICY, HEAD))
def test_a_broken_table_changes_nothing(flat):
    active = ActivePolicy(POLICY, HEAD)
    before = active.state(0.0)
    status, answer = handle_set_internal_state(
        active, json.dumps({"server_args": flat}).encode(), f"Bearer {KEY}", KEY, now=0.0
    )
    assert status == 400 and answer["problems"], answer
    assert active.state(0.0) == before
