"""A real HTTP control endpoint on 127.0.0.1 for controller tests.

It serves the contract the SGLang worker and the reference engine implement: `/set_internal_state`
and `/server_info` (through policies.control_api, as a server would) and a `/metrics` page
whose jetspec counters grow on every scrape. Tests can make the next control requests fail with 503.
Like the reference server it has no API key: /server_info is open. A test that sets `api_key` gets
SGLang's rule with --api-key and --admin-api-key both set instead: /server_info takes that key only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from policies.control_api import handle_server_info, handle_set_internal_state
from policies.loader import parse_policy_text
from policies.runtime import ActivePolicy
from policies.schema import Policy
from tests.loopback import QuietHandler, serving

ADMIN_KEY = "test-admin-key"
API_KEY = "test-api-key"

TEST_POLICY_YAML = """\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 16, 64], default: 16}
  - {name: bs2-8, min_batch: 2, max_batch: 8, budgets: [0, 4, 8], default: 4}
gate: {min_gain: 1.05, hysteresis: 0.03, confidence_z: 2.5, dwell_s: 60, probe_share: 0.05,
       reprobe_budget: 4, reprobe_backoff_max_s: 480}
controller: {interval_s: 10, ttl_s: 90, window_s: 300, min_samples: 3}
"""


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class ControlServer:
    url: str
    admin_key: str
    active: ActivePolicy
    now: list[float]  # [server clock]; tests move it
    fail_next: list[int]  # [how many next control requests answer 503]
    requests: list[Request] = field(default_factory=list)
    api_key: str | None = None  # set: GET /server_info answers 401 without it (SGLang --api-key)

    def readbacks(self) -> list[Request]:
        return [r for r in self.requests if r.path == "/server_info"]

    def posts(self) -> list[Request]:
        return [r for r in self.requests if r.method == "POST"]


@pytest.fixture
def admin_key() -> str:
    return ADMIN_KEY


@pytest.fixture
def api_key() -> str:
    return API_KEY


@pytest.fixture
def test_policy_yaml() -> str:
    return TEST_POLICY_YAML


@pytest.fixture
def test_policy() -> Policy:
    return parse_policy_text(TEST_POLICY_YAML, "test-policy.yaml")


@pytest.fixture
def test_policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(TEST_POLICY_YAML)
    return path


def _metrics_page(scrapes: int) -> str:
    # Cumulative counters that grow by a fixed amount per scrape: 16 beats off by 1.5x.
    lines = []
    for name, per_scrape in (
        ("steps", {0: 10, 16: 10}),
        ("committed_tokens", {0: 10, 16: 30}),
        ("request_seconds", {0: 1.0, 16: 2.0}),
    ):
        lines.append(f"# TYPE jetspec_{name}_total counter")
        for budget, amount in per_scrape.items():
            lines.append(f'jetspec_{name}_total{{cohort="bs1",budget="{budget}"}} {amount * scrapes}')
    return "\n".join(lines) + "\n"


@pytest.fixture
def control_server(test_policy: Policy):
    active = ActivePolicy(test_policy)
    state = ControlServer(url="", admin_key=ADMIN_KEY, active=active, now=[1000.0], fail_next=[0])
    scrapes = [0]

    class Handler(QuietHandler):
        def _handle(self, method: str) -> None:
            body = self.body()
            state.requests.append(Request(method, self.path, dict(self.headers), body))
            if self.path != "/metrics" and state.fail_next[0] > 0:
                state.fail_next[0] -= 1
                return self.answer(503, b'{"error": "overloaded"}')
            if method == "GET" and self.path == "/metrics":
                scrapes[0] += 1
                return self.answer(200, _metrics_page(scrapes[0]).encode(), "text/plain")
            if method == "GET" and self.path == "/server_info":
                if state.api_key is not None and self.headers.get("Authorization") != f"Bearer {state.api_key}":
                    return self.answer(401, b'{"error": "Unauthorized"}')  # SGLang's answer
                return self.answer(200, json.dumps(handle_server_info(active, state.now[0])).encode())
            if method == "POST" and self.path == "/set_internal_state":
                status, payload = handle_set_internal_state(
                    active, body, self.headers.get("Authorization"), ADMIN_KEY, state.now[0]
                )
                return self.answer(status, json.dumps(payload).encode())
            return self.answer(404, b"{}")

        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            self._handle("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._handle("POST")

    with serving(Handler) as url:
        state.url = url
        yield state
