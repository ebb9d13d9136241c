"""The reference engine behind HTTP (sglang_jetspec/serving/server.py) on the real SmolLM2 target, on loopback."""

from __future__ import annotations

import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controller.http import urllib_transport
from controller.server_client import PushRejected, ServerClient
from policies import parse_policy_text, validate_table
from sglang_jetspec.cli import main
from sglang_jetspec.core.prompt_lookup import LookupMerge
from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.observability.metrics import STEP_COUNTERS
from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine, Request
from sglang_jetspec.serving.server import JetspecServer, check_budgets_runnable

ADMIN_KEY = "server-test-key"
POLICY_YAML = """\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 8], default: 4}
  - {name: bs2-4, min_batch: 2, max_batch: 4, budgets: [0, 4, 8], default: 0}
controller: {interval_s: 1, ttl_s: 30, window_s: 10, min_samples: 2}
"""
POLICY = parse_policy_text(POLICY_YAML, "server-test.yaml")
PROMPTS = ["def fibonacci(n):", "The capital of France is", "import numpy as np\n", "Write a haiku about rain."]
TIMEOUT_S = 300.0  # per HTTP call: generous for a loaded 2-core CI machine, but never unbounded


def call(url: str, method: str = "GET", payload=None, key: str | None = None) -> tuple[int, dict | str]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body = None if payload is None else (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
    status, raw = urllib_transport(method, url, headers, body, TIMEOUT_S)
    try:
        return status, json.loads(raw)
    except json.JSONDecodeError:
        return status, raw.decode()


def generate(url: str, payload: dict) -> tuple[int, dict]:
    return call(f"{url}/generate", "POST", payload)


def metric_samples(url: str) -> dict[tuple[str, tuple], float]:
    status, page = call(f"{url}/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }


def table(bs1: int, bs2: int, ttl_s: float = 60.0) -> dict:
    """A table without probes as SGLang's /set_internal_state takes it: flat numeric keys."""
    return {"jetspec_policy.ttl_s": ttl_s, "jetspec_policy.bs1.budget": bs1, "jetspec_policy.bs2-4.budget": bs2}


def push(url: str, flat: dict, key: str | None = ADMIN_KEY) -> tuple[int, dict | list]:
    return call(f"{url}/set_internal_state", "POST", {"server_args": flat}, key)


def readback(url: str) -> dict:
    status, info = call(f"{url}/server_info")
    assert status == 200
    (rank,) = info["internal_states"]  # one engine: one data-parallel rank
    return rank["jetspec_policy"]


def bs1_budget(url: str) -> int:
    """The budget a lone request runs at now (the tables here have no probes)."""
    return readback(url)["table"]["cohorts"][0]["budget"]


@pytest.fixture(scope="module")
def engine(smollm2, untrained_drafter) -> ReferenceEngine:
    return ReferenceEngine(smollm2, untrained_drafter, EngineConfig(max_batch_size=4))


@pytest.fixture(scope="module")
def server(engine):
    with JetspecServer(engine, POLICY, ADMIN_KEY) as running:
        yield running


def test_greedy_generation_over_http_equals_the_engine(server, smollm2, untrained_drafter):
    ids = smollm2.tokenizer(PROMPTS[0])["input_ids"]
    by_text = generate(server.url, {"text": PROMPTS[0], "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
    by_ids = generate(server.url, {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 8}})
    assert bs1_budget(server.url) > 1  # the server speculates; the reference decodes autoregressively
    reference = ReferenceEngine(smollm2, untrained_drafter).generate(
        [Request(ids, SamplingParams(max_new_tokens=8))], budget=0
    )[0]
    for status, out in (by_text, by_ids):
        assert status == 200, out
        assert out["output_ids"] == reference.output_ids and out["text"] == reference.text
        meta = out["meta_info"]
        assert meta["prompt_tokens"] == len(ids) and meta["completion_tokens"] == 8
        assert meta["finish_reason"] == {"type": "length", "length": 8}
        assert meta["spec_verify_ct"] >= 1 and meta["spec_accept_length"] >= 1.0
    budget = str(bs1_budget(server.url))
    assert metric_samples(server.url)[("jetspec_steps_total", (("budget", budget), ("cohort", "bs1")))] >= 1
    stop = smollm2.tokenizer.decode(reference.output_ids[2:4])
    status, out = generate(server.url, {"input_ids": ids, "sampling_params": {"temperature": 0, "stop": stop}})
    assert status == 200, out
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert reference.output_ids[: len(out["output_ids"])] == out["output_ids"] and stop not in out["text"]


def test_seeded_sampling_over_http_equals_the_engine_at_the_same_budget(server, smollm2, untrained_drafter):
    sampling = {
        "temperature": 0.8,
        "top_p": 0.9,
        "top_k": 50,
        "min_p": 0.02,
        "seed": 7,
        "max_new_tokens": 8,
        "ignore_eos": True,
    }
    status, out = generate(server.url, {"text": PROMPTS[1], "sampling_params": sampling})
    assert status == 200, out
    ids = smollm2.tokenizer(PROMPTS[1])["input_ids"]
    reference = ReferenceEngine(smollm2, untrained_drafter).generate(
        [Request(ids, SamplingParams(**sampling))], budget=bs1_budget(server.url)
    )[0]
    assert out["output_ids"] == reference.output_ids


def test_concurrent_requests_decode_in_one_batch(server):
    before = metric_samples(server.url)
    payloads = [
        {"text": p, "sampling_params": {"temperature": 0, "max_new_tokens": 6 + 2 * i}} for i, p in enumerate(PROMPTS)
    ]
    with ThreadPoolExecutor(len(payloads)) as pool:
        results = list(pool.map(lambda p: generate(server.url, p), payloads))
    assert [status for status, _ in results] == [200] * len(payloads), results
    assert [out["meta_info"]["completion_tokens"] for _, out in results] == [6, 8, 10, 12]
    after = metric_samples(server.url)

    def batched(name: str) -> float:  # growth of a counter over the steps of several requests at once
        return sum(
            value - before.get((n, labels), 0)
            for (n, labels), value in after.items()
            if n == name and ("cohort", "bs2-4") in labels
        )

    assert batched("jetspec_steps_total") > 0
    assert batched("jetspec_requests_total") >= 2 * batched("jetspec_steps_total")


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"text": "hi", "sampling_params": {"temperature": "hot"}}, "sampling_params.temperature"),
        ({"text": "hi", "sampling_params": {"top_k": 0}}, "sampling_params.top_k"),
        ({"text": "hi", "sampling_params": {"top_p": 1.5}}, "sampling_params.top_p"),
        ({"text": "hi", "sampling_params": {"max_new_tokens": 10**6}}, "sampling_params.max_new_tokens"),
        ({"text": "hi", "sampling_params": {"frequency_penalty": 0.5}}, "sampling_params.frequency_penalty"),
        ({"text": "hi", "sampling_params": {"stop": [1, 2]}}, "sampling_params.stop"),
        ({"text": "hi", "stream": True}, "stream"),
        ({"input_ids": [1, 49152]}, "input_ids[1]"),
        ({"input_ids": []}, "input_ids"),
        ({"text": "hi", "input_ids": [1]}, "text, input_ids"),
        ({"text": ""}, "text"),
        (b"{not json", "body"),
    ],
)
def test_a_bad_request_is_400_naming_the_field(server, payload, field):
    status, out = call(f"{server.url}/generate", "POST", payload)
    assert status == 400
    assert out["error"]["message"].startswith(field), out


