"""Push budget tables to one server and read back the table it runs (the control contract).

    POST {server}/set_internal_state  {"server_args": {"jetspec_policy": TABLE}}
         Authorization: Bearer <admin key>
    GET  {server}/get_internal_state  -> {..., "jetspec_policy": {"table", "source", "expires_at",
                                                                   "generation"}}

Everything SGLang-specific about the control surface lives here. Every table is validated with
the policies schema before it is sent, so an invalid table never leaves the controller.
Connection errors and 5xx answers are retried with exponential backoff; 4xx answers are not.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from controller.http import Transport, urllib_transport
from policies.control_api import POLICY_KEY, SERVER_ARGS_KEY
from policies.schema import Policy
from policies.table import PolicyState, PolicyTable, validate_table


class PushRejected(Exception):
    """The server refused the request (4xx or success=false): retrying the same request won't help."""


class ServerUnavailable(Exception):
    """No usable answer after every retry."""


class ServerClient:
    def __init__(self, url: str, policy: Policy, admin_key: str | None, transport: Transport = urllib_transport,
                 sleep: Callable[[float], None] = time.sleep, attempts: int = 4, backoff_s: float = 0.5,
                 timeout_s: float = 5.0):
        self.url = url.rstrip("/")
        self._policy = policy
        self._admin_key = admin_key
        self._transport = transport
        self._sleep = sleep
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._timeout_s = timeout_s

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self._admin_key:
            headers["Authorization"] = f"Bearer {self._admin_key}"
        return headers

    def _request(self, method: str, path: str, body: bytes | None) -> dict[str, Any]:
        url = f"{self.url}{path}"
        failure = ""
        for attempt in range(self._attempts):
            if attempt:
                self._sleep(self._backoff_s * 2 ** (attempt - 1))
            try:
                status, raw = self._transport(method, url, self._headers(), body, self._timeout_s)
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
            if status >= 400 or (isinstance(payload, dict) and payload.get("success") is False):
                detail = payload.get("problems") or payload.get("error") if isinstance(payload, dict) else payload
                raise PushRejected(f"{method} {url} answered {status}: {detail}")
            return payload if isinstance(payload, dict) else {}
        raise ServerUnavailable(f"{failure} (gave up after {self._attempts} attempts)")

    def _state_from(self, payload: dict[str, Any]) -> PolicyState:
        try:
            return PolicyState.model_validate(payload[POLICY_KEY])
        except (KeyError, ValidationError) as exc:
            raise ServerUnavailable(f"{self.url} returned no valid {POLICY_KEY} state: {exc}") from None

    def read_state(self) -> PolicyState:
        return self._state_from(self._request("GET", "/get_internal_state", None))

    def push(self, table: PolicyTable) -> PolicyState:
        """Send `table`; returns the state the server then runs. Raises PolicyError before sending
        an invalid table, PushRejected on a refusal, ServerUnavailable when retries ran out."""
        validate_table(table, self._policy)
        body = json.dumps({SERVER_ARGS_KEY: {POLICY_KEY: table.model_dump(mode="json")}}).encode()
        payload = self._request("POST", "/set_internal_state", body)
        # Our servers echo the new state; SGLang's generic answer does not, so read it back.
        state = self._state_from(payload) if POLICY_KEY in payload else self.read_state()
        if state.table != table:
            raise PushRejected(f"{self.url} accepted the push but runs a different table")
        return state
