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

from policies.problems import PolicyError
from policies.runtime import ActivePolicy

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