def test_pushes_need_the_admin_key(server):
    before = readback(server.url)
    assert push(server.url, table(0, 4), key=None)[0] == 401
    assert push(server.url, table(0, 4), key="wrong-key")[0] == 401
    assert readback(server.url) == before


def test_a_bad_push_is_400_and_the_running_table_stays(server):
    status, out = push(server.url, table(8, 0))
    assert (status, out) == (200, [True])  # SGLang's answer
    good = readback(server.url)
    assert good["source"] == "pushed" and good["table"]["cohorts"][0]["budget"] == 8
    status, out = push(server.url, table(16, 0))  # 16 is not a candidate of bs1
    assert status == 400
    assert out["problems"] == ["cohorts[0].budget 16 is not a candidate of 'bs1' -- use one of [0, 4, 8]"]
    nested = {"cohorts": [{"name": "bs1", "min_batch": 1, "max_batch": 1, "budget": 4, "probe": None}], "ttl_s": 60}
    status, out = push(server.url, {"jetspec_policy": nested})  # the form SGLang's request type refuses
    assert status == 400 and out["problems"][0].startswith(
        "server_args.jetspec_policy is an object -- SGLang's /set_internal_state takes numbers only"
    )
    assert readback(server.url) == good
    gauges = metric_samples(server.url)
    assert gauges[("jetspec_policy_budget", (("cohort", "bs1"),))] == 8
    assert gauges[("jetspec_policy_generation", ())] == good["generation"]


