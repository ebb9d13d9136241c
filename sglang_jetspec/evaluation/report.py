"""What `jetspec bench` records mean: per-method summary, markdown report and plot.

Pure functions over the JSON records, so a saved report can be re-rendered without re-running.
"""

from __future__ import annotations

from pathlib import Path

AUTOREGRESSIVE = "autoregressive"  # the method name of each group's budget-0 baseline record


def _groups(records: list[dict]) -> dict[tuple[int, float], list[dict]]:
    """Records by (batch size, temperature), in run order."""
    groups: dict[tuple[int, float], list[dict]] = {}
    for r in records:
        groups.setdefault((r["batch_size"], r["temperature"]), []).append(r)
    return groups


def speculative_by_method(records: list[dict]) -> dict[str, list[dict]]:
    """Speculative records by method, in run order (the autoregressive baseline left out)."""
    methods: dict[str, list[dict]] = {}
    for r in records:
        if r["method"] != AUTOREGRESSIVE:
            methods.setdefault(r["method"], []).append(r)
    return methods


def summarize(records: list[dict]) -> list[dict]:
    """Per batch size x temperature x method: the best budget, and the largest budget that still pays (speedup >= 1)."""
    summary = []
    for (batch_size, temperature), group in _groups(records).items():
        for method, cells in speculative_by_method(group).items():
            best = max(cells, key=lambda c: c["speedup_vs_ar"])
            paying = [c["budget"] for c in cells if c["speedup_vs_ar"] >= 1.0]
            summary.append(
                {
                    "batch_size": batch_size,
                    "temperature": temperature,
                    "method": method,
                    "best_budget": best["budget"],
                    "best_speedup": best["speedup_vs_ar"],
                    "pays_up_to_budget": max(paying) if paying else None,
                }
            )
    return summary


def _pays_text(pays_up_to_budget: int | None) -> str:
    return "never pays" if pays_up_to_budget is None else f"speculation stops paying above budget {pays_up_to_budget}"


def format_summary(summary: list[dict]) -> str:
    return "\n".join(
        f"batch {s['batch_size']} T={s['temperature']:g} {s['method']:<8} best budget {s['best_budget']} "
        f"({s['best_speedup']:.2f}x); {_pays_text(s['pays_up_to_budget'])}"
        for s in summary
    )


def run_summary_lines(h: dict) -> list[str]:
    """Markdown lines naming a run's machine, prompts, tree and exact command (from its JSON header)."""
    return [
        f"- machine: {h['machine']['device']}, {h['machine']['cpu']}; torch {h['torch']}, {h['dtype']}",
        f"- prompts: {h['prompts']} [{h['prompt_range']}], {h['max_new_tokens']} new tokens; "
        f"tree width {h['tree']['width']} ({h['tree']['fanout']})",
        f"- command: `{h['command_line']}`",
        "",
    ]


