"""Telemetry parsing, counter deltas (with resets) and the goodput estimator, on hand-computed numbers."""

from __future__ import annotations

import json
import math
import urllib.parse

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from controller.estimator import GoodputEstimator
from controller.telemetry import CounterDeltas, PrometheusApiSource, ScrapeSource, Usage, parse_counters
from policies.confidence import t_critical


def worker_page(values: dict[tuple[str, str], tuple[float, float, float]]) -> str:
    """A /metrics page rendered by prometheus_client, as the worker renders it, plus noise."""
    registry = CollectorRegistry()
    counters = {
        name: Counter(f"jetspec_{name}", name, ["cohort", "budget"], registry=registry)
        for name in ("steps", "committed_tokens", "request_seconds")
    }
    Gauge("jetspec_policy_generation", "generation", registry=registry).set(3)
    Counter("sglang_prompt_tokens", "unrelated", ["model"], registry=registry).labels("m").inc(99)
    for (cohort, budget), (steps, tokens, seconds) in values.items():
        counters["steps"].labels(cohort, budget).inc(steps)
        counters["committed_tokens"].labels(cohort, budget).inc(tokens)
        counters["request_seconds"].labels(cohort, budget).inc(seconds)
    return generate_latest(registry).decode()


def test_parse_counters_reads_only_jetspec_counters():
    page = worker_page({("bs1", "16"): (5, 100, 10.0), ("bs2-8", "0"): (2, 8, 4.0)})
    assert parse_counters(page) == {
        ("steps", ("bs1", 16)): 5.0,
        ("committed_tokens", ("bs1", 16)): 100.0,
        ("request_seconds", ("bs1", 16)): 10.0,
        ("steps", ("bs2-8", 0)): 2.0,
        ("committed_tokens", ("bs2-8", 0)): 8.0,
        ("request_seconds", ("bs2-8", 0)): 4.0,
    }


def test_counter_deltas_survive_a_reset():
    deltas = CounterDeltas()
    key = ("bs1", 16)

    def scrape(steps, tokens, seconds):
        return {("steps", key): steps, ("committed_tokens", key): tokens, ("request_seconds", key): seconds}

    assert deltas.update(scrape(5, 100, 10)) is None  # first read: baseline only
    assert deltas.update(scrape(8, 160, 16)) == {key: Usage(3, 60, 6)}
    # The worker restarted: counters went down, so everything they show is new.
    assert deltas.update(scrape(1, 20, 2)) == {key: Usage(1, 20, 2)}
    # A series that appears later started at zero.
    later = scrape(2, 30, 3) | {
        ("steps", ("bs1", 64)): 1,
        ("committed_tokens", ("bs1", 64)): 9,
        ("request_seconds", ("bs1", 64)): 0.5,
    }
    assert deltas.update(later) == {key: Usage(1, 10, 1), ("bs1", 64): Usage(1, 9, 0.5)}


def test_scrape_source_sums_servers_and_skips_failures():
    pages = {
        "http://a": [worker_page({("bs1", "16"): (1, 10, 1)}), worker_page({("bs1", "16"): (3, 40, 4)})],
        "http://b": [worker_page({("bs1", "16"): (2, 20, 2)}), None],
    }

    def transport(method, url, headers, body, timeout):
        server = url.removesuffix("/metrics")
        page = pages[server].pop(0)
        if page is None:
            raise ConnectionError("refused")
        return 200, page.encode()

    source = ScrapeSource(["http://a", "http://b"], transport)
    assert source.read().usage is None
    reading = source.read()
    assert reading.usage == {("bs1", 16): Usage(2, 30, 3)}
    assert reading.failed == ["http://b"]


