"""Operating JETSPEC in the real SGLang server: policy pushes through SGLang's own /set_internal_state
and /server_info (admin key, refusals, TTL), budget 0 as ordinary decoding, /metrics from the
scheduler process, `jetspec.step` spans over OTLP, and the controller process driving the server."""

from __future__ import annotations

import time

import pytest
from e2e_client import ADMIN_KEY, HEAD, POLICY_YAML, generate, get, jetspec_state, post, samples, steps_at, until_eos
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from harness.serve import start_controller
from policies.control_api import flat_type_problems, table_from_flat_args
from policies.head import read_head_capacity
from policies.loader import parse_policy_text
from policies.problems import PolicyError
from policies.schema import DRAFTERS, TREE_SIZINGS
from tests.policies.push_strategies import broken_tables, valid_tables

AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}


def push(url: str, budgets: dict[str, int], ttl_s: float, headers: dict | None = AUTH) -> tuple[int, object]:
    """(status, reply): SGLang answers an authorised push with one `updated` flag per rank, [true] or [false]."""
    flat = {"jetspec_policy.ttl_s": ttl_s, **{f"jetspec_policy.{c}.budget": b for c, b in budgets.items()}}
    return post(f"{url}/set_internal_state", {"server_args": flat}, headers)


def budgets_in_force(url: str) -> tuple[str, dict[str, int]]:
    policy = jetspec_state(url)["jetspec_policy"]
    return policy["source"], {c["name"]: c["budget"] for c in policy["table"]["cohorts"]}


