"""Worker telemetry: what the worker exports is what the controller reads.

Real StepRecords (SmolLM2, untrained head) -> JetspecMetrics -> Prometheus text -> the controller's
own scrape parser and estimator -> goodput per (cohort, budget) equal to the hand-computed value.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict

import pytest
from ops_support import REPO
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.estimator import GoodputEstimator
from controller.telemetry import COUNTERS, ScrapeSource, Usage, parse_counters
from policies import ActivePolicy, parse_policy_text
from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.core.step_record import StepRecord
from sglang_jetspec.observability.metrics import STEP_COUNTERS, JetspecMetrics
from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine, Request

POLICY = parse_policy_text(
    """\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 8], default: 8}
  - {name: bs2-4, min_batch: 2, max_batch: 4, budgets: [0, 4], default: 0}
controller: {interval_s: 1, ttl_s: 30, window_s: 10, min_samples: 2}
""",
    "telemetry-test.yaml",
)


def cohort_of(batch_size: int) -> str:
    return "bs1" if batch_size == 1 else "bs2-4"


@pytest.fixture(scope="module")
def step_records(smollm2, untrained_drafter) -> list[StepRecord]:
    """Steps of a real run: two requests together at budget 4, then the longer one alone at 0 and 8."""
    engine = ReferenceEngine(smollm2, untrained_drafter, EngineConfig(max_batch_size=2))
    ids = [smollm2.tokenizer(p)["input_ids"] for p in ("def add(a, b):", "The sky is")]
    requests = [
        Request(ids[0], SamplingParams(max_new_tokens=3, ignore_eos=True), "short"),
        Request(ids[1], SamplingParams(max_new_tokens=7, ignore_eos=True), "long"),
    ]
    alone = iter([0, 8, 0, 8, 0, 8])
    records: list[StepRecord] = []
    engine.generate(requests, budget=lambda batch: 4 if batch == 2 else next(alone), on_step=records.append)
    assert {(cohort_of(r.batch_size), r.budget) for r in records} >= {("bs2-4", 4), ("bs1", 0), ("bs1", 8)}
    return records


def page_transport(registry: CollectorRegistry):
    """A transport answering every GET /metrics with the registry's current page."""
    return lambda method, url, headers, body, timeout: (200, generate_latest(registry))


def test_controller_reads_the_goodput_of_real_steps(step_records):
    registry = CollectorRegistry()
    metrics = JetspecMetrics(registry)
    source = ScrapeSource(["http://worker"], page_transport(registry))
    assert source.read().usage is None  # the first scrape is the counters' baseline
    expected: dict[tuple[str, int], Usage] = defaultdict(Usage)
    for record in step_records:
        metrics.record_step(cohort_of(record.batch_size), record)
        expected[(cohort_of(record.batch_size), record.budget)] += Usage(
            steps=1, committed_tokens=record.committed_tokens, request_seconds=record.batch_size * record.wall_s
        )

    reading = source.read()
    assert not reading.failed
    assert set(reading.usage) == set(expected)
    estimator = GoodputEstimator(window_s=60)
    estimator.add(1.0, reading.usage)
    for key, usage in expected.items():
        got = reading.usage[key]
        assert got.steps == usage.steps and got.committed_tokens == usage.committed_tokens
        assert got.request_seconds == pytest.approx(usage.request_seconds, rel=1e-12)
        assert estimator.estimates()[key].goodput == pytest.approx(
            usage.committed_tokens / usage.request_seconds, rel=1e-12
        )