def test_prometheus_api_source_queries_increase_over_the_interval():
    seen = []
    answers = {"jetspec_steps_total": 12, "jetspec_committed_tokens_total": 48, "jetspec_request_seconds_total": 6}

    def transport(method, url, headers, body, timeout):
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["query"][0]
        seen.append(query)
        metric = query.split("increase(")[1].split("[")[0]
        result = [{"metric": {"cohort": "bs1", "budget": "16"}, "value": [1700000000, str(answers[metric])]}]
        return 200, json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()

    source = PrometheusApiSource("http://prom:9090/", 10, transport)
    assert source.read().usage == {("bs1", 16): Usage(12, 48, 6)}
    assert seen[0] == "sum by (cohort, budget) (increase(jetspec_steps_total[10s]))"


def test_prometheus_api_failure_is_reported():
    source = PrometheusApiSource("http://prom:9090", 10, lambda *a: (503, b'{"status": "error"}'))
    reading = source.read()
    assert reading.usage == {} and reading.failed == ["http://prom:9090"]


def test_ratio_estimate_and_standard_error_by_hand():
    est = GoodputEstimator(window_s=300)
    est.add(10, {("bs1", 16): Usage(steps=5, committed_tokens=10, request_seconds=2)})
    est.add(20, {("bs1", 16): Usage(steps=5, committed_tokens=30, request_seconds=4)})
    e = est.estimates()[("bs1", 16)]
    # R = 40/6; residuals -10/3 and +10/3; se = sqrt((200/9) / 2) / 3
    assert e.goodput == pytest.approx(40 / 6)
    assert e.stderr == pytest.approx(math.sqrt(200 / 9 / 2) / 3)
    assert (e.samples, e.steps, e.latest) == (2, 10, 20)


def test_estimates_from_counters_across_a_reset():
    deltas, est = CounterDeltas(), GoodputEstimator(window_s=300)
    key = ("bs1", 16)
    for t, (tokens, seconds) in enumerate([(100, 10), (160, 16), (20, 2)]):  # last one: reset
        usage = deltas.update(
            {("steps", key): 1 + t, ("committed_tokens", key): tokens, ("request_seconds", key): seconds}
        )
        if usage is not None:
            est.add(10.0 * t, usage)
    e = est.estimates()[key]
    assert (e.goodput, e.stderr, e.samples) == (10.0, 0.0, 2)  # (60 + 20) / (6 + 2), both exactly 10


def test_window_drops_old_samples_and_single_sample_has_infinite_error():
    est = GoodputEstimator(window_s=30)
    est.add(0, {("bs1", 0): Usage(1, 10, 1)})
    est.add(20, {("bs1", 0): Usage(1, 20, 1)})
    est.add(40, {("bs1", 0): Usage(1, 30, 1)})
    e = est.estimates()[("bs1", 0)]
    assert (e.goodput, e.samples) == (25.0, 2)
    est.add(75, {})
    assert est.estimates() == {}
    est.add(80, {("bs1", 0): Usage(1, 30, 1)})
    assert est.estimates()[("bs1", 0)].stderr == math.inf


def test_paired_comparison_by_hand():
    est = GoodputEstimator(window_s=300)
    est.add(10, {("c", 8): Usage(1, 12, 2), ("c", 0): Usage(1, 10, 2)})
    est.add(20, {("c", 8): Usage(1, 30, 3), ("c", 0): Usage(1, 20, 2)})
    est.add(30, {("c", 8): Usage(1, 99, 1)})  # no off sample: not paired
    cmp = est.compare(("c", 8), ("c", 0))
    # R_a = 42/5, R_b = 30/4; e_1 = -4.8/42 + 5/30, e_2 = -e_1; var = 2 * 2 * e_1^2
    e1 = -4.8 / 42 + 5 / 30
    assert cmp.ratio == pytest.approx((42 / 5) / (30 / 4))
    assert cmp.log_stderr == pytest.approx(math.sqrt(4 * e1 * e1))
    assert cmp.samples == 2
    assert est.compare(("c", 8), ("c", 4)) is None


def test_confidence_uses_student_t_for_few_intervals():
    assert t_critical(2.0, 2) == pytest.approx(4.527, abs=0.001)  # t(2 dof) at 97.72%
    assert t_critical(2.0, 10_000) == pytest.approx(2.0, abs=0.01)
