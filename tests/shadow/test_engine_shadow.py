"""End to end on the real reference server and the real SmolLM2 target (fp32, CPU), no mocked target.

A clean speculative run passes the checker (CLI, local reference) with reports, metrics and spans;
the same server with a deliberately broken acceptance (temperature or top-p applied on the draw side
only, via the acceptance module's seams also used by tests/test_acceptance_stat.py) is caught; a
greedy output that is not the target's is classified by margin and shows in the regeneration diff.
"""

from __future__ import annotations

import json

import numpy as np
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sglang_jetspec.cli import main
from shadow.checker import ShadowChecker
from shadow.checks import sorted_processed
from shadow.metrics import ShadowMetrics
from shadow.regenerate import Regenerator
from shadow.target_logits import LocalReference
from shadow.window import WindowReport
from tests.builders import break_target_processing
from tests.shadow.conftest import prompt_bodies, serve_and_spool

CLEAN = [
    {"temperature": 0.0},
    {"temperature": 0.8},
    {"temperature": 1.0, "top_p": 0.9},
    {"temperature": 0.7, "top_k": 20},
]


def _checker(smollm2, alpha=0.001, regenerator=None):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    checker = ShadowChecker(
        LocalReference(smollm2), alpha, ShadowMetrics(), provider.get_tracer("jetspec.shadow"), regenerator=regenerator
    )
    return checker, exporter


def test_clean_speculative_run_passes_with_reports_and_metrics(engine, spool_policy, smollm2, tmp_path, capsys):
    spool, out = tmp_path / "spool", tmp_path / "reports"
    records = serve_and_spool(engine, spool_policy, spool, prompt_bodies(smollm2.tokenizer, CLEAN))
    assert len(records) == 4
    assert all(
        r.spec.budgets and set(r.spec.budgets) == {8} and len(r.spec.budgets) == len(r.spec.accept_lengths)
        for r in records
    )
    # the spool holds each request's own sampling configuration
    assert sorted((r.sampling.temperature, r.sampling.top_p, r.sampling.top_k) for r in records) == [
        (0.0, 1.0, -1),
        (0.7, 1.0, 20),
        (0.8, 1.0, -1),
        (1.0, 0.9, -1),
    ]

    code = main(
        [
            "shadow",
            "run",
            "--spool",
            str(spool),
            "--reference",
            "local",
            "--window",
            "4",
            "--out",
            str(out),
            "--alpha",
            "0.001",
        ]
    )
    assert code == 0, capsys.readouterr()
    report = WindowReport.model_validate_json((out / "window-0001.json").read_text())
    assert not report.alarm and report.alarm_reasons == []
    assert (report.requests.greedy, report.requests.sampled) == (1, 3)
    assert report.tokens.sampled == 96 and len(report.pit_values) == 96
    assert report.mismatches["error"] == 0 and report.mismatches["impossible"] == 0
    assert {t.name for t in report.tests} == {"ks", "chi2"} and all(t.p_holm >= 0.001 for t in report.tests)
    steps = [(b, n) for r in records for b, n in zip(r.spec.budgets, r.spec.accept_lengths)]
    assert report.acceptance_by_depth[0] == sum(n >= 2 for _, n in steps) / len(steps)
    html = (out / "window-0001.html").read_text()
    assert html.count('src="data:image/png;base64,') == 3
    prom = (out / "shadow.prom").read_text()
    assert 'jetspec_shadow_tokens_checked_total{mode="sampled"} 96.0' in prom
    assert 'jetspec_shadow_requests_checked_total{mode="greedy"} 1.0' in prom
    assert "jetspec_shadow_alarm 0.0" in prom
    state = json.loads((out / "state.json").read_text())
    assert state["next_window"] == 2 and state["monitor"]["state"]["tokens"] == 96

    # a second run finds nothing new: no window, the evidence is kept
    assert main(["shadow", "run", "--spool", str(spool), "--reference", "local", "--out", str(out)]) == 0
    assert not (out / "window-0002.json").exists()


