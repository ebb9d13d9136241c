"""Server side of the control endpoint, in SGLang's protocol, independent of any web framework.

    POST /set_internal_state   {"server_args": {"jetspec_policy.ttl_s": 90.0,
                                                "jetspec_policy.bs1.budget": 32,
                                                "jetspec_policy.bs1.draft_rounds": 1,
                                                "jetspec_policy.bs1.tree_width": 4,
                                                "jetspec_policy.bs1.drafter": 1,
                                                "jetspec_policy.bs1.tree_sizing": 1,
                                                "jetspec_policy.bs1.sampled_children": 1,
                                                "jetspec_policy.bs1.probe_budget": 64,
                                                "jetspec_policy.bs1.probe_share": 0.05, ...}}
                               Authorization: Bearer <admin key>           -> 200 [true]
    GET  /server_info          -> {"internal_states": [{"jetspec_policy": STATE}, ...], ...}

SGLang's own /set_internal_state admits only numbers ({"server_args": {key: int|float}}: its
request type rejects a nested TABLE before any plugin code runs), so the table travels as flat
numeric keys, all in one request: jetspec_policy.ttl_s, jetspec_policy.<cohort>.budget,
optionally jetspec_policy.<cohort>.draft_rounds, .tree_width, .drafter (an index into
policies.schema.DRAFTERS: 0 head, 1 hybrid), .tree_sizing (an index into TREE_SIZINGS: 0 fixed,
1 adaptive) and .sampled_children (an index into SAMPLED_CHILDREN: 0 top_k, 1 drawn) -- missing = the
cohort's YAML value --, and
jetspec_policy.<cohort>.probe_budget + jetspec_policy.<cohort>.probe_share (both or neither).
Cohort ranges are not sent: they are the server policy's own, in its order. SGLang has no
/get_internal_state route; its /server_info lists each data-parallel rank's internal state.

The JetSpec SGLang plugin answers both through SGLang (sglang_jetspec/adapter/internal_state.py);
the reference server and the controller's simulator pass the raw body and header to
`handle_set_internal_state` and send back the (status, JSON) it returns. Both validate with
`table_from_flat_args` and read back with `policy_readback`. One deliberate difference: SGLang
answers a refused table with 200 [false] and logs the problems; these servers answer 400 and list
them, since nothing stops them from telling the client.
"""

from __future__ import annotations

import hmac
import json
import math
from typing import Any

from policies.head import HeadCapacity
from policies.problems import PolicyError, Problem
from policies.runtime import ActivePolicy
from policies.schema import DRAFTERS, SAMPLED_CHILDREN, TREE_SIZINGS, Policy
from policies.table import PolicyTable, validate_table

SERVER_ARGS_KEY = "server_args"
INTERNAL_STATES_KEY = "internal_states"
POLICY_KEY = "jetspec_policy"
# beside POLICY_KEY: the same-allocation control's state per cohort (policies/same_allocation.py), when it runs
SAME_ALLOCATION_KEY = "jetspec_same_allocation"
# beside POLICY_KEY in a JetSpec SGLang server's internal state: the last refused push ({"at", "problems"})
LAST_REFUSAL_KEY = "jetspec_last_refused_push"
FLAT_PREFIX = POLICY_KEY + "."
# a cohort's fields in the flat form: jetspec_policy.<cohort>.<field>
FLAT_FIELDS = (
    "budget",
    "draft_rounds",
    "tree_width",
    "drafter",
    "tree_sizing",
    "sampled_children",
    "probe_budget",
    "probe_share",
)
# fields pushed as an index into their names (SGLang admits numbers only)
_CODED_FIELDS = {"drafter": DRAFTERS, "tree_sizing": TREE_SIZINGS, "sampled_children": SAMPLED_CHILDREN}
# fields that are real numbers; every other field is an integer
_REAL_FIELDS = ("ttl_s", "probe_share")


def _bad_request(message: str, problems: list[str] | None = None) -> tuple[int, dict[str, Any]]:
    """SGLang's answer to a body it cannot take (its ErrorResponse), plus every problem found."""
    return 400, {
        "object": "error",
        "message": message,
        "type": "Bad Request",
        "param": None,
        "code": 400,
        "problems": problems or [message],
    }


def _authorized(authorization: str | None, admin_key: str) -> bool:
    # As SGLang's admin check: scheme "Bearer" in any case, constant-time comparison of the key.
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), admin_key.encode())


def _server_args(body: bytes) -> dict[str, Any]:
    """The `server_args` object of a request body (its values are checked by table_from_flat_args);
    ValueError naming the field and the fix."""
    shape = f'send {{"{SERVER_ARGS_KEY}": {{"{FLAT_PREFIX}ttl_s": 90.0, "{FLAT_PREFIX}<cohort>.budget": 32, ...}}}}'
    try:
        payload = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"body: not JSON ({type(exc).__name__}) -- {shape}") from None
    server_args = payload.get(SERVER_ARGS_KEY) if isinstance(payload, dict) else None
    if not isinstance(server_args, dict):
        raise ValueError(f"{SERVER_ARGS_KEY}: missing or not an object -- {shape}")
    return server_args


