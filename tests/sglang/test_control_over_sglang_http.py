"""The controller's ServerClient drives SGLang 0.5.23's own HTTP layer: its routes, request types,
validation answers and admin-key middleware, its TokenizerManager methods, and the scheduler's
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

ADMIN_KEY = "sglang-admin-key"
SERVER_POLICY = parse_policy_text("""\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 16, 64], default: 16}
  - {name: bs2-8, min_batch: 2, max_batch: 8, budgets: [0, 4, 8], default: 4}
""", "server.yaml")
# The controller's file lists budget 8 for bs1 as well: a table with it passes the controller's
# check and is refused by the server, as when the two run different policy files.
CONTROLLER_POLICY = parse_policy_text("""\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 8, 16, 64], default: 16}
  - {name: bs2-8, min_batch: 2, max_batch: 8, budgets: [0, 4, 8], default: 4}
""", "controller.yaml")


def table(bs1: int, bs2: int = 4, probe=None):
    return validate_table({"cohorts": [{"name": "bs1", "min_batch": 1, "max_batch": 1, "budget": bs1, "probe": probe},
                                       {"name": "bs2-8", "min_batch": 2, "max_batch": 8, "budget": bs2}],
                           "ttl_s": 90.0}, CONTROLLER_POLICY)


def sglang_server(monkeypatch, admin_key: str | None):
    """SGLang's app (the two control routes, its error handlers, its auth middleware) over a
    scheduler-side controller whose draft worker carries a PolicyControl, as the JETSPEC worker does."""
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
    scheduler = SchedulerInternalStateController(SimpleNamespace(draft_worker=SimpleNamespace(policy_control=control)),
                                                 record_step_time=False)

    async def set_communicator(req):
        return [scheduler.set_internal_state(req)]

    async def get_communicator(req):
        # SGLang's own part of the state needs a running scheduler: the plugin's AFTER hook adds to one key.
        return [internal_state.after_get_internal_state(GetInternalStateReqOutput(
            internal_state={"pp_max_micro_batch_size": 1}), scheduler, req)]

    class DirectTokenizerManager(TokenizerControlMixin):
        server_args = SimpleNamespace()
        startup_time = 0.0
        set_internal_state_communicator = staticmethod(set_communicator)
        get_internal_state_communicator = staticmethod(get_communicator)

        def auto_create_handle_loop(self):
            pass

    monkeypatch.setattr(http_server, "_global_state",
                        http_server._GlobalState(DirectTokenizerManager(), None, {}))
    monkeypatch.setattr(http_server, "build_server_info", lambda server_args, scheduler_info: {})
    app = FastAPI()
    app.router.routes.extend(r for r in http_server.app.router.routes
                             if getattr(r, "path", None) in {"/set_internal_state", "/server_info"})
    app.exception_handlers.update(http_server.app.exception_handlers)
    add_api_key_middleware(app, api_key=None, admin_api_key=admin_key)
    client = TestClient(app)

    def transport(method, url, headers, body, timeout_s):
        answer = client.request(method, url.removeprefix("http://sglang"), headers=headers, content=body)
        return answer.status_code, answer.content

    return control, transport


def test_the_controller_pushes_and_reads_back_through_sglang(jetspec_registered, monkeypatch):
    control, transport = sglang_server(monkeypatch, ADMIN_KEY)
    client = ServerClient("http://sglang", CONTROLLER_POLICY, ADMIN_KEY, transport=transport, sleep=lambda s: None)
    pushed = table(64, probe={"budget": 4, "share": 0.05})
    state = client.push(pushed)
    assert (state.source, state.table, state.generation) == ("pushed", pushed, 1)
    assert control.active.state(0.0).table == pushed  # what the worker's steps now use
    assert client.read_state() == state


def test_sglang_refusals_reach_the_controller_with_their_fix(jetspec_registered, monkeypatch):
    control, transport = sglang_server(monkeypatch, ADMIN_KEY)
    before = control.readback(0.0)
    wrong = ServerClient("http://sglang", CONTROLLER_POLICY, "wrong", transport=transport, sleep=lambda s: None)
    with pytest.raises(PushRejected, match=r"answered 401: Unauthorized -- missing or wrong admin key"):
        wrong.push(table(64))
    client = ServerClient("http://sglang", CONTROLLER_POLICY, ADMIN_KEY, transport=transport, sleep=lambda s: None)
    with pytest.raises(PushRejected, match=r"answered \[False\]: .*'rejected jetspec_policy push'"):
        client.push(table(8))  # not a candidate of the server's bs1
    nested = {"server_args": {"jetspec_policy": default_table(SERVER_POLICY).model_dump(mode="json")}}
    status, body = transport("POST", "http://sglang/set_internal_state",
                             {"Authorization": f"Bearer {ADMIN_KEY}", "Content-Type": "application/json"},
                             json.dumps(nested).encode(), 5.0)
    assert status == 400 and "Input should be a valid integer" in json.loads(body)["message"]  # why keys are flat
    assert control.readback(0.0) == before


def test_without_an_admin_key_the_plugin_refuses_pushes(jetspec_registered, monkeypatch):
    control, transport = sglang_server(monkeypatch, None)  # SGLang lets the request in; the plugin says no
    client = ServerClient("http://sglang", CONTROLLER_POLICY, None, transport=transport, sleep=lambda s: None)
    with pytest.raises(PushRejected, match=r"answered \[False\]"):
        client.push(table(64))
    assert control.readback(0.0)["source"] == "yaml"