def wait_for_yaml(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while budgets_in_force(url)[0] != "yaml":
        assert time.monotonic() < deadline, "the pushed table did not expire"
        time.sleep(0.5)


@pytest.fixture()
def yaml_policy_after(jetspec_server):
    """Every push in a test expires before the next test (short TTLs), so later tests see the YAML table."""
    yield jetspec_server.url
    wait_for_yaml(jetspec_server.url)


def test_push_readback_refusals_and_ttl_expiry(yaml_policy_after, plain_server, humaneval_ids):
    url = yaml_policy_after
    assert budgets_in_force(url) == ("yaml", {"bs1": 16, "bs2-4": 16})

    status, _ = push(url, {"bs1": 4, "bs2-4": 0}, 30, headers={})
    assert status in (401, 403)  # no admin key: SGLang's middleware refuses before the scheduler sees it
    status, _ = push(url, {"bs1": 4, "bs2-4": 0}, 30, headers={"Authorization": "Bearer wrong"})
    assert status in (401, 403)
    assert budgets_in_force(url)[0] == "yaml"

    status, reply = push(url, {"bs1": 4, "bs2-4": 0}, 12)  # long enough for two short generations below
    assert status == 200 and reply == [True], reply
    generation = jetspec_state(url)["jetspec_policy"]["generation"]
    assert budgets_in_force(url) == ("pushed", {"bs1": 4, "bs2-4": 0})

    status, reply = push(url, {"bs1": 5, "bs2-4": 0}, 12)  # 5 is not among bs1's budgets
    assert status == 200 and reply == [False], reply
    assert budgets_in_force(url) == ("pushed", {"bs1": 4, "bs2-4": 0})  # the old table stays whole
    assert jetspec_state(url)["jetspec_policy"]["generation"] == generation

    before = steps_at(url, "bs1", 4)
    # fewer nodes than the server was sized for (its largest budget, 16): the CPU backend must verify 4
    assert (
        generate(url, humaneval_ids[0], 8)["output_ids"]
        == generate(plain_server.url, humaneval_ids[0], 8)["output_ids"]
    )
    assert steps_at(url, "bs1", 4) > before  # the pushed budget is what the steps ran

    wait_for_yaml(url, timeout_s=30)  # TTL expiry reverts to the YAML defaults
    assert budgets_in_force(url) == ("yaml", {"bs1": 16, "bs2-4": 16})


def test_budget_zero_is_ordinary_decoding(yaml_policy_after, plain_server, humaneval_ids, tokenizer):
    url = yaml_policy_after
    status, reply = push(url, {"bs1": 0, "bs2-4": 0}, 6)
    assert status == 200 and reply == [True], reply
    draft_before = sum(samples(url, "jetspec_draft_seconds_total").values())
    off_before = steps_at(url, "bs1", 0)
    spec = generate(url, humaneval_ids[1], 16)
    plain = generate(plain_server.url, humaneval_ids[1], 16)
    eos = tokenizer.eos_token_id
    assert until_eos(spec["output_ids"], eos) == until_eos(plain["output_ids"], eos)
    # one token per step (after the prefill's first), and no draft work at all
    assert spec["meta_info"]["spec_verify_ct"] == spec["meta_info"]["completion_tokens"] - 1
    assert steps_at(url, "bs1", 0) - off_before == spec["meta_info"]["spec_verify_ct"]
    # a grammar request at budget 0 (pushed again: the first push may have expired by now): each
    # ordinary decode step masked as plain SGLang masks it
    assert push(url, {"bs1": 0, "bs2-4": 0}, 6) == (200, [True])
    regex = r"def [a-z_]+\(([a-z_]+(, )?)*\):\n    [ -~\n]*"
    spec = generate(url, humaneval_ids[2], 16, regex=regex)
    assert spec["output_ids"] == generate(plain_server.url, humaneval_ids[2], 16, regex=regex)["output_ids"]
    assert sum(samples(url, "jetspec_draft_seconds_total").values()) == draft_before


def test_a_pushed_hybrid_drafter_looks_up_finished_outputs_and_stays_exact(
    yaml_policy_after, plain_server, humaneval_ids, tokenizer
):
    """The hybrid drafter in the real server: prompt lookup, the shipped head's draft corpus and the
    outputs of requests the worker already finished. The same prompt a second time is then drafted
    from the first answer, so its tokens are accepted many per step, and greedy output stays plain SGLang's."""
    url = yaml_policy_after
    prompt, new = humaneval_ids[2], 24

    def run_with(drafter: str) -> dict:
        flat = {
            "jetspec_policy.ttl_s": 30,
            **{
                f"jetspec_policy.{c}.{field}": value
                for c in ("bs1", "bs2-4")
                for field, value in (("budget", 16), ("drafter", DRAFTERS.index(drafter)))
            },
        }
        status, reply = post(f"{url}/set_internal_state", {"server_args": flat}, AUTH)
        assert status == 200 and reply == [True], reply
        return generate(url, prompt, new, ignore_eos=True)

    plain = generate(plain_server.url, prompt, new, ignore_eos=True)["output_ids"]
    head = run_with("head")
    run_with("hybrid")
    again = run_with("hybrid")
    assert head["output_ids"] == again["output_ids"] == plain
    steps = {name: reply["meta_info"]["spec_verify_ct"] for name, reply in (("head", head), ("hybrid", again))}
    assert steps["hybrid"] <= 6 < steps["head"], steps  # 23 tokens after the prefill's first


def test_a_pushed_adaptive_cohort_verifies_fewer_nodes_than_its_budget_and_stays_exact(
    yaml_policy_after, plain_server, humaneval_ids
):
    """Adaptive tree sizing in the real server: the worker times its own verify passes (an ordinary step,
    then the full tree) and from then on verifies only the nodes that pay; greedy output stays plain SGLang's."""
    url = yaml_policy_after
    flat = {
        "jetspec_policy.ttl_s": 30,
        **{
            f"jetspec_policy.{c}.{field}": value
            for c in ("bs1", "bs2-4")
            for field, value in (("budget", 16), ("tree_sizing", TREE_SIZINGS.index("adaptive")))
        },
    }
    status, reply = post(f"{url}/set_internal_state", {"server_args": flat}, AUTH)
    assert status == 200 and reply == [True], reply
    assert [c["tree_sizing"] for c in jetspec_state(url)["jetspec_policy"]["table"]["cohorts"]] == ["adaptive"] * 2

    def counted(name: str) -> float:
        return sum(v for labels, v in samples(url, name).items() if dict(labels).get("cohort") == "bs1")

    steps_before, nodes_before = counted("jetspec_steps_total"), counted("jetspec_verified_nodes_total")
    spec = generate(url, humaneval_ids[3], 24, ignore_eos=True)
    assert spec["output_ids"] == generate(plain_server.url, humaneval_ids[3], 24, ignore_eos=True)["output_ids"]
    steps = counted("jetspec_steps_total") - steps_before
    nodes = counted("jetspec_verified_nodes_total") - nodes_before
    assert steps == spec["meta_info"]["spec_verify_ct"] and steps >= 3
    # the two probes verify 1 and 16 nodes; sized steps on a CPU, where each node costs, stay below 16
    assert nodes < 16 * steps - 8, (nodes, steps)


SERVER_HEAD = read_head_capacity(HEAD)
SERVER_POLICY = parse_policy_text(POLICY_YAML, head=SERVER_HEAD)
SHORT_TTL = st.floats(min_value=0.5, max_value=2.0)  # every accepted push expires within the test


def _expected_table(flat: dict) -> dict | None:
    try:
        return table_from_flat_args(flat, SERVER_POLICY, SERVER_HEAD).model_dump(mode="json")
    except PolicyError:
        return None


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    flat=st.one_of(
        valid_tables(SERVER_POLICY, SERVER_HEAD, SHORT_TTL),
        broken_tables(SERVER_POLICY, SERVER_HEAD, ttl_s=SHORT_TTL),
    )
)
def test_generated_pushes_never_take_the_server_down(yaml_policy_after, flat):
    """Fuzz of SGLang's /set_internal_state (a fixed seed): the server answers every push, applies exactly
    the valid tables and reads back what it applied; a value of the wrong JSON type is refused with 400
    before SGLang converts it, any other refused push answers [false] with its reasons on /server_info; a
    refused push leaves the table in force as it was.
    (The fixture runs once around all examples: the last push expires before the next test.)"""
    url = yaml_policy_after
    before = jetspec_state(url)["jetspec_policy"]
    status, reply = post(f"{url}/set_internal_state", {"server_args": flat}, AUTH)
    state = jetspec_state(url)  # the server is alive
    after = state["jetspec_policy"]
    expected = _expected_table(flat)
    if flat_type_problems(flat):
        assert status == 400 and reply["problems"], (flat, reply)
    elif expected is None:
        assert (status, reply) == (200, [False]), (flat, reply)
        assert state["jetspec_last_refused_push"]["problems"], state  # why, for the caller
    else:
        assert (status, reply) == (200, [True]), (flat, reply)
        assert after["source"] == "pushed" and after["table"] == expected
    if expected is None:
        if before["source"] == "pushed" and after["generation"] == before["generation"]:
            assert after["table"] == before["table"]
        assert after["generation"] - before["generation"] <= 1  # at most an expiry, never this push


