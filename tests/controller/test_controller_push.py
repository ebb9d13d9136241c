"""Push client and controller loop against a real HTTP control endpoint on 127.0.0.1."""

from __future__ import annotations

import json
import re
import socket

import pytest
from opentelemetry.sdk.trace import TracerProvider

from controller.http import urllib_transport
from controller.loop import Controller
from controller.observability import Observer
from controller.server_client import PushRejected, ServerClient, ServerUnavailable
from controller.telemetry import ScrapeSource
from policies.problems import PolicyError
from policies.table import PolicyTable, default_table
from tests.policies.test_policy_table import FLAT_BS1_64_PROBING_16


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_client(server, policy, key=None, sleeps=None, attempts=4):
    sleep = sleeps.append if sleeps is not None else (lambda s: None)
    return ServerClient(server.url, policy, key or server.admin_key, sleep=sleep, attempts=attempts, timeout_s=5)


def table_with(policy, budget=64, probe=None) -> PolicyTable:
    data = default_table(policy).model_dump()
    data["cohorts"][0].update(budget=budget, probe=probe)
    return PolicyTable.model_validate(data)


def make_controller(server, policy, clock, dry_run=False):
    observer = Observer(TracerProvider().get_tracer("test"), started_at=clock())
    controller = Controller(
        policy,
        ScrapeSource([server.url], urllib_transport),
        [make_client(server, policy)],
        clock,
        observer,
        dry_run=dry_run,
    )
    return controller, observer


def test_push_sends_the_admin_key_and_flat_numeric_keys(control_server, test_policy):
    table = table_with(test_policy, probe={"budget": 16, "share": 0.05})
    state = make_client(control_server, test_policy).push(table)
    assert (state.source, state.table, state.generation) == ("pushed", table, 1)
    (post,) = control_server.posts()
    assert post.path == "/set_internal_state"
    assert post.headers["Authorization"] == f"Bearer {control_server.admin_key}"
    # SGLang's request type admits only numbers: the flat keys
    assert json.loads(post.body) == {"server_args": FLAT_BS1_64_PROBING_16}
    assert [r.path for r in control_server.requests] == ["/set_internal_state", "/server_info"]  # push, readback
    readback = make_client(control_server, test_policy).read_state()
    assert readback.table == table and readback.expires_at == control_server.now[0] + 90


def test_with_an_api_key_the_readback_sends_it_and_the_push_the_admin_key(control_server, test_policy, api_key):
    control_server.api_key = api_key  # SGLang with --api-key and --admin-api-key: each route takes one key
    client = ServerClient(
        control_server.url, test_policy, control_server.admin_key, api_key=api_key, sleep=lambda s: None
    )
    table = table_with(test_policy, budget=4)
    assert client.push(table).table == table
    assert [(r.method, r.path, r.headers["Authorization"]) for r in control_server.requests] == [
        ("POST", "/set_internal_state", f"Bearer {control_server.admin_key}"),
        ("GET", "/server_info", f"Bearer {api_key}"),
    ]
    assert client.read_state().table == table


def test_readback_without_the_api_key_names_the_api_key_and_its_flag(control_server, test_policy, api_key):
    control_server.api_key = api_key
    table = table_with(test_policy, budget=4)
    with pytest.raises(PushRejected) as refused:
        make_client(control_server, test_policy).push(table)
    message = str(refused.value)
    assert message.startswith(
        f"GET {control_server.url}/server_info answered 401: Unauthorized -- "
        "missing or wrong API key for the readback: "
    )
    assert "(SGLang --api-key)" in message and "(--api-key-env, default $JETSPEC_API_KEY)" in message
    assert "--admin-key-env" not in message and "missing or wrong admin key" not in message
    assert control_server.active.state(control_server.now[0]).table == table  # the push itself landed
    assert len(control_server.readbacks()) == 1  # a 401 is not retried
    wrong = ServerClient(
        control_server.url, test_policy, control_server.admin_key, api_key="wrong", sleep=lambda s: None
    )
    with pytest.raises(PushRejected, match=r"answered 401: .* -- missing or wrong API key for the readback"):
        wrong.read_state()


@pytest.mark.parametrize("api_key", [None, "an-api-key-the-server-does-not-check"])
def test_a_server_without_an_api_key_reads_back_with_or_without_one(control_server, test_policy, api_key):
    # The reference server (and SGLang with only --admin-api-key) leaves /server_info open.
    client = ServerClient(
        control_server.url, test_policy, control_server.admin_key, api_key=api_key, sleep=lambda s: None
    )
    table = table_with(test_policy, budget=0)
    assert client.push(table).table == table
    (readback,) = control_server.readbacks()
    # The admin key only ever travels with pushes.
    assert readback.headers.get("Authorization") == (f"Bearer {api_key}" if api_key else None)


def test_push_retries_with_exponential_backoff(control_server, test_policy):
    control_server.fail_next[0] = 2
    sleeps: list[float] = []
    make_client(control_server, test_policy, sleeps=sleeps).push(table_with(test_policy))
    assert sleeps == [0.5, 1.0]
    assert len(control_server.posts()) == 3


