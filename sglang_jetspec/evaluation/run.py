"""`jetspec bench`: every drafting method over a grid of tree budgets, batch sizes and temperatures.

Each (batch size, temperature) group measures autoregressive decoding (budget 0, no drafter) on the
same requests as every speculative cell, interleaved with them round by round; every speculative
cell's speedup is relative to that run. Methods:
  jetspec  the causal head from --head, best-first tree of width --tree-width; with --draft-rounds
           0,1,2 once per value (jetspec, jetspec-r1, jetspec-r2: r tree-causal rounds after the marginal tree)
  dflash   the bidirectional head from --dflash-head, same tree
  chain    the --head head with tree width 1 (a single drafted path)
  lookup   prompt lookup (n-gram match in the request's own tokens), width 1, no model
  hybrid   the jetspec head's tree with the prompt-lookup guess merged in (core/prompt_lookup.py), one per
           --lookup-accept value (hybrid-a0.5, ...: the calibrated chance each guessed token is accepted)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..reference.divergence import describe as describe_divergence
from ..reference.divergence import greedy_divergences
from ..reference.engine import EngineConfig, ReferenceEngine, Request, RequestOutput
from ..reference.target import TargetModel
from .generate import RunFigures, RunTally, timed_run
from .report import AUTOREGRESSIVE, format_summary, markdown_report, plot_report, summarize
from .setup import Contender, load_run, make_requests, run_command, run_header

WARMUP_TOKENS = 8
# Cells run interleaved, this many batches' worth of requests per cell per round: a shared machine's
# speed drifts over minutes, and a grid run cell after cell would charge that drift to later cells.
ROUND_BATCHES = 4


@dataclass
class BenchRecord:
    method: str
    budget: int
    batch_size: int
    temperature: float
    requests: int
    tokens: int
    seconds: float
    tokens_per_s: float
    mean_accept_length: float  # committed tokens per verify, bonus included
    speedup_vs_ar: float
    greedy_mismatches: int | None  # requests whose output differs from autoregressive; None when sampled
    # per differing greedy request: where it first departs and the target's logit margins there
    # (reference/divergence.py)
    divergences: list[dict] | None
    draft_round_s: list[float]  # mean draft head seconds per verify step by round: [marginal pass, round 1, ...]
    phase_ms: dict[str, float]  # mean ms per verify step: draft, tree, verify, accept
    # Appendix G's per-draft-token cost c = (T_draft / N) / T_verify, N = the budget (nodes); None without a draft
    draft_token_cost: float | None


def draft_token_cost(phase_ms: dict[str, float], budget: int) -> float | None:
    """The seeds' Appendix G quantity: draft time per tree node over the verify time of the step."""
    if budget <= 1 or phase_ms["draft"] <= 0 or phase_ms["verify"] <= 0:
        return None
    return phase_ms["draft"] / budget / phase_ms["verify"]


class GridRunner:
    """Runs cells on one target, each with its own engine (its own drafter settings, sizing and finished outputs)."""

    def __init__(self, target: TargetModel, args) -> None:
        self.target = target
        self.args = args

    def engine(self, batch_size: int, contender: Contender | None = None) -> ReferenceEngine:
        """An engine for one cell: autoregressive without a contender."""
        c = contender or Contender(AUTOREGRESSIVE, None, 1)
        config = EngineConfig(
            tree_width=c.tree_width,
            fanout=self.args.fanout,
            acceptance=c.acceptance,
            max_batch_size=batch_size,
            draft_rounds=c.draft_rounds,
            lookup=c.lookup,
            tree_sizing=c.tree_sizing,
        )
        return ReferenceEngine(self.target, c.drafter, config)

    def warm_up(self, prompt_ids: list[list[int]], batch_size: int) -> None:
        """A short run at this batch size, so one-off allocation costs do not land in the first measurement."""
        requests = make_requests(
            prompt_ids[:batch_size], 0.0, min(WARMUP_TOKENS, self.args.max_new_tokens), self.args.seed
        )
        timed_run(self.engine(batch_size), requests, 0, "warmup")

    def group(
        self, contenders: list[Contender], requests: list[Request], batch_size: int, temperature: float
    ) -> list[BenchRecord]:
        """Autoregressive and every method x budget on the same requests, interleaved: each round
        runs the next ROUND_BATCHES batches of requests through every cell, autoregressive first.
        Each cell keeps one engine for the whole run (its adaptive sizing and finished outputs carry over)."""
        cells = [(RunTally(AUTOREGRESSIVE, 0), self.engine(batch_size))]
        cells += [
            (RunTally(c.method, budget), self.engine(batch_size, c)) for c in contenders for budget in self.args.budgets
        ]
        per_round = ROUND_BATCHES * batch_size
        rounds = -(-len(requests) // per_round)
        for i, start in enumerate(range(0, len(requests), per_round), start=1):
            chunk = requests[start : start + per_round]
            for tally, engine in cells:
                tally.run(engine, chunk)
            print(
                f"batch {batch_size} T={temperature:g}: round {i}/{rounds} done "
                f"({len(cells)} cells x {len(chunk)} requests)",
                flush=True,
            )
        baseline, baseline_outputs = cells[0][0].figures(), cells[0][0].outputs

        def record(run: RunFigures, outputs: list[RequestOutput]) -> BenchRecord:
            # sampled outputs legitimately differ from autoregressive ones: only greedy runs are compared
            divergences = greedy_divergences(self.target, baseline_outputs, outputs) if temperature == 0 else None
            cell = BenchRecord(
                run.mode,
                run.budget,
                batch_size,
                temperature,
                run.requests,
                run.tokens,
                run.seconds,
                run.tokens_per_s,
                run.mean_accept_length,
                run.tokens_per_s / baseline.tokens_per_s,
                None if divergences is None else len(divergences),
                divergences,
                run.draft_round_s,
                run.phase_ms,
                draft_token_cost(run.phase_ms, run.budget),
            )
            print(
                f"batch {batch_size} T={temperature:g} {cell.method:<15} budget {cell.budget:>4}: "
                f"{cell.tokens_per_s:8.2f} tok/s  "
                f"accept {cell.mean_accept_length:5.2f}  speedup {cell.speedup_vs_ar:5.2f}x  "
                f"draft ms/step by round {[round(1000 * s, 1) for s in cell.draft_round_s]}",
                flush=True,
            )
            for d in divergences or []:
                print(f"    greedy mismatch, request {d['request']}: {describe_divergence(d)}", flush=True)
            return cell

        return [record(tally.figures(), tally.outputs) for tally, _ in cells]


def bench(args) -> dict:
    loaded = load_run(args)
    runner = GridRunner(loaded.target, args)
    records: list[BenchRecord] = []
    for batch_size in args.batch_sizes:
        runner.warm_up(loaded.prompt_ids, batch_size)
        for temperature in args.temperatures:
            requests = make_requests(loaded.prompt_ids, temperature, args.max_new_tokens, args.seed)
            records += runner.group(loaded.contenders, requests, batch_size, temperature)
    rows = [asdict(r) for r in records]
    header = run_header(args, loaded.target, loaded.head_labels, loaded.indices)
    report = {"header": header, "records": rows, "summary": summarize(rows)}
    write_outputs(report, args)
    return report


def write_outputs(report: dict, args) -> None:
    print(format_summary(report["summary"]))
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown_report(report))
    if args.plot:
        plot_report(report["records"], args.plot)


def run(args) -> int:
    return run_command("bench", bench, args)