def test_the_controller_client_pushes_and_reads_back(server):
    client = ServerClient(server.url, POLICY, ADMIN_KEY, timeout_s=TIMEOUT_S)
    pushed = validate_table(
        {
            "cohorts": [
                {"name": "bs1", "min_batch": 1, "max_batch": 1, "budget": 0, "probe": {"budget": 4, "share": 0.05}},
                {"name": "bs2-4", "min_batch": 2, "max_batch": 4, "budget": 8},
            ],
            "ttl_s": 60.0,
        },
        POLICY,
    )
    state = client.push(pushed)
    assert state.table == pushed and state.source == "pushed"
    assert client.read_state() == state
    with pytest.raises(PushRejected, match="answered 401: Unauthorized"):
        ServerClient(server.url, POLICY, "wrong-key", timeout_s=TIMEOUT_S).push(pushed)


def test_an_expired_push_reverts_to_the_yaml_default(server):
    status, out = push(server.url, table(0, 8, ttl_s=0.5))
    assert status == 200, out
    pushed = readback(server.url)
    assert pushed["source"] == "pushed" and pushed["expires_at"] is not None
    deadline = time.monotonic() + 10
    while (state := readback(server.url))["source"] == "pushed" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state["source"] == "yaml" and state["expires_at"] is None
    assert state["generation"] == pushed["generation"] + 1
    assert [c["budget"] for c in state["table"]["cohorts"]] == [4, 0]
    gauges = metric_samples(server.url)
    assert gauges[("jetspec_policy_budget", (("cohort", "bs1"),))] == 4
    assert gauges[("jetspec_policy_expiry_timestamp_seconds", ())] == 0


def test_metrics_page_carries_the_contract_names(server):
    samples = metric_samples(server.url)
    names = {name for name, _ in samples}
    assert (
        set(STEP_COUNTERS)
        | {
            "jetspec_accept_length_bucket",
            "jetspec_accept_length_count",
            "jetspec_policy_budget",
            "jetspec_policy_expiry_timestamp_seconds",
            "jetspec_policy_generation",
        }
        <= names
    )
    per_server = ("jetspec_policy_", "jetspec_live_draft_states", "jetspec_same_allocation_")
    for name, labels in samples:
        # per-step families carry cohort and budget; policy state, the live-state count and the
        # same-allocation control's state are per server (the control's per cohort, the gain per bound too)
        if name.startswith("jetspec_") and not name.startswith(per_server):
            assert {k for k, _ in labels} - {"le"} == {"cohort", "budget"}, name
        elif name.startswith("jetspec_same_allocation_"):
            assert {k for k, _ in labels} == ({"cohort", "bound"} if "gain" in name else {"cohort"}), name


def test_unknown_paths_are_404_and_wrong_methods_405(server):
    assert call(f"{server.url}/v1/completions", "POST", {})[0] == 404
    assert call(f"{server.url}/get_internal_state")[0] == 404  # SGLang has no such route either: /server_info
    assert call(f"{server.url}/generate")[0] == 405
    assert call(f"{server.url}/health") == (200, {"status": "ok"})