def test_every_counter_and_the_accept_length_histogram_add_up(step_records):
    registry = CollectorRegistry()
    metrics = JetspecMetrics(registry)
    for record in step_records:
        metrics.record_step(cohort_of(record.batch_size), record)
    samples = {
        (s.name, s.labels.get("cohort"), s.labels.get("budget"), s.labels.get("le")): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    assert set(COUNTERS.values()) <= set(STEP_COUNTERS)  # the controller reads a subset of ours
    by_key = defaultdict(list)
    for record in step_records:
        by_key[(cohort_of(record.batch_size), str(record.budget))].append(record)
    for (cohort, budget), records in by_key.items():

        def total(name):
            return samples[(name, cohort, budget, None)]

        assert total("jetspec_steps_total") == len(records)
        assert total("jetspec_requests_total") == sum(r.batch_size for r in records)
        assert total("jetspec_committed_tokens_total") == sum(r.committed_tokens for r in records)
        for name, field in (
            ("step", "wall_s"),
            ("draft", "draft_s"),
            ("tree", "tree_s"),
            ("verify", "verify_s"),
            ("accept", "accept_s"),
        ):
            assert total(f"jetspec_{name}_seconds_total") == pytest.approx(sum(getattr(r, field) for r in records))
        lengths = [n for r in records for n in r.accept_lengths]
        assert total("jetspec_accept_length_count") == len(lengths)
        assert total("jetspec_accept_length_sum") == sum(lengths)
        assert samples[("jetspec_accept_length_bucket", cohort, budget, "1.0")] == lengths.count(1)
    # Budget 0 never drafts; every step of a batch of two is counted once, with two requests.
    assert samples[("jetspec_draft_seconds_total", "bs1", "0", None)] == 0.0


def policy_gauges(registry: CollectorRegistry) -> dict[tuple[str, str | None], float]:
    return {
        (s.name, s.labels.get("cohort")): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name.startswith("jetspec_policy_")
    }


def test_policy_gauges_follow_pushes_and_the_yaml_fallback():
    registry = CollectorRegistry()
    metrics = JetspecMetrics(registry)
    active = ActivePolicy(POLICY)
    metrics.show_policy(active.state(100.0))
    assert policy_gauges(registry) == {
        ("jetspec_policy_budget", "bs1"): 8,
        ("jetspec_policy_budget", "bs2-4"): 0,
        ("jetspec_policy_expiry_timestamp_seconds", None): 0.0,
        ("jetspec_policy_generation", None): 0,
    }
    table = {
        "cohorts": [
            {"name": "bs1", "min_batch": 1, "max_batch": 1, "budget": 4},
            {"name": "bs2-4", "min_batch": 2, "max_batch": 4, "budget": 4},
        ],
        "ttl_s": 30,
    }
    metrics.show_policy(active.apply(table, 100.0))
    gauges = policy_gauges(registry)
    assert gauges[("jetspec_policy_budget", "bs1")] == 4 and gauges[("jetspec_policy_budget", "bs2-4")] == 4
    assert gauges[("jetspec_policy_expiry_timestamp_seconds", None)] == 130.0
    assert gauges[("jetspec_policy_generation", None)] == 1
    metrics.show_policy(active.state(131.0))  # expired: back to the YAML defaults, a new generation
    gauges = policy_gauges(registry)
    assert (
        gauges[("jetspec_policy_budget", "bs1")] == 8 and gauges[("jetspec_policy_expiry_timestamp_seconds", None)] == 0
    )
    assert gauges[("jetspec_policy_generation", None)] == 2


MULTIPROCESS_WRITER = """
import sys, types
from prometheus_client import CollectorRegistry
from policies import ActivePolicy, parse_policy_text
from sglang_jetspec.observability.metrics import JetspecMetrics
metrics = JetspecMetrics(CollectorRegistry())
record = types.SimpleNamespace(batch_size=2, budget=4, committed_tokens=5, accept_lengths=[2, 3],
                               draft_s=0.1, tree_s=0.01, verify_s=0.2, accept_s=0.02, commit_s=0.005, wall_s=0.4,
                               verified_nodes=7)
metrics.record_step("bs2-4", record)
metrics.show_policy(ActivePolicy(parse_policy_text(sys.stdin.read())).state(0.0))
"""


def test_metrics_work_in_prometheus_multiprocess_mode(tmp_path):
    """What SGLang does: worker processes write to PROMETHEUS_MULTIPROC_DIR, the HTTP process merges."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    policy_text = (REPO / "policies" / "default.yaml").read_text()
    for _ in range(2):  # two worker processes
        subprocess.run(
            [sys.executable, "-c", MULTIPROCESS_WRITER], input=policy_text, text=True, env=env, check=True, timeout=120
        )
    merger = (
        "import sys\nfrom prometheus_client import CollectorRegistry, generate_latest\n"
        "from prometheus_client.multiprocess import MultiProcessCollector\n"
        "registry = CollectorRegistry()\nMultiProcessCollector(registry)\n"
        "sys.stdout.write(generate_latest(registry).decode())\n"
    )
    page = subprocess.run(
        [sys.executable, "-c", merger], env=env, capture_output=True, text=True, check=True, timeout=120
    ).stdout
    counters = parse_counters(page)
    assert counters[("steps", ("bs2-4", 4))] == 2
    assert counters[("committed_tokens", ("bs2-4", 4))] == 10
    assert counters[("request_seconds", ("bs2-4", 4))] == pytest.approx(1.6)
    samples = {
        (s.name, s.labels.get("cohort")): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }
    assert samples[("jetspec_accept_length_count", "bs2-4")] == 4
    assert samples[("jetspec_verified_nodes_total", "bs2-4")] == 14
    # "live" gauges drop a process only when SGLang calls mark_process_dead(pid); nobody did here.
    assert samples[("jetspec_policy_budget", "bs1")] == 32  # policies/default.yaml
    assert samples[("jetspec_policy_generation", None)] == 0