def test_push_gives_up_after_the_last_attempt(control_server, test_policy):
    control_server.fail_next[0] = 100
    sleeps: list[float] = []
    with pytest.raises(ServerUnavailable, match="gave up after 3 attempts"):
        make_client(control_server, test_policy, sleeps=sleeps, attempts=3).push(table_with(test_policy))
    assert sleeps == [0.5, 1.0]
    assert len(control_server.posts()) == 3


def test_wrong_admin_key_is_not_retried_and_names_the_fix(control_server, test_policy):
    with pytest.raises(
        PushRejected, match=r"answered 401: Unauthorized.* -- missing or wrong admin key: .*--admin-key-env"
    ):
        make_client(control_server, test_policy, key="wrong").push(table_with(test_policy))
    assert len(control_server.posts()) == 1
    assert control_server.active.state(control_server.now[0]).source == "yaml"


def test_invalid_table_is_never_sent(control_server, test_policy):
    data = default_table(test_policy).model_dump()
    data["cohorts"][0]["budget"] = 32  # pydantic-valid, but not a candidate of bs1
    with pytest.raises(PolicyError, match=r"cohorts\[0\].budget 32 is not a candidate"):
        make_client(control_server, test_policy).push(PolicyTable.model_validate(data))
    assert control_server.requests == []


def test_unreachable_server_is_unavailable(test_policy):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = ServerClient(f"http://127.0.0.1:{port}", test_policy, "any-key", sleep=lambda s: None, attempts=2)
    with pytest.raises(ServerUnavailable):
        client.read_state()


def test_controller_pushes_renews_and_tracks_staleness(control_server, test_policy):
    clock = Clock(1000.0)
    controller, observer = make_controller(control_server, test_policy, clock)
    controller.resume()
    assert controller.step() == []  # first scrape only sets the counter baseline
    assert control_server.posts() == []
    clock.now += 10
    decisions = controller.step()
    assert {d.cohort for d in decisions} == {"bs1", "bs2-8"}
    assert len(control_server.posts()) == 1  # probes started: one push
    assert control_server.active.state(clock.now).table == controller.table
    clock.now += 10
    controller.step()
    assert len(control_server.posts()) == 1  # same table, renewal not due yet
    clock.now += test_policy.controller.ttl_s / 2
    controller.step()
    assert len(control_server.posts()) == 2  # renewed at half-life
    assert observer.registry.get_sample_value("jetspec_controller_pushes_total", {"server": control_server.url}) == 2
    assert (
        observer.registry.get_sample_value("jetspec_controller_staleness_seconds", {"server": control_server.url})
        == 0.0
    )


def test_dry_run_never_pushes(control_server, test_policy):
    clock = Clock(1000.0)
    controller, _ = make_controller(control_server, test_policy, clock, dry_run=True)
    controller.resume()
    for _ in range(4):
        controller.step()
        clock.now += 10
    assert control_server.posts() == []
    assert len([r for r in control_server.requests if r.path == "/metrics"]) == 4


def test_restart_reads_back_and_resumes_without_pushing(control_server, test_policy):
    running = table_with(test_policy, budget=64, probe={"budget": 16, "share": 0.05})
    make_client(control_server, test_policy).push(running)
    control_server.requests.clear()
    clock = Clock(control_server.now[0] + 20)
    controller, observer = make_controller(control_server, test_policy, clock)
    controller.resume()
    assert controller.table == running
    controller.step()
    assert control_server.posts() == []
    assert (
        observer.registry.get_sample_value("jetspec_controller_staleness_seconds", {"server": control_server.url})
        == 0.0
    )


def test_invalid_decision_keeps_the_last_good_table(control_server, test_policy, monkeypatch):
    clock = Clock(1000.0)
    controller, observer = make_controller(control_server, test_policy, clock)
    controller.resume()
    controller.step()
    clock.now += 10
    controller.step()
    good = control_server.active.state(clock.now).table
    bad = default_table(test_policy).model_dump()
    bad["cohorts"][0]["budget"] = 32
    monkeypatch.setattr(controller._decider, "table", lambda: PolicyTable.model_validate(bad))
    pushes_before = len(control_server.posts())
    clock.now += 10
    controller.step()
    assert observer.registry.get_sample_value("jetspec_controller_invalid_tables_total") == 1
    assert controller.table == good
    assert len(control_server.posts()) == pushes_before
    assert all(json.loads(p.body)["server_args"]["jetspec_policy.bs1.budget"] != 32 for p in control_server.posts())


def test_failed_push_is_counted_and_retried_next_interval(control_server, test_policy):
    clock = Clock(1000.0)
    controller, observer = make_controller(control_server, test_policy, clock)
    controller.resume()
    controller.step()
    clock.now += 10
    control_server.fail_next[0] = 4  # every attempt of the next push
    controller.step()
    labels = {"server": control_server.url, "kind": "unavailable"}
    assert observer.registry.get_sample_value("jetspec_controller_push_failures_total", labels) == 1
    clock.now += 10
    controller.step()
    assert control_server.active.state(clock.now).table == controller.table


