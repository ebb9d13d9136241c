"""The controller's ServerClient drives SGLang 0.5.23's own HTTP layer: its routes, request types,
validation answers and API-key middleware, its TokenizerManager methods, and the scheduler's
SchedulerInternalStateController with the plugin's hooks. Only the ZMQ hop between tokenizer
manager and scheduler is a direct call (a real server needs a GPU build of SGLang)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from controller.server_client import PushRejected, ServerClient
from policies import parse_policy_text, validate_table
from policies.table import default_table
from sglang_jetspec.adapter.policy import PolicyControl
from sglang_jetspec.adapter.push_types import StrictPolicyPushes
from tests.builders import internal_state_worker

ADMIN_KEY = "sglang-admin-key"
API_KEY = "sglang-api-key"  # SGLang --api-key: with --admin-api-key too, ordinary routes take only this one
SERVER_POLICY = parse_policy_text(
    """\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 16, 64], default: 16}
  - {name: bs2-8, min_batch: 2, max_batch: 8, budgets: [0, 4, 8], default: 4}
""",
    "server.yaml",
)
# The controller's file lists budget 8 for bs1 as well: a table with it passes the controller's
# check and is refused by the server, as when the two run different policy files.
CONTROLLER_POLICY = parse_policy_text(
    """\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 8, 16, 64], default: 16}
  - {name: bs2-8, min_batch: 2, max_batch: 8, budgets: [0, 4, 8], default: 4}
""",
    "controller.yaml",
)


def table(bs1: int, bs2: int = 4, probe=None):
    return validate_table(
        {
            "cohorts": [
                {"name": "bs1", "min_batch": 1, "max_batch": 1, "budget": bs1, "probe": probe},
                {"name": "bs2-8", "min_batch": 2, "max_batch": 8, "budget": bs2},
            ],
            "ttl_s": 90.0,
        },
        CONTROLLER_POLICY,
    )


def sglang_server(monkeypatch, admin_key: str | None, api_key: str | None = None, metrics_dir=None):
    """SGLang's app (the two control routes, its error handlers, its auth middleware) over a
    scheduler-side controller whose draft worker carries a PolicyControl, as the JETSPEC worker does.
    With `metrics_dir`, also SGLang's /metrics mount (--enable-metrics) over an empty multiprocess dir.
    The transport records (method, path, Authorization header) of every request in `.seen`."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from sglang.srt.entrypoints import http_server
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController
    from sglang.srt.managers.tokenizer_control_mixin import TokenizerControlMixin
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.utils.auth import add_api_key_middleware

    from sglang_jetspec.adapter import internal_state

    HookRegistry.apply_hooks()
    control = PolicyControl(SERVER_POLICY, admin_key_configured=admin_key is not None)
    scheduler = SchedulerInternalStateController(
        SimpleNamespace(draft_worker=internal_state_worker(control)),
        record_step_time=False,
    )

    async def set_communicator(req):
        return [scheduler.set_internal_state(req)]

    async def get_communicator(req):
        # SGLang's own part of the state needs a running scheduler: the plugin's AFTER hook adds to one key.
        return [
            internal_state.after_get_internal_state(
                GetInternalStateReqOutput(internal_state={"pp_max_micro_batch_size": 1}), scheduler, req
            )
        ]

    class DirectTokenizerManager(TokenizerControlMixin):
        server_args = SimpleNamespace()
        startup_time = 0.0
        set_internal_state_communicator = staticmethod(set_communicator)
        get_internal_state_communicator = staticmethod(get_communicator)

        def auto_create_handle_loop(self):
            pass

    monkeypatch.setattr(http_server, "_global_state", http_server._GlobalState(DirectTokenizerManager(), None, {}))
    monkeypatch.setattr(http_server, "build_server_info", lambda server_args, scheduler_info: {})
    app = FastAPI()
    app.router.routes.extend(
        r for r in http_server.app.router.routes if getattr(r, "path", None) in {"/set_internal_state", "/server_info"}
    )
    app.exception_handlers.update(http_server.app.exception_handlers)
    if metrics_dir is not None:
        from sglang.srt.utils.common import add_prometheus_middleware

        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
        add_prometheus_middleware(app)
    app.add_middleware(StrictPolicyPushes)  # as the plugin's hook adds it, before SGLang's key check
    add_api_key_middleware(app, api_key=api_key, admin_api_key=admin_key)
    client = TestClient(app)

    def transport(method, url, headers, body, timeout_s):
        path = url.removeprefix("http://sglang")
        transport.seen.append((method, path, headers.get("Authorization")))
        answer = client.request(method, path, headers=headers, content=body)
        return answer.status_code, answer.content

    transport.seen = []
    return control, transport


