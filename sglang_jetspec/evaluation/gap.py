"""`jetspec gap`: the JetSpec paper's rank-1 branch gap (its Figure 1), per tree-causal rounds and budget.

At every verify step of greedy decoding on the reference engine, the rank-1 branch of each tree (the
best-scoring child from the root, as deep as the tree goes) is scored twice: by the draft (the
cumulative log-prob the tree was built on) and by the target (its raw log-probs of the same tokens,
read from the verify pass, which scores every tree node: exact, unlike a replay that only knows the
target along the autoregressive continuation). gap = draft - target; large positive gaps are
branches the draft believed and the target finds incoherent. Reports the gap distribution and the
mean accept length per (draft rounds, budget); every cell's greedy output must equal the first's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..core.branch_gap import BranchGap
from ..core.head_config import HeadConfigError
from ..reference.engine import EngineConfig, ReferenceEngine
from ..reference.loading import load_drafter, load_target
from ..reference.prompts import encode
from .report import markdown_table, run_summary_lines
from .setup import BenchError, jetspec_label, make_requests, run_command, run_header, select_prompts

THRESHOLDS = (5.0, 10.0, 20.0)  # nats; the paper's catastrophic failures are >= +80


@dataclass
class GapRecord:
    method: str
    draft_rounds: int
    budget: int
    steps: int  # rank-1 branches scored (verify steps x lanes with a drafted branch)
    mean_accept_length: float
    mean_branch_depth: float
    gap_mean: float
    gap_quantiles: dict[str, float]  # p10, p50, p90, p99
    share_at_least: dict[str, float]  # share of branches with gap >= each threshold (nats)
    greedy_mismatches: int  # requests whose output differs from the first cell's


def summarize_gaps(gaps: list[BranchGap]) -> dict:
    values = torch.tensor([g.gap for g in gaps], dtype=torch.float64)
    if not len(values):
        return {"gap_mean": float("nan"), "gap_quantiles": {}, "share_at_least": {}, "mean_branch_depth": 0.0}
    qs = torch.quantile(values, torch.tensor([0.1, 0.5, 0.9, 0.99], dtype=torch.float64)).tolist()
    return {
        "gap_mean": float(values.mean()),
        "gap_quantiles": dict(zip(("p10", "p50", "p90", "p99"), qs)),
        "share_at_least": {f"{t:g}": float((values >= t).double().mean()) for t in THRESHOLDS},
        "mean_branch_depth": sum(g.depth for g in gaps) / len(gaps),
    }


def gap(args) -> dict:
    prompts, indices = select_prompts(args.prompts, args.prompt_range)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target, args.dtype, args.device, args.attention)
    try:
        drafter, head_label = load_drafter(target, args.head)
    except HeadConfigError as exc:
        raise BenchError(f"--head {args.head}: {exc}") from exc
    if max(args.draft_rounds) > 0 and not drafter.reads_tree_tokens:
        raise BenchError(
            f"--draft-rounds {','.join(map(str, args.draft_rounds))}: --head {args.head or '(shipped head)'} "
            "was not trained with revealed tokens (config.json dflash_config.draft_reveal); "
            "train one with `jetspec train --reveal prefix`"
        )
    requests = make_requests([encode(p, target.tokenizer) for p in prompts], 0.0, args.max_new_tokens, args.seed)
    records, first_outputs, raw = [], None, {}
    for rounds in args.draft_rounds:
        for budget in args.budgets:
            config = EngineConfig(
                tree_width=args.tree_width,
                fanout=args.fanout,
                max_batch_size=args.batch_size,
                draft_rounds=rounds,
                rank1_gap=True,
            )
            gaps: list[BranchGap] = []
            outputs = ReferenceEngine(target, drafter, config).generate(
                requests, budget, on_step=lambda r: gaps.extend(g for g in r.rank1_gaps if g.depth)
            )
            first_outputs = first_outputs or [o.output_ids for o in outputs]
            lengths = [n for o in outputs for n in o.accept_lengths]
            record = GapRecord(
                jetspec_label(rounds),
                rounds,
                budget,
                len(gaps),
                sum(lengths) / max(1, len(lengths)),
                greedy_mismatches=sum(o.output_ids != f for o, f in zip(outputs, first_outputs)),
                **summarize_gaps(gaps),
            )
            raw[f"{record.method}@{budget}"] = [round(g.gap, 4) for g in gaps]
            records.append(record)
            print(
                f"{record.method:<12} budget {budget:>4}: accept {record.mean_accept_length:5.2f}  "
                f"gap p50 {record.gap_quantiles.get('p50', float('nan')):7.2f}  "
                f"p90 {record.gap_quantiles.get('p90', float('nan')):7.2f}  "
                f"share >= 10 nats {record.share_at_least.get('10', float('nan')):.3f}  "
                f"mismatches {record.greedy_mismatches}",
                flush=True,
            )
    header = run_header(args, target, {"head": head_label}, indices) | {"batch_size": args.batch_size}
    report = {"header": header, "records": [asdict(r) for r in records], "gaps": raw}
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown_gap(report))
    if args.plot:
        plot_gap(raw, args.plot)
    return report


def markdown_gap(report: dict) -> str:
    h = report["header"]
    lines = [
        "# jetspec gap: rank-1 branch, draft minus target log-prob (nats; greedy)",
        "",
        *run_summary_lines(h),
    ]
    rows = [
        [
            r["method"],
            str(r["budget"]),
            f"{r['mean_accept_length']:.2f}",
            f"{r['mean_branch_depth']:.1f}",
            f"{r['gap_mean']:.2f}",
            *(f"{r['gap_quantiles'].get(q, float('nan')):.2f}" for q in ("p10", "p50", "p90", "p99")),
            *(f"{r['share_at_least'].get(f'{t:g}', float('nan')):.3f}" for t in THRESHOLDS),
            str(r["greedy_mismatches"]),
        ]
        for r in report["records"]
    ]
    columns = [
        "method",
        "budget",
        "accept",
        "branch depth",
        "gap mean",
        "p10",
        "p50",
        "p90",
        "p99",
        *(f"share >= {t:g}" for t in THRESHOLDS),
        "mismatches",
    ]
    return "\n".join(lines + markdown_table(columns, rows)) + "\n"


def plot_gap(raw: dict[str, list[float]], path: str | Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for label, values in raw.items():
        if values:
            ax.ecdf(values, label=label)
    ax.set_xlabel("rank-1 branch gap: draft - target log-prob (nats)")
    ax.set_ylabel("share of verify steps")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=100)


def run(args) -> int:
    return run_command("gap", gap, args)