def handle_set_internal_state(
    active: ActivePolicy, body: bytes, authorization: str | None, admin_key: str | None, now: float
) -> tuple[int, Any]:
    """Apply a flat pushed table whole, or change nothing: (status, JSON answer)."""
    if not admin_key:
        return 403, {"error": "Forbidden -- policy pushes are disabled: start the server with an admin API key"}
    if not _authorized(authorization, admin_key):
        return 401, {"error": "Unauthorized -- send 'Authorization: Bearer <admin key>'"}
    try:
        server_args = _server_args(body)
    except ValueError as exc:
        return _bad_request(str(exc))
    try:
        table = table_from_flat_args(server_args, active.policy, active.head)
    except PolicyError as exc:
        return _bad_request(f"invalid {POLICY_KEY} push, nothing changed", [str(p) for p in exc.problems])
    active.apply(table, now)
    return 200, [True]  # SGLang's answer: one flag per data-parallel rank


def policy_readback(active: ActivePolicy, now: float) -> dict[str, Any]:
    """The state in force, as every server reads it back under `jetspec_policy`."""
    return active.state(now).model_dump(mode="json")


def handle_server_info(active: ActivePolicy, now: float, same_allocation: dict | None = None) -> dict[str, Any]:
    """The part of SGLang's GET /server_info a controller reads: one internal state (one rank), with the
    same-allocation control's state when it runs."""
    state: dict[str, Any] = {POLICY_KEY: policy_readback(active, now)}
    if same_allocation is not None:
        state[SAME_ALLOCATION_KEY] = same_allocation
    return {INTERNAL_STATES_KEY: [state]}


def table_to_flat_args(table: PolicyTable) -> dict[str, int | float]:
    flat: dict[str, int | float] = {f"{FLAT_PREFIX}ttl_s": table.ttl_s}
    for cohort in table.cohorts:
        flat[f"{FLAT_PREFIX}{cohort.name}.budget"] = cohort.budget
        flat[f"{FLAT_PREFIX}{cohort.name}.draft_rounds"] = cohort.draft_rounds
        flat[f"{FLAT_PREFIX}{cohort.name}.tree_width"] = cohort.tree_width
        flat[f"{FLAT_PREFIX}{cohort.name}.drafter"] = DRAFTERS.index(cohort.drafter)
        if cohort.tree_sizing is not None:
            flat[f"{FLAT_PREFIX}{cohort.name}.tree_sizing"] = TREE_SIZINGS.index(cohort.tree_sizing)
        flat[f"{FLAT_PREFIX}{cohort.name}.sampled_children"] = SAMPLED_CHILDREN.index(cohort.sampled_children)
        if cohort.probe is not None:
            flat[f"{FLAT_PREFIX}{cohort.name}.probe_budget"] = cohort.probe.budget
            flat[f"{FLAT_PREFIX}{cohort.name}.probe_share"] = cohort.probe.share
    return flat


def _json_type(value: Any) -> str:
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number with a fraction",
        str: "a string",
        type(None): "null",
        list: "an array",
        dict: "an object",
    }
    return names.get(type(value), type(value).__name__)


def _type_problem(key: str, field: str, value: Any) -> Problem | None:
    """The JSON type a flat key needs, checked before any value is looked at: integers are integers (not
    4.0, true or "4"), codes are integers of their enumeration, ttl_s and probe_share finite numbers."""
    if field in _REAL_FIELDS:
        if type(value) not in (int, float) or not math.isfinite(value):
            return Problem((key,), f"{key} is {_json_type(value)} ({_shown(value)})", "send a finite number")
        return None
    if type(value) is not int:
        return Problem((key,), f"{key} is {_json_type(value)} ({_shown(value)})", "send an integer")
    names_of = _CODED_FIELDS.get(field)
    if names_of is not None and value not in range(len(names_of)):
        return Problem((key,), f"{key} {value} is not a {field} code", f"send one of {dict(enumerate(names_of))}")
    return None


def flat_type_problems(flat: dict[str, Any]) -> list[Problem]:
    """The type problems of a push's `jetspec_policy.*` keys alone (the keys' names and values are checked
    by `table_from_flat_args`): what must be refused before SGLang's own request type, which converts
    "16" and true to numbers, sees the body."""
    problems = []
    for key, value in flat.items():
        if not key.startswith(FLAT_PREFIX):
            continue
        field = key.removeprefix(FLAT_PREFIX).rpartition(".")[2]
        if field not in (*FLAT_FIELDS, "ttl_s"):
            continue
        problem = _type_problem(key, field, value)
        if problem is not None:
            problems.append(problem)
    return problems