def test_the_controller_pushes_and_reads_back_through_sglang(jetspec_registered, monkeypatch):
    control, transport = sglang_server(monkeypatch, ADMIN_KEY)
    client = ServerClient("http://sglang", CONTROLLER_POLICY, ADMIN_KEY, transport=transport, sleep=lambda s: None)
    pushed = table(64, probe={"budget": 4, "share": 0.05})
    state = client.push(pushed)
    assert (state.source, state.table, state.generation) == ("pushed", pushed, 1)
    assert control.active.state(0.0).table == pushed  # what the worker's steps now use
    assert client.read_state() == state
    # Without --api-key SGLang leaves /server_info open: the admin key travels with the push only.
    assert transport.seen == [
        ("POST", "/set_internal_state", f"Bearer {ADMIN_KEY}"),
        ("GET", "/server_info", None),
        ("GET", "/server_info", None),
    ]


def test_sglang_refusals_reach_the_controller_with_their_fix(jetspec_registered, monkeypatch):
    control, transport = sglang_server(monkeypatch, ADMIN_KEY)
    before = control.readback(0.0)
    wrong = ServerClient("http://sglang", CONTROLLER_POLICY, "wrong", transport=transport, sleep=lambda s: None)
    with pytest.raises(PushRejected, match=r"answered 401: Unauthorized -- missing or wrong admin key"):
        wrong.push(table(64))
    client = ServerClient("http://sglang", CONTROLLER_POLICY, ADMIN_KEY, transport=transport, sleep=lambda s: None)
    with pytest.raises(
        PushRejected,
        match=r"answered \[False\]: the server's last refusal: cohorts\[0\].budget 8 is not a candidate of 'bs1'",
    ):
        client.push(table(8))  # not a candidate of the server's bs1: SGLang says [false], /server_info says why
    nested = {"server_args": {"jetspec_policy": default_table(SERVER_POLICY).model_dump(mode="json")}}
    status, body = transport(
        "POST",
        "http://sglang/set_internal_state",
        {"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"},
        json.dumps(nested).encode(),
        5.0,
    )
    assert status == 400 and "Input should be a valid integer" in json.loads(body)["message"]  # why keys are flat
    assert control.readback(0.0) == before


def test_without_an_admin_key_the_plugin_refuses_pushes(jetspec_registered, monkeypatch):
    control, transport = sglang_server(monkeypatch, None)  # SGLang lets the request in; the plugin says no
    client = ServerClient("http://sglang", CONTROLLER_POLICY, None, transport=transport, sleep=lambda s: None)
    with pytest.raises(PushRejected, match=r"answered \[False\]"):
        client.push(table(64))
    assert control.readback(0.0)["source"] == "yaml"


def both_keys_client(transport, admin_key, api_key) -> ServerClient:
    return ServerClient(
        "http://sglang", CONTROLLER_POLICY, admin_key, api_key=api_key, transport=transport, sleep=lambda s: None
    )


def test_with_both_keys_the_push_takes_the_admin_key_and_the_readback_the_api_key(jetspec_registered, monkeypatch):
    control, transport = sglang_server(monkeypatch, ADMIN_KEY, API_KEY)
    client = both_keys_client(transport, ADMIN_KEY, API_KEY)
    pushed = table(4, bs2=8)
    state = client.push(pushed)
    assert (state.source, state.table, state.generation) == ("pushed", pushed, 1)
    assert control.active.state(0.0).table == pushed
    assert client.read_state() == state
    assert transport.seen == [
        ("POST", "/set_internal_state", f"Bearer {ADMIN_KEY}"),
        ("GET", "/server_info", f"Bearer {API_KEY}"),
        ("GET", "/server_info", f"Bearer {API_KEY}"),
    ]


@pytest.mark.parametrize("readback_key", [None, ADMIN_KEY, "wrong"])
def test_with_both_keys_a_readback_without_the_api_key_names_it_and_its_flag(
    jetspec_registered, monkeypatch, readback_key
):
    control, transport = sglang_server(monkeypatch, ADMIN_KEY, API_KEY)
    client = both_keys_client(transport, ADMIN_KEY, readback_key)  # SGLang takes no admin key on /server_info
    pushed = table(64)
    with pytest.raises(PushRejected) as refused:
        client.push(pushed)
    assert str(refused.value) == (
        "GET http://sglang/server_info answered 401: Unauthorized -- missing or wrong API key for the readback: "
        "the server runs with an ordinary API key (SGLang --api-key), which it requires on GET /server_info "
        "instead of the admin key; give it to the controller (--api-key-env, default $JETSPEC_API_KEY)"
    )
    assert control.active.state(0.0).table == pushed  # the push landed; only its confirmation failed
    assert [(method, path) for method, path, _ in transport.seen] == [
        ("POST", "/set_internal_state"),
        ("GET", "/server_info"),
    ]  # 401: no retry