def test_an_engine_failure_fails_its_requests_with_500_and_serving_goes_on(server, engine, monkeypatch):
    real_step = engine._step
    calls = []

    def failing_once(*args):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected verify failure")
        return real_step(*args)

    monkeypatch.setattr(engine, "_step", failing_once)
    sampled = {"text": PROMPTS[1], "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    status, out = generate(server.url, sampled)
    assert status == 500 and "injected verify failure" in out["error"]["message"]
    status, out = generate(server.url, sampled)
    assert status == 200 and out["meta_info"]["completion_tokens"] == 4
    assert call(f"{server.url}/health")[0] == 200


@pytest.fixture
def own_server(smollm2, untrained_drafter):
    """A second server, without an admin key, that a test may stop itself."""
    engine = ReferenceEngine(smollm2, untrained_drafter, EngineConfig(max_batch_size=4))
    server = JetspecServer(engine, POLICY, admin_key=None).start()
    stopped = [False]
    yield server, stopped
    if not stopped[0]:
        server.stop()


def test_a_server_without_admin_key_refuses_pushes_with_403(own_server):
    server, _ = own_server
    status, out = push(server.url, table(0, 4))
    assert status == 403 and "admin API key" in out["error"]


def in_background(url: str, payload: dict) -> tuple[threading.Thread, list]:
    result: list = []

    def run() -> None:
        try:
            result.append(generate(url, payload))
        except Exception as exc:  # surfaced by the test's assertions
            result.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def wait_for_running_steps(url: str, thread: threading.Thread, result: list) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not any(name == "jetspec_steps_total" for name, _ in metric_samples(url)):
        assert thread.is_alive(), f"the request ended before its first step: {result}"
        assert time.monotonic() < deadline, "the request never started decoding"
        time.sleep(0.05)


def test_shutdown_lets_running_requests_finish(own_server):
    server, stopped = own_server
    payload = {"text": PROMPTS[2], "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}
    thread, result = in_background(server.url, payload)
    wait_for_running_steps(server.url, thread, result)
    server.stop(drain_timeout_s=TIMEOUT_S)
    stopped[0] = True
    thread.join(TIMEOUT_S)
    assert result and result[0][0] == 200 and result[0][1]["meta_info"]["completion_tokens"] == 5
    with pytest.raises(ConnectionError):
        urllib_transport("GET", f"{server.url}/health", {}, None, 5)


def test_shutdown_past_the_drain_timeout_fails_leftovers_with_503(own_server):
    server, stopped = own_server
    payload = {"text": PROMPTS[3], "sampling_params": {"max_new_tokens": 500, "ignore_eos": True}}
    thread, result = in_background(server.url, payload)
    wait_for_running_steps(server.url, thread, result)
    server.stop(drain_timeout_s=0)
    stopped[0] = True
    thread.join(TIMEOUT_S)
    assert result and result[0][0] == 503 and "shut down" in result[0][1]["error"]["message"]


def test_budgets_above_1_need_a_draft_head():
    with pytest.raises(ValueError, match=r"cohorts\[0\] 'bs1' lists budget 4, which needs a draft head"):
        check_budgets_runnable(POLICY, has_drafter=False)
    check_budgets_runnable(POLICY, has_drafter=True)
    plain = parse_policy_text(
        "cohorts: [{name: all, min_batch: 1, max_batch: 8, budgets: [0, 1], default: 1}]\ngate: {reprobe_budget: 1}"
    )
    check_budgets_runnable(plain, has_drafter=False)


def serve(smollm2_dir, policy_file, *extra: str) -> int:
    return main(["serve", "--target", str(smollm2_dir), "--policy", str(policy_file), "--port", "0", *extra])


def test_serve_refuses_a_bad_policy_before_loading_the_model(tmp_path, smollm2_dir, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(POLICY_YAML.replace("default: 4", "default: 5"))
    assert serve(smollm2_dir, bad, "--head", "untrained") == 2
    assert f"{bad}:2: cohorts[0] 'bs1' default 5 is not one of its budgets" in capsys.readouterr().err


def test_serve_checks_the_policy_against_the_head(tmp_path, smollm2_dir, capsys):
    head = tmp_path / "tiny-head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"block_size": 2, "tree_width": 2}))  # at most 3 nodes
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY_YAML)
    assert serve(smollm2_dir, policy, "--head", str(head)) == 2
    assert "budget 4 is more nodes than head" in capsys.readouterr().err
    assert serve(smollm2_dir, policy, "--head", str(tmp_path / "missing")) == 2
    assert "config.json: not found" in capsys.readouterr().err


def test_pushed_draft_rounds_tree_width_and_drafter_reach_the_engine_and_stay_lossless(
    smollm2, reveal_drafter, monkeypatch
):
    policy = parse_policy_text(POLICY_YAML + "head: {max_draft_rounds: 2}\nlookup: {accept: 0.7}\n")
    engine = ReferenceEngine(smollm2, reveal_drafter, EngineConfig(max_batch_size=4))
    rounds_run = []
    real_draft = engine._draft
    monkeypatch.setattr(
        engine,
        "_draft",
        lambda lanes, budget, rounds, width, lookup, sizer, acceptance: (
            rounds_run.append((rounds, width, lookup, acceptance))
            or real_draft(lanes, budget, rounds, width, lookup, sizer, acceptance)
        ),
    )
    ids = smollm2.tokenizer(PROMPTS[0])["input_ids"]
    payload = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
    with JetspecServer(engine, policy, ADMIN_KEY) as server:
        assert generate(server.url, payload)[0] == 200 and set(rounds_run) == {
            (0, 8, None, "match")
        }  # the YAML defaults
        rounds_run.clear()
        pushed = {
            **table(8, 4),
            "jetspec_policy.bs1.draft_rounds": 2,
            "jetspec_policy.bs1.tree_width": 3,
            "jetspec_policy.bs1.drafter": 1,
            "jetspec_policy.bs1.sampled_children": 1,
        }
        assert push(server.url, pushed) == (200, [True])
        assert {
            k: readback(server.url)["table"]["cohorts"][0][k]
            for k in ("draft_rounds", "tree_width", "drafter", "sampled_children")
        } == {"draft_rounds": 2, "tree_width": 3, "drafter": "hybrid", "sampled_children": "drawn"}
        status, out = generate(server.url, payload)
        status_bad, bad = push(server.url, {**table(8, 4), "jetspec_policy.bs1.draft_rounds": 3})
    # the hybrid cohort merges prompt lookup with the policy's calibration
    assert status == 200 and set(rounds_run) == {(2, 3, LookupMerge(math.log(0.7), 1, 4), "draw")}
    reference = ReferenceEngine(smollm2, None).generate([Request(ids, SamplingParams(max_new_tokens=8))], budget=0)[0]
    assert out["output_ids"] == reference.output_ids
    assert (
        status_bad == 400
        and "draft_rounds 3 is above the server policy's head.max_draft_rounds 2" in bad["problems"][0]
    )


def test_serve_refuses_draft_rounds_for_a_marginal_only_head(tmp_path, smollm2_dir, capsys):
    policy = tmp_path / "rounds.yaml"
    policy.write_text(POLICY_YAML + "head: {max_draft_rounds: 1}\n")
    assert serve(smollm2_dir, policy) == 2  # the shipped head drafts per-depth marginals only
    assert "head.max_draft_rounds is 1 but head" in capsys.readouterr().err


def test_the_reference_server_runs_the_same_allocation_control_losslessly_and_never_under_a_seed(
    smollm2, untrained_drafter
):
    """Blocks of 2 steps, every second native until a decision: a greedy request's steps run both modes
    (budget 0 counted under the cohort), its tokens the autoregressive ones; /server_info shows the
    control's state; a seeded sampled request's steps all run the table's budget."""
    policy = parse_policy_text(POLICY_YAML + "same_allocation: {block_steps: 2, explore_every: 2}\n")
    engine = ReferenceEngine(smollm2, untrained_drafter, EngineConfig(max_batch_size=4))
    ids = smollm2.tokenizer(PROMPTS[0])["input_ids"]
    reference = ReferenceEngine(smollm2, None).generate([Request(ids, SamplingParams(max_new_tokens=16))], budget=0)[0]
    with JetspecServer(engine, policy, ADMIN_KEY) as server:
        greedy = {"temperature": 0, "max_new_tokens": 16}
        status, out = generate(server.url, {"input_ids": ids, "sampling_params": greedy})
        steps = metric_samples(server.url)
        status_info, info = call(f"{server.url}/server_info")
        sampling = {"temperature": 0.8, "seed": 3, "max_new_tokens": 12, "ignore_eos": True}
        before = steps.get(("jetspec_steps_total", (("budget", "0"), ("cohort", "bs1"))), 0)
        seeded = generate(server.url, {"input_ids": ids, "sampling_params": sampling})
        after = metric_samples(server.url).get(("jetspec_steps_total", (("budget", "0"), ("cohort", "bs1"))), 0)
    assert status == 200 and out["output_ids"] == reference.output_ids
    assert before >= 1 and steps[("jetspec_steps_total", (("budget", "4"), ("cohort", "bs1")))] >= 1
    state = info["internal_states"][0]["jetspec_same_allocation"]
    assert status_info == 200 and state["bs1"]["mode"] in ("speculative", "native") and state["bs2-4"]["mode"] is None
    assert seeded[0] == 200 and after == before  # no native step under a seed
    alone = ReferenceEngine(smollm2, untrained_drafter).generate([Request(ids, SamplingParams(**sampling))], budget=4)
    assert seeded[1]["output_ids"] == alone[0].output_ids