class SGLangAnswers:
    """A transport answering like an SGLang server would: set_internal_state -> `set_answer`,
    /server_info -> one internal state per data-parallel rank."""

    def __init__(self, set_answer=(200, [True]), ranks=()):
        self.set_answer = set_answer
        self.ranks = list(ranks)
        self.calls: list[tuple[str, str]] = []

    def __call__(self, method, url, headers, body, timeout_s):
        self.calls.append((method, url.rsplit("/", 1)[1]))
        if url.endswith("/set_internal_state"):
            status, payload = self.set_answer
        else:
            status, payload = 200, {"version": "0.5.23", "internal_states": self.ranks}
        return status, json.dumps(payload).encode()


def rank(table: PolicyTable, generation: int = 1) -> dict:
    """One rank's internal state: SGLang's own keys plus what the plugin adds under jetspec_policy."""
    return {
        "pp_max_micro_batch_size": 8,
        "jetspec_policy": {
            "table": table.model_dump(mode="json"),
            "source": "pushed",
            "expires_at": 1090.0,
            "generation": generation,
        },
    }


def sglang_client(policy, transport) -> ServerClient:
    return ServerClient("http://sglang:30000", policy, "key", transport=transport, sleep=lambda s: None)


def test_push_reads_back_every_data_parallel_rank(test_policy):
    table = table_with(test_policy)
    transport = SGLangAnswers((200, [True, True]), [rank(table, 3), rank(table, 5)])
    state = sglang_client(test_policy, transport).push(table)
    assert (state.table, state.generation) == (table, 3)
    assert transport.calls == [("POST", "set_internal_state"), ("GET", "server_info")]


@pytest.mark.parametrize("answer", [[False], [True, False], []])
def test_sglang_refusing_a_table_is_rejected_pointing_at_its_log(test_policy, answer):
    """A server that keeps no reasons on /server_info (an older plugin): the refusal points at its log."""
    table = table_with(test_policy)
    transport = SGLangAnswers((200, answer), [rank(table)])
    with pytest.raises(PushRejected, match=rf"answered {re.escape(repr(answer))}: .*'rejected jetspec_policy push'"):
        sglang_client(test_policy, transport).push(table)
    assert transport.calls == [("POST", "set_internal_state"), ("GET", "server_info")]  # not retried


def test_sglang_refusing_a_table_is_rejected_with_the_servers_reasons(test_policy):
    table = table_with(test_policy)
    refused = {
        **rank(table),
        "jetspec_last_refused_push": {"at": 1000.0, "problems": ["cohorts[0].budget 8 is not a candidate"]},
    }
    transport = SGLangAnswers((200, [False]), [refused])
    with pytest.raises(
        PushRejected, match=r"answered \[False\]: the server's last refusal: cohorts\[0\]\.budget 8 is not"
    ):
        sglang_client(test_policy, transport).push(table)
    assert transport.calls == [("POST", "set_internal_state"), ("GET", "server_info")]


@pytest.mark.parametrize(
    "status, payload, says",
    [
        (401, {"error": "Unauthorized"}, "Unauthorized -- missing or wrong admin key"),
        (403, {"error": "Forbidden"}, "Forbidden -- the server refuses policy pushes: start it with an admin API key"),
        (
            400,
            {"object": "error", "message": "1 validation error", "type": "Bad Request", "code": 400},
            "1 validation error -- the server could not take the request: compare its policy file",
        ),
        (
            422,
            {"detail": [{"loc": ["body", "server_args"], "msg": "Input should be a valid number"}]},
            "Input should be a valid number'}] -- the server refused the body's types",
        ),
        (404, {"detail": "Not Found"}, "Not Found -- no such endpoint: is this the URL of a JetSpec server"),
    ],
)
def test_refusals_name_the_fix(test_policy, status, payload, says):
    transport = SGLangAnswers((status, payload))
    with pytest.raises(PushRejected) as refused:
        sglang_client(test_policy, transport).push(table_with(test_policy))
    assert f"answered {status}: " in str(refused.value) and says in str(refused.value)
    assert len(transport.calls) == 1


def test_ranks_running_different_tables_are_not_a_state(test_policy):
    transport = SGLangAnswers(ranks=[rank(table_with(test_policy, budget=64)), rank(table_with(test_policy, budget=4))])
    with pytest.raises(
        ServerUnavailable,
        match=r"ranks of http://sglang:30000 run different tables: "
        r"\[\{'bs1': 64, 'bs2-8': 4\}, \{'bs1': 4, 'bs2-8': 4\}\]",
    ):
        sglang_client(test_policy, transport).read_state()


@pytest.mark.parametrize("ranks", [[], [{"pp_max_micro_batch_size": 8}], [{"jetspec_policy": {"table": None}}]])
def test_a_server_without_the_plugin_has_no_state(test_policy, ranks):
    with pytest.raises(
        ServerUnavailable, match=r"(?s)has no valid internal_states\[i\].jetspec_policy .* JetSpec server"
    ):
        sglang_client(test_policy, SGLangAnswers(ranks=ranks)).read_state()