def _clipped(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _shown(value: Any) -> str:
    """A pushed value as the log line shows it: JSON, strings quoted, long ones clipped."""
    return _clipped(repr(value) if isinstance(value, str) else json.dumps(value, allow_nan=True, default=str), 40)


def max_flat_keys(policy: Policy) -> int:
    """The most keys a push of this policy's table can have: ttl_s and every field of every cohort."""
    return 1 + len(policy.cohorts) * len(FLAT_FIELDS)


def table_from_flat_args(flat: dict[str, Any], policy: Policy, head: HeadCapacity | None = None) -> PolicyTable:
    """Rebuild and validate a pushed table from flat keys; PolicyError names every bad key. Types first
    (a value of the wrong JSON type is never compared or used as an index), then the values against the
    server's policy and `head` (its draft head: the table's tree widths stay within the head's)."""
    names = [c.name for c in policy.cohorts]
    limit = max_flat_keys(policy)
    if len(flat) > limit:  # one problem, not one per key: a push of 10,000 keys is one mistake
        raise PolicyError(
            [
                Problem(
                    (SERVER_ARGS_KEY,),
                    f"{len(flat)} {FLAT_PREFIX}* keys, more than a table of cohorts {names} has ({limit})",
                    f"send {FLAT_PREFIX}ttl_s and {FLAT_PREFIX}<cohort>.{{{','.join(FLAT_FIELDS)}}} only",
                )
            ]
        )
    values: dict[str, dict[str, Any]] = {name: {} for name in names}
    ttl_s = None
    problems: list[Problem] = []
    for key, value in flat.items():
        cohort, _, field = key.removeprefix(FLAT_PREFIX).rpartition(".")
        if key == f"{FLAT_PREFIX}ttl_s":
            cohort, field = None, "ttl_s"
        known = cohort is None or (key.startswith(FLAT_PREFIX) and cohort in values and field in FLAT_FIELDS)
        if isinstance(value, (dict, list)):  # a nested table: SGLang's own request type refuses it
            problem = Problem(
                (key,),
                f"{SERVER_ARGS_KEY}.{_clipped(key)} is {_json_type(value)}",
                "SGLang's /set_internal_state takes numbers only: send the table as flat keys "
                "(policies.control_api.table_to_flat_args)",
            )
        elif not known:
            problem = Problem(
                (key,),
                f"unknown key {_clipped(key)}",
                f"send {FLAT_PREFIX}ttl_s and {FLAT_PREFIX}<cohort>.{{{','.join(FLAT_FIELDS)}}} for cohorts {names}",
            )
        else:
            problem = _type_problem(key, field, value)
        if problem is not None:
            problems.append(problem)
        elif field == "ttl_s":
            ttl_s = value
        else:
            values[cohort][field] = value
    if ttl_s is None and not any(p.loc == (f"{FLAT_PREFIX}ttl_s",) for p in problems):
        problems.append(Problem((f"{FLAT_PREFIX}ttl_s",), f"{FLAT_PREFIX}ttl_s is missing", "send the table's ttl_s"))
    for name, got in values.items():
        if "budget" not in got and not any(p.loc == (f"{FLAT_PREFIX}{name}.budget",) for p in problems):
            problems.append(
                Problem(
                    (f"{FLAT_PREFIX}{name}.budget",),
                    f"{FLAT_PREFIX}{name}.budget is missing",
                    "send a budget for every cohort of the server's policy",
                )
            )
        if ("probe_budget" in got) != ("probe_share" in got):
            problems.append(
                Problem(
                    (f"{FLAT_PREFIX}{name}.probe_budget",),
                    f"cohort {name}: probe_budget and probe_share come together",
                    "send both or neither",
                )
            )
    if problems:
        raise PolicyError(problems)
    cohorts = []
    for own in policy.cohorts:
        got = values[own.name]
        probe = {"budget": got["probe_budget"], "share": float(got["probe_share"])} if "probe_budget" in got else None
        cohorts.append(
            {
                "name": own.name,
                "min_batch": own.min_batch,
                "max_batch": own.max_batch,
                "budget": got["budget"],
                "draft_rounds": got.get("draft_rounds", own.draft_rounds),
                "tree_width": got.get("tree_width", own.tree_width),
                "drafter": DRAFTERS[got["drafter"]] if "drafter" in got else own.drafter,
                "tree_sizing": TREE_SIZINGS[got["tree_sizing"]] if "tree_sizing" in got else own.tree_sizing,
                "sampled_children": (
                    SAMPLED_CHILDREN[got["sampled_children"]] if "sampled_children" in got else own.sampled_children
                ),
                "probe": probe,
            }
        )
    return validate_table({"cohorts": cohorts, "ttl_s": float(ttl_s)}, policy, head)
