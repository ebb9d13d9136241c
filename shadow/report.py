"""Window reports on disk: `window-NNNN.json` (WindowReport) and a self-contained `window-NNNN.html`
whose plots (PIT histogram, QQ plot, acceptance by depth) are PNGs embedded as base64."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (backend first)
import numpy as np  # noqa: E402

from shadow.window import WindowReport  # noqa: E402


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _pit_histogram(report: WindowReport) -> str:
    fig, ax = plt.subplots(figsize=(4.5, 3))
    counts = np.asarray(report.pit_histogram)
    edges = np.linspace(0, 1, len(counts) + 1)
    ax.bar(edges[:-1], counts, width=edges[1] - edges[0], align="edge", edgecolor="white")
    ax.axhline(counts.sum() / len(counts), color="black", linestyle="--", label="uniform")
    ax.set(title="PIT histogram (sampled tokens)", xlabel="u", ylabel="tokens")
    ax.legend()
    return _png(fig)


def _qq(report: WindowReport) -> str:
    fig, ax = plt.subplots(figsize=(3.5, 3.5))
    u = np.sort(np.asarray(report.pit_values))
    if len(u):
        ax.plot((np.arange(1, len(u) + 1) - 0.5) / len(u), u, ".", markersize=3)
    ax.plot([0, 1], [0, 1], "k--")
    ax.set(title="QQ plot vs Uniform(0, 1)", xlabel="uniform quantile", ylabel="PIT quantile")
    return _png(fig)


def _acceptance(report: WindowReport) -> str:
    fig, ax = plt.subplots(figsize=(4.5, 3))
    depths = np.arange(1, len(report.acceptance_by_depth) + 1)
    ax.bar(depths, report.acceptance_by_depth)
    ax.set(title="acceptance by depth", xlabel="depth d", ylabel="share of steps accepting >= d", ylim=(0, 1))
    return _png(fig)


def _table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(report: WindowReport) -> str:
    status = "ALARM: " + ", ".join(report.alarm_reasons) if report.alarm else "no alarm"
    tests = _table(
        ["test", "statistic", "p", "p (Holm)", "rejected"],
        [[t.name, f"{t.statistic:.4g}", f"{t.p_value:.3g}", f"{t.p_holm:.3g}", t.rejected] for t in report.tests],
    )
    seq = report.sequential
    mismatches = _table(
        ["request", "position", "emitted", "target argmax", "margin (nats)", "kind"],
        [
            [m.request_id, m.position, m.emitted, m.expected, "-" if m.margin is None else f"{m.margin:.4g}", m.kind]
            for m in report.mismatch_rows
        ],
    )
    regen = _table(
        ["request", "first difference", "original", "regenerated"],
        [
            [
                r.request_id,
                r.first_difference,
                r.original_text or r.original_ids,
                r.regenerated_text or r.regenerated_ids,
            ]
            for r in report.regeneration
        ],
    )
    images = "".join(
        f'<img alt="{name}" src="data:image/png;base64,{data}">'
        for name, data in (
            ("pit histogram", _pit_histogram(report)),
            ("qq plot", _qq(report)),
            ("acceptance by depth", _acceptance(report)),
        )
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>jetspec shadow window {report.window}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:3px 8px;font-size:90%}} .alarm{{color:#b00;font-weight:bold}}</style></head>
<body><h1>Shadow verification, window {report.window}</h1>
<p class="{"alarm" if report.alarm else ""}">{html.escape(status)}</p>
<p>reference {html.escape(report.reference)}; alpha {report.alpha}; tie margin {report.tie_margin} nats;
requests greedy {report.requests.greedy} / sampled {report.requests.sampled};
tokens greedy {report.tokens.greedy} / sampled {report.tokens.sampled};
mismatches {html.escape(str(report.mismatches))}; failed {len(report.failed)};
truncated reference rows {report.incomplete_reference}</p>
<h2>Sampled tokens</h2>{tests}
<p>sequential (betting e-process): {seq.tokens} tokens, log evidence {seq.log_evidence:.3f} of threshold
{seq.threshold:.3f}, anytime p {seq.p_value:.3g}, crossed at {seq.crossed_at}</p>
<div>{images}</div>
<h2>Mismatches</h2>{mismatches}
<p>first divergence: {html.escape(str(report.first_divergence))}</p>
<h2>Regeneration</h2>{regen}
</body></html>
"""


def write_report(report: WindowReport, out_dir: str | Path) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"window-{report.window:04d}"
    json_path, html_path = stem.with_suffix(".json"), stem.with_suffix(".html")
    json_path.write_text(report.model_dump_json(indent=1))
    html_path.write_text(render_html(report))
    return json_path, html_path