@pytest.mark.parametrize("push_key", [None, API_KEY])
def test_with_both_keys_a_push_without_the_admin_key_names_it_and_its_flag(jetspec_registered, monkeypatch, push_key):
    control, transport = sglang_server(monkeypatch, ADMIN_KEY, API_KEY)
    before = control.readback(0.0)
    client = both_keys_client(transport, push_key, API_KEY)  # SGLang takes no API key on /set_internal_state
    with pytest.raises(PushRejected) as refused:
        client.push(table(64))
    assert str(refused.value).startswith(
        "POST http://sglang/set_internal_state answered 401: Unauthorized -- missing or wrong admin key: "
        "give the controller the servers' admin API key (--admin-key-env"
    )
    assert "--api-key-env" not in str(refused.value)
    assert control.readback(0.0) == before and before["source"] == "yaml"
    assert client.read_state().source == "yaml"  # the API key still reads back


def test_with_both_keys_the_controller_scrapes_metrics_without_a_key(jetspec_registered, monkeypatch, tmp_path):
    """SGLang's middleware lets /metrics through unauthenticated, so ScrapeSource sends no key."""
    from controller.telemetry import ScrapeSource

    _, transport = sglang_server(monkeypatch, ADMIN_KEY, API_KEY, metrics_dir=tmp_path)
    source = ScrapeSource(["http://sglang"], transport)
    first, second = source.read(), source.read()
    assert (first.usage, first.failed) == (None, [])  # a 200 page: the baseline is set
    assert (second.usage, second.failed) == ({}, [])  # nothing ran in between
    assert transport.seen == [("GET", "/metrics", None)] * 2
    assert transport("GET", "http://sglang/server_info", {}, None, 5.0)[0] == 401  # the key check is on


# each field of a push, a valid value of its documented JSON type (ttl_s and probe_share: any finite
# number; every other field: an integer), and the push it goes in (probe_budget and probe_share together)
FIELD_VALUES = {
    "ttl_s": 60.0,
    "bs1.budget": 4,
    "bs1.draft_rounds": 0,
    "bs1.tree_width": 4,
    "bs1.drafter": 1,
    "bs1.tree_sizing": 1,
    "bs1.sampled_children": 1,
    "bs1.probe_budget": 64,
    "bs1.probe_share": 0.05,
}
REAL = {"ttl_s", "bs1.probe_share"}


def _variants(value):
    """The same value as every JSON type: {type name: value}."""
    number = float(value) if isinstance(value, float) else int(value)
    return {
        "int": int(number) if not isinstance(value, float) else None,
        "float": float(number),
        "string": str(value),
        "bool": bool(number),
        "null": None,
        "array": [value],
        "object": {"value": value},
    }


@pytest.mark.parametrize("field", FIELD_VALUES)
def test_every_push_field_takes_only_its_documented_json_type(jetspec_registered, monkeypatch, field):
    """SGLang's own request type would apply "4" and true as 4 and 1: each field is refused (400, the key
    and its type named) in every JSON type but its own, and the table in force stays as it was."""
    control, transport = sglang_server(monkeypatch, ADMIN_KEY)
    base = {"jetspec_policy.ttl_s": 90.0, "jetspec_policy.bs1.budget": 16, "jetspec_policy.bs2-8.budget": 4}
    if "probe" in field:
        base |= {"jetspec_policy.bs1.probe_budget": 64, "jetspec_policy.bs1.probe_share": 0.05}
    key = f"jetspec_policy.{field}"
    documented = {"int", "float"} if field in REAL else {"int"}
    for kind, value in _variants(FIELD_VALUES[field]).items():
        if kind == "int" and value is None:
            continue  # a real field's value has a fraction: its integer twin is another value
        before = control.readback(0.0)
        status, body = transport(
            "POST",
            "http://sglang/set_internal_state",
            {"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"},
            json.dumps({"server_args": {**base, key: value}}).encode(),
            5.0,
        )
        answer = json.loads(body)
        if kind in documented:
            assert (status, answer) == (200, [True]), (kind, answer)
            assert control.readback(0.0)["generation"] == before["generation"] + 1
        else:
            assert status == 400, (kind, answer)
            assert [p for p in answer["problems"] if key in p and "send" in p], (kind, answer)
            after = control.readback(0.0)
            assert (after["table"], after["generation"]) == (before["table"], before["generation"]), kind


def test_a_push_of_the_wrong_type_without_the_admin_key_is_refused_for_the_key(jetspec_registered, monkeypatch):
    control, transport = sglang_server(monkeypatch, ADMIN_KEY)
    status, _ = transport(
        "POST",
        "http://sglang/set_internal_state",
        {"Content-Type": "application/json"},
        json.dumps({"server_args": {"jetspec_policy.bs1.budget": "4"}}).encode(),
        5.0,
    )
    assert status == 401  # SGLang's key check runs first: its types tell an outsider nothing
