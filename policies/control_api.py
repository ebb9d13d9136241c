"""Server side of the control endpoint, independent of any web framework.

`POST /set_internal_state` with `{"server_args": {"jetspec_policy": TABLE}}` and
`Authorization: Bearer <admin key>`; `GET /get_internal_state` returns `{"jetspec_policy": STATE}`.
A server (reference engine, SGLang hook, simulator) passes the raw body and header in and sends
back the (status, JSON) it gets.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from policies.problems import PolicyError, Problem
from policies.runtime import ActivePolicy
from policies.schema import Policy
from policies.table import PolicyTable, validate_table

SERVER_ARGS_KEY = "server_args"
POLICY_KEY = "jetspec_policy"


def _error(status: int, message: str, problems: list[str] | None = None) -> tuple[int, dict[str, Any]]:
    return status, {"success": False, "error": message, "problems": problems or [message]}


def handle_set_internal_state(active: ActivePolicy, body: bytes, authorization: str | None,
                              admin_key: str | None, now: float) -> tuple[int, dict[str, Any]]:
    if not admin_key:
        return _error(403, "policy pushes are disabled -- start the server with an admin API key")
    if not hmac.compare_digest((authorization or "").encode(), f"Bearer {admin_key}".encode()):
        return _error(401, "missing or wrong admin key -- send 'Authorization: Bearer <admin key>'")
    try:
        payload = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _error(400, f"body is not JSON ({exc}) -- send a JSON object")
    server_args = payload.get(SERVER_ARGS_KEY) if isinstance(payload, dict) else None
    if not isinstance(server_args, dict) or POLICY_KEY not in server_args:
        return _error(400, f"{SERVER_ARGS_KEY}.{POLICY_KEY} is missing -- send "
                           f'{{"{SERVER_ARGS_KEY}": {{"{POLICY_KEY}": TABLE}}}}')
    try:
        state = active.apply(server_args[POLICY_KEY], now)
    except PolicyError as exc:
        problems = [f"{POLICY_KEY}: {p}" for p in exc.problems]
        return _error(400, "invalid jetspec_policy table", problems)
    return 200, {"success": True, POLICY_KEY: state.model_dump(mode="json")}


def handle_get_internal_state(active: ActivePolicy, now: float) -> dict[str, Any]:
    return {POLICY_KEY: active.state(now).model_dump(mode="json")}


# SGLang's own /set_internal_state admits only numbers ({"server_args": {key: int|float}}: its
# request type rejects a nested TABLE with 422 before any plugin code runs), so a push to an SGLang
# server carries the table as flat numeric keys, all in one request:
#   jetspec_policy.ttl_s, jetspec_policy.<cohort>.budget,
#   jetspec_policy.<cohort>.probe_budget + jetspec_policy.<cohort>.probe_share (both or neither).
# Cohort ranges are not sent: they are the server policy's own, in its order.
FLAT_PREFIX = POLICY_KEY + "."
_FLAT_FIELDS = ("budget", "probe_budget", "probe_share")


def table_to_flat_args(table: PolicyTable) -> dict[str, int | float]:
    flat: dict[str, int | float] = {f"{FLAT_PREFIX}ttl_s": table.ttl_s}
    for cohort in table.cohorts:
        flat[f"{FLAT_PREFIX}{cohort.name}.budget"] = cohort.budget
        if cohort.probe is not None:
            flat[f"{FLAT_PREFIX}{cohort.name}.probe_budget"] = cohort.probe.budget
            flat[f"{FLAT_PREFIX}{cohort.name}.probe_share"] = cohort.probe.share
    return flat


def table_from_flat_args(flat: dict[str, Any], policy: Policy) -> PolicyTable:
    """Rebuild and validate a pushed table from flat keys; PolicyError names every bad key."""
    names = [c.name for c in policy.cohorts]
    values: dict[str, dict[str, Any]] = {name: {} for name in names}
    ttl_s = None
    problems: list[Problem] = []
    for key, value in flat.items():
        rest = key.removeprefix(FLAT_PREFIX)
        cohort, _, field = rest.rpartition(".")
        if rest == "ttl_s":
            ttl_s = value
        elif cohort in values and field in _FLAT_FIELDS:
            values[cohort][field] = value
        else:
            problems.append(Problem((key,), f"unknown key {key}",
                                    f"send {FLAT_PREFIX}ttl_s and {FLAT_PREFIX}<cohort>.{{{','.join(_FLAT_FIELDS)}}} "
                                    f"for cohorts {names}"))
    if ttl_s is None:
        problems.append(Problem((f"{FLAT_PREFIX}ttl_s",), f"{FLAT_PREFIX}ttl_s is missing", "send the table's ttl_s"))
    for name, got in values.items():
        if "budget" not in got:
            problems.append(Problem((f"{FLAT_PREFIX}{name}.budget",), f"{FLAT_PREFIX}{name}.budget is missing",
                                    "send a budget for every cohort of the server's policy"))
        if ("probe_budget" in got) != ("probe_share" in got):
            problems.append(Problem((f"{FLAT_PREFIX}{name}.probe_budget",),
                                    f"cohort {name}: probe_budget and probe_share come together",
                                    "send both or neither"))
    if problems:
        raise PolicyError(problems)
    cohorts = []
    for own in policy.cohorts:
        got = values[own.name]
        probe = {"budget": got["probe_budget"], "share": got["probe_share"]} if "probe_budget" in got else None
        cohorts.append({"name": own.name, "min_batch": own.min_batch, "max_batch": own.max_batch,
                        "budget": got["budget"], "probe": probe})
    return validate_table({"cohorts": cohorts, "ttl_s": ttl_s}, policy)