@pytest.mark.parametrize(
    "key, value, answer",
    [
        ("jetspec_policy.bs1.drafter", 1.0, 400),  # once DRAFTERS[1.0]: a TypeError that killed the scheduler
        ("jetspec_policy.bs1.tree_sizing", 1.0, 400),
        ("jetspec_policy.bs1.tree_width", 1_000_000, [False]),
        ("jetspec_policy.ttl_s", 1e308, [False]),
        # SGLang's own request type (Dict[str, int | float], lax) would turn these into integers before the
        # scheduler sees them; the plugin's check of the raw body refuses them first
        ("jetspec_policy.bs1.budget", "4", 400),
        ("jetspec_policy.bs1.drafter", True, 400),
        ("jetspec_policy.bs1.tree_sizing", False, 400),
        ("jetspec_policy.ttl_s", "90", 400),
        ("jetspec_policy.bs1.budget", 4, [True]),
    ],
)
def test_hostile_values_from_a_probe(yaml_policy_after, key, value, answer):
    url = yaml_policy_after
    flat = {"jetspec_policy.ttl_s": 2.0, "jetspec_policy.bs1.budget": 16, "jetspec_policy.bs2-4.budget": 16, key: value}
    status, reply = post(f"{url}/set_internal_state", {"server_args": flat}, AUTH)
    if answer == 400:
        assert status == 400 and any(key in problem for problem in reply["problems"]), reply
    else:
        assert (status, reply) == (200, answer), reply
    if answer == [False]:  # SGLang's answer carries no reasons: /server_info does
        assert any(key.rpartition(".")[2] in p for p in jetspec_state(url)["jetspec_last_refused_push"]["problems"])
    assert budgets_in_force(url)[0] == ("pushed" if answer == [True] else "yaml")


def test_a_push_of_ten_thousand_keys_is_one_refusal_and_one_log_line(yaml_policy_after, jetspec_server):
    url = yaml_policy_after
    flat = {"jetspec_policy.ttl_s": 2.0, **{f"jetspec_policy.c{i}.budget": 4 for i in range(10_000)}}
    log_before = jetspec_server.log.read_text().count("rejected jetspec_policy push")
    assert post(f"{url}/set_internal_state", {"server_args": flat}, AUTH) == (200, [False])
    assert budgets_in_force(url)[0] == "yaml"
    assert jetspec_server.log.read_text().count("rejected jetspec_policy push") == log_before + 1