def top_rank_shortfall(reference, records) -> float:
    """(expected - observed) count of emitted tokens at rank 0 of the request's processed distribution, in
    standard deviations of that count when every token is drawn from it."""
    top_mass, at_top = [], []
    for record in records:
        sorted_p, order = sorted_processed(reference.score(record).logits, record.sampling.params())
        top_mass.append(sorted_p[:, 0])
        at_top.append(order[:, 0] == np.asarray(record.output_ids))
    p, hit = np.concatenate(top_mass), np.concatenate(at_top)
    return float((p.sum() - hit.sum()) / np.sqrt((p * (1 - p)).sum()))


def test_temperature_on_one_side_only_is_caught(engine, spool_policy, smollm2, tmp_path, monkeypatch):
    # The engine draws at temperature 1 whatever the request asked: the request's own T=0.5 is ignored.
    break_target_processing(monkeypatch, temperature=1.0)
    # Seeded requests: the same draws in every run, whatever ran on the engine before.
    sampling = [{"temperature": 0.5, "seed": i} for i in range(4)]
    records = serve_and_spool(engine, spool_policy, tmp_path, prompt_bodies(smollm2.tokenizer, sampling))
    checker, spans = _checker(smollm2)
    report = checker.check_window(1, records)
    assert report.alarm and "window_test" in report.alarm_reasons
    assert min(t.p_holm for t in report.tests) < 1e-3
    assert len(spans.get_finished_spans()) == 4
    span = spans.get_finished_spans()[0]
    assert span.name == "jetspec.shadow.check" and span.attributes["jetspec.shadow.mode"] == "sampled"
    # Tokens drawn too flat sit further down the descending order: fewer emitted tokens are the request's
    # likeliest than its distribution expects. The count's shortfall in standard deviations under the right
    # sampler (a sum of Bernoullis, one per token) is the direction's evidence; a flat mean-PIT threshold was
    # not (over 128 unseeded draws it crossed 0.55 from run to run; the shortfall was 4.4-9.2).
    assert top_rank_shortfall(LocalReference(smollm2), records) > 3


def test_top_p_on_one_side_only_is_caught(engine, spool_policy, smollm2, tmp_path, monkeypatch):
    break_target_processing(monkeypatch, top_p=1.0)
    records = serve_and_spool(
        engine, spool_policy, tmp_path, prompt_bodies(smollm2.tokenizer, [{"temperature": 1.0, "top_p": 0.5}] * 4)
    )
    checker, _ = _checker(smollm2)
    report = checker.check_window(1, records)
    assert report.mismatches["impossible"] > 0 and "impossible_token" in report.alarm_reasons
    assert checker.monitor.crossed and "sequential" in report.alarm_reasons
    assert checker.metrics.registry.get_sample_value("jetspec_shadow_mismatches_total", {"kind": "error"}) > 0


def test_greedy_divergence_classified_and_regenerated(engine, spool_policy, smollm2, tmp_path):
    from sglang_jetspec.serving.server import JetspecServer

    records = serve_and_spool(
        engine, spool_policy, tmp_path / "spool", prompt_bodies(smollm2.tokenizer, [{"temperature": 0.0}] * 2, 24)
    )
    good, bad = records
    # A server that emitted the runner-up at position 5 (and continued from there).
    logits = LocalReference(smollm2).score(bad).logits
    runner_up, original = int(logits[5].topk(2).indices[1]), bad.output_ids[5]
    bad = bad.model_copy(update={"output_ids": bad.output_ids[:5] + [runner_up] + bad.output_ids[6:]})
    with JetspecServer(
        engine, spool_policy.model_copy(update={"cohorts": [spool_policy.cohorts[0].model_copy(update={"default": 0})]})
    ) as plain:
        checker, _ = _checker(smollm2, regenerator=Regenerator(plain.url, smollm2.tokenizer))
        report = checker.check_window(1, [good, bad])
    assert report.first_divergence == {bad.request_id: 5}
    row = next(m for m in report.mismatch_rows if m.position == 5)
    assert (row.kind, row.emitted, row.expected) == ("error", runner_up, original)
    assert row.margin > 0.05 and "greedy_error" in report.alarm_reasons
    regen = {r.request_id: r.first_difference for r in report.regeneration}
    assert regen == {good.request_id: None, bad.request_id: 5}