def markdown_table(columns: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + [
        "| " + " | ".join(row) + " |" for row in rows
    ]


def _digests(sha256: dict[str, str] | None) -> str:
    return f" (sha256 {', '.join(f'{name} {digest[:12]}' for name, digest in sha256.items())})" if sha256 else ""


def _lookup_line(lookup: dict | None) -> list[str]:
    """The lookup settings, when the run recorded them (older runs name no draft corpus)."""
    if not lookup:
        return []
    corpus = ", ".join(lookup.get("draft_corpus") or ["none recorded"])
    return [
        f"- lookup: n-grams {lookup['min_ngram']}-{lookup['max_ngram']}, accept {lookup['accept']}, "
        f"hybrid draft corpus {corpus}"
    ]


def markdown_report(report: dict) -> str:
    h = report["header"]
    machine = h["machine"]
    heads = "; ".join(f"{flag} `{info['source']}`" + _digests(info["sha256"]) for flag, info in h["heads"].items())
    lines = [
        "# jetspec bench",
        "",
        f"- machine: {machine['device']}, {machine.get('gpu') or machine['cpu']}, {machine['threads']} threads; "
        f"torch {h['torch']}, {h['dtype']}, {h.get('attention', 'sdpa')} attention",
        f"- target: `{h['target']}`",
        f"- heads: {heads or 'none (lookup only)'}",
        *_lookup_line(h.get("lookup")),
        f"- prompts: {h['prompts']} [{h['prompt_range']}], {h['max_new_tokens']} new tokens; "
        f"tree width {h['tree']['width']} ({h['tree']['fanout']})",
        f"- command: `{h['command_line']}`",
        "",
        "## Results",
        "",
    ]
    columns = [
        "batch",
        "temperature",
        "method",
        "budget",
        "tokens/s",
        "accept length",
        "speedup vs AR",
        "greedy mismatches",
    ]
    rows = [
        [
            str(r["batch_size"]),
            f"{r['temperature']:g}",
            r["method"],
            str(r["budget"]),
            f"{r['tokens_per_s']:.2f}",
            f"{r['mean_accept_length']:.2f}",
            f"{r['speedup_vs_ar']:.2f}x",
            "-" if r["greedy_mismatches"] is None else str(r["greedy_mismatches"]),
        ]
        for r in report["records"]
    ]
    lines += markdown_table(columns, rows) + ["", "## Summary", ""]
    columns = ["batch", "temperature", "method", "best budget", "best speedup", "pays up to budget"]
    rows = [
        [
            str(s["batch_size"]),
            f"{s['temperature']:g}",
            s["method"],
            str(s["best_budget"]),
            f"{s['best_speedup']:.2f}x",
            "never pays" if s["pays_up_to_budget"] is None else str(s["pays_up_to_budget"]),
        ]
        for s in report["summary"]
    ]
    lines += markdown_table(columns, rows) + [
        "",
        "## Per-step phases (mean ms per verify step)",
        "",
        "c = (T_draft / N) / T_verify with N = budget nodes (the JetSpec seeds' Appendix G cost).",
        "",
    ]
    columns = [
        "batch",
        "temperature",
        "method",
        "budget",
        "draft ms (by round)",
        "tree ms",
        "verify ms",
        "accept ms",
        "c",
    ]
    rows = [
        [
            str(r["batch_size"]),
            f"{r['temperature']:g}",
            r["method"],
            str(r["budget"]),
            f"{phases['draft']:.1f} ({', '.join(f'{1000 * s:.1f}' for s in r['draft_round_s'])})"
            if r["draft_round_s"]
            else f"{phases['draft']:.1f}",
            f"{phases['tree']:.1f}",
            f"{phases['verify']:.1f}",
            f"{phases['accept']:.1f}",
            "-" if r["draft_token_cost"] is None else f"{100 * r['draft_token_cost']:.2f}%",
        ]
        for r in report["records"]
        if (phases := r.get("phase_ms"))  # reports written before phases were kept have none
    ]
    return "\n".join(lines + markdown_table(columns, rows)) + "\n"


def plot_report(records: list[dict], path: str | Path) -> None:
    """One row per batch size x temperature: accept length and speedup vs budget, one line per method."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no display backend needed

    groups = _groups(records)
    fig = Figure(figsize=(11, 3.4 * len(groups)), layout="constrained")
    axes = fig.subplots(len(groups), 2, squeeze=False)
    for (accept_ax, speedup_ax), ((batch_size, temperature), group) in zip(axes, groups.items()):
        for method, cells in speculative_by_method(group).items():
            budgets = [c["budget"] for c in cells]
            accept_ax.plot(budgets, [c["mean_accept_length"] for c in cells], marker="o", label=method)
            speedup_ax.plot(budgets, [c["speedup_vs_ar"] for c in cells], marker="o", label=method)
        speedup_ax.axhline(1.0, color="grey", linestyle="--", label=AUTOREGRESSIVE)
        budgets = sorted({c["budget"] for c in group if c["method"] != AUTOREGRESSIVE})
        for ax, what in (
            (accept_ax, "mean accept length (tokens / verify)"),
            (speedup_ax, "speedup vs autoregressive"),
        ):
            style_budget_axes(ax, budgets, what)
            ax.set_title(f"batch {batch_size}, temperature {temperature:g}")
    fig.savefig(path, dpi=100)


def style_budget_axes(ax, budgets: list[int], ylabel: str) -> None:
    """Budgets on a log2 x axis with one tick each, grid and legend: every per-budget plot looks alike."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, labels=[str(b) for b in budgets])
    ax.set_xlabel("tree budget (nodes incl. root)")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