def _gauge(url: str, name: str) -> float:
    return sum(samples(url, name).values())


def _eventually(check, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_gauges_tell_the_truth_while_the_server_idles(yaml_policy_after, humaneval_ids):
    """No step runs on an idle server: a finished request and an expired push must still show."""
    url = yaml_policy_after
    generate(url, humaneval_ids[2], 8)
    _eventually(lambda: _gauge(url, "jetspec_live_draft_states") == 0)  # once stuck at the last step's count
    assert push(url, {"bs1": 4, "bs2-4": 0}, 3.0)[1] == [True]
    _eventually(lambda: _gauge(url, "jetspec_policy_expiry_timestamp_seconds") > 0)
    _eventually(lambda: _gauge(url, "jetspec_policy_expiry_timestamp_seconds") == 0)  # expired with no step run
    assert _gauge(url, "jetspec_policy_generation") == jetspec_state(url)["jetspec_policy"]["generation"]


def test_metrics_from_the_scheduler_process(jetspec_server, humaneval_ids):
    generate(jetspec_server.url, humaneval_ids[2], 8)
    names = {family.name for family in text_string_to_metric_families(get(f"{jetspec_server.url}/metrics"))}
    for family in (
        "jetspec_steps",
        "jetspec_committed_tokens",
        "jetspec_verify_seconds",
        "jetspec_accept_length",
        "jetspec_policy_budget",
        "jetspec_live_draft_states",
    ):
        assert family in names, sorted(n for n in names if n.startswith("jetspec"))
    assert {"sglang:spec_accept_length", "sglang:spec_accept_rate"} <= names, sorted(n for n in names if "spec" in n)
    assert steps_at(jetspec_server.url, "bs1", 16) > 0


def test_step_spans_reach_an_otlp_receiver(jetspec_server, trace_receiver, humaneval_ids):
    reply = generate(jetspec_server.url, humaneval_ids[3], 8)
    rid = reply["meta_info"]["id"]
    # spans leave in export batches: earlier requests' steps can arrive before this one's, so wait for ours
    deadline = time.monotonic() + 30
    while True:
        spans = trace_receiver.spans()
        steps = [s for s in spans if s.name == "jetspec.step"]
        ours = [s for s in steps if any(a.key == "jetspec.request_ids" and rid in str(a.value) for a in s.attributes)]
        if ours or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert steps, sorted({s.name for s in spans})
    assert ours
    children = {s.name for s in spans if s.parent_span_id == ours[-1].span_id}
    assert children == {"jetspec.draft", "jetspec.tree", "jetspec.verify", "jetspec.accept", "jetspec.commit"}


def test_controller_reads_metrics_and_pushes_a_table_the_steps_use(
    yaml_policy_after, policy_file, humaneval_ids, tmp_path
):
    """`python -m controller` against the real server: it reads /metrics and /server_info, measures bs1 and
    pushes a table; with the controller stopped, the server's next steps run exactly that table's budget
    (or its probe budget) until the table expires."""
    url = yaml_policy_after
    env = {"JETSPEC_E2E_ADMIN": ADMIN_KEY}
    controller = start_controller(policy_file, [url], "JETSPEC_E2E_ADMIN", tmp_path, "--max-intervals", "20", env=env)
    try:
        before = jetspec_state(url)["jetspec_policy"]["generation"]
        deadline = time.monotonic() + 90
        while True:
            generate(url, humaneval_ids[4], 12)  # load at batch 1 for the controller to measure
            state = jetspec_state(url)["jetspec_policy"]
            if state["source"] == "pushed" and state["generation"] > before:
                break
            assert controller.popen.poll() is None and time.monotonic() < deadline, controller.log_tail()
    finally:
        controller.stop()
    state = jetspec_state(url)["jetspec_policy"]  # the last table it pushed, in force for its TTL
    assert state["source"] == "pushed", "the pushed table expired before it could be checked"
    bs1 = next(c for c in state["table"]["cohorts"] if c["name"] == "bs1")
    allowed = {bs1["budget"]} | ({bs1["probe"]["budget"]} if bs1["probe"] else set())
    counts = {b: steps_at(url, "bs1", b) for b in (0, 4, 16)}
    generate(url, humaneval_ids[5], 8)
    ran = {b for b in counts if steps_at(url, "bs1", b) > counts[b]}
    assert ran and ran <= allowed, (ran, bs1)
