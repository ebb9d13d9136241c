"""Push budget tables to one server and read back the table it runs (the control contract).

    POST {server}/set_internal_state  {"server_args": {"jetspec_policy.ttl_s": 90.0,
                                                       "jetspec_policy.<cohort>.budget": 32, ...}}
         Authorization: Bearer <admin key>                         -> [true] (one flag per DP rank)
    GET  {server}/server_info  -> {"internal_states": [{"jetspec_policy": {"table", "source",
                                                                          "expires_at", "generation"}}, ...]}
         Authorization: Bearer <API key>, only when the servers have one

This is SGLang's own protocol (policies/control_api.py has the why), which the reference server
speaks too. Everything SGLang-specific about the control surface lives here, its two keys included
(sglang/srt/utils/auth.py): the admin key (--admin-api-key) unlocks /set_internal_state, where the
ordinary API key (--api-key) is not accepted when both are set; the API key protects every ordinary
route, /server_info included, where the admin key is not accepted. So each request carries its own
key. Without --api-key /server_info is open (the reference server has no API key and checks none);
/metrics and /health are always open. Every table is validated with the policies schema before it
is sent, so an invalid table never leaves the controller. Connection errors and 5xx answers are
retried with exponential backoff; 4xx answers are not, and each names its likely fix.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from controller.http import Transport, urllib_transport
from policies.control_api import (
    INTERNAL_STATES_KEY,
    LAST_REFUSAL_KEY,
    POLICY_KEY,
    SERVER_ARGS_KEY,
    table_to_flat_args,
)
from policies.schema import Policy
from policies.table import PolicyState, PolicyTable, validate_table

# What an operator most likely has to change when a server refuses a control request, per endpoint:
# the two endpoints take different keys (see above), so a 401 means a different key on each.
_PUSH = "/set_internal_state"
_READBACK = "/server_info"
_FIXES: dict[str, dict[int, str]] = {
    _PUSH: {
        400: "the server could not take the request: compare its policy file with the controller's --policy "
        "(same cohorts and candidate budgets), and its jetspec version with the controller's",
        401: "missing or wrong admin key: give the controller the servers' admin API key (--admin-key-env; "
        "SGLang --admin-api-key, not its --api-key)",
        403: "the server refuses policy pushes: start it with an admin API key (SGLang --admin-api-key, "
        "jetspec serve --admin-api-key-env)",
        422: "the server refused the body's types: SGLang's server_args take numbers only; run a controller and "
        "server of the same jetspec version",
    },
    _READBACK: {
        401: "missing or wrong API key for the readback: the server runs with an ordinary API key (SGLang --api-key), "
        "which it requires on GET /server_info instead of the admin key; give it to the controller "
        "(--api-key-env, default $JETSPEC_API_KEY)",
    },
}
_ANY_ENDPOINT = {
    404: "no such endpoint: is this the URL of a JetSpec server (SGLang with the jetspec plugin, or jetspec serve)?",
}


def _fix(path: str, status: int) -> str:
    return _FIXES.get(path, {}).get(status) or _ANY_ENDPOINT.get(status, "see the server's log")


_REFUSED = (
    "the server refused the table without saying why (SGLang logs it: 'rejected jetspec_policy push') "
    "-- is its admin API key set, and does it run the controller's policy file?"
)


class PushRejected(Exception):
    """The server refused the request (4xx, or SGLang's [false]): retrying the same request won't help."""


class ServerUnavailable(Exception):
    """No usable answer after every retry."""


def _detail(payload: Any) -> Any:
    """The server's own words: our problems list, SGLang's ErrorResponse message, its auth error, FastAPI's detail."""
    if not isinstance(payload, dict):
        return payload
    for key in ("problems", "message", "error", "detail"):
        if payload.get(key):
            return payload[key]
    return payload


class ServerClient:
    """`admin_key` goes with pushes (SGLang --admin-api-key), `api_key` with readbacks (SGLang --api-key;
    None for servers without one)."""

    def __init__(
        self,
        url: str,
        policy: Policy,
        admin_key: str | None,
        transport: Transport = urllib_transport,
        sleep: Callable[[float], None] = time.sleep,
        attempts: int = 4,
        backoff_s: float = 0.5,
        timeout_s: float = 5.0,
        api_key: str | None = None,
    ):
        self.url = url.rstrip("/")
        self._policy = policy
        self._admin_key = admin_key
        self._api_key = api_key
        self._transport = transport
        self._sleep = sleep
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._timeout_s = timeout_s

    def _headers(self, key: str | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _request(self, method: str, path: str, body: bytes | None, key: str | None) -> Any:
        url = f"{self.url}{path}"
        headers = self._headers(key)
        failure = ""
        for attempt in range(self._attempts):
            if attempt:
                self._sleep(self._backoff_s * 2 ** (attempt - 1))
            try:
                status, raw = self._transport(method, url, headers, body, self._timeout_s)
            except ConnectionError as exc:
                failure = str(exc)
                continue
            if status >= 500:
                failure = f"{method} {url} answered {status}"
                continue
            try:
                payload = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                payload = {"error": raw[:200].decode(errors="replace")}
            if status >= 400:
                raise PushRejected(f"{method} {url} answered {status}: {_detail(payload)} -- {_fix(path, status)}")
            return payload
        raise ServerUnavailable(f"{failure} (gave up after {self._attempts} attempts)")

    def _read_states(self) -> list[PolicyState]:
        """The state each data-parallel rank of the server runs (GET /server_info)."""
        payload = self._request("GET", _READBACK, None, self._api_key)
        ranks = payload.get(INTERNAL_STATES_KEY) if isinstance(payload, dict) else None
        try:
            if not ranks:
                raise ValueError(f"no {INTERNAL_STATES_KEY}")
            return [PolicyState.model_validate(rank[POLICY_KEY]) for rank in ranks]
        except (KeyError, TypeError, ValueError, ValidationError) as exc:
            raise ServerUnavailable(
                f"{self.url}{_READBACK} has no valid {INTERNAL_STATES_KEY}[i].{POLICY_KEY} "
                f"({type(exc).__name__}: {exc}) -- is it a JetSpec server?"
            ) from None

    def _refusal_reasons(self) -> list[str]:
        """Why SGLang answered a push [false]: the problems of the last push the server refused, as it keeps
        them on /server_info (empty where it keeps none: an older plugin, or our own servers' 400s)."""
        try:
            payload = self._request("GET", _READBACK, None, self._api_key)
            ranks = payload.get(INTERNAL_STATES_KEY) or []
            return [str(p) for rank in ranks for p in ((rank.get(LAST_REFUSAL_KEY) or {}).get("problems") or [])]
        except (PushRejected, ServerUnavailable, AttributeError, TypeError):
            return []

    def read_state(self) -> PolicyState:
        """The state the server runs; ServerUnavailable while its ranks run different tables."""
        states = self._read_states()
        if any(s.table != states[0].table for s in states[1:]):
            raise ServerUnavailable(
                f"the data-parallel ranks of {self.url} run different tables: {[s.table.budgets() for s in states]}"
            )
        return states[0]

    def push(self, table: PolicyTable) -> PolicyState:
        """Send `table`; returns the state the server then runs. Raises PolicyError before sending
        an invalid table, PushRejected on a refusal, ServerUnavailable when retries ran out."""
        validate_table(table, self._policy)
        body = json.dumps({SERVER_ARGS_KEY: table_to_flat_args(table)}).encode()
        answer = self._request("POST", _PUSH, body, self._admin_key)
        if not (isinstance(answer, list) and answer and all(flag is True for flag in answer)):
            reasons = self._refusal_reasons()
            why = f"the server's last refusal: {'; '.join(reasons)}" if reasons else _REFUSED
            raise PushRejected(f"POST {self.url}{_PUSH} answered {answer!r}: {why}")
        state = self.read_state()  # neither SGLang nor our servers echo the new state
        if state.table != table:
            raise PushRejected(f"{self.url} accepted the push but runs a different table: {state.table.budgets()}")
        return state
