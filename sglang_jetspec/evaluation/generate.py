"""The main job without a GPU: the same prompts decoded autoregressively and with JETSPEC, side by side.

Both runs use the same reference engine, target, prompts, batch size and sampling; the report gives
tokens/s for each, the speedup, JETSPEC's mean accept length (committed tokens per verify, bonus
included) and, for greedy decoding, how many outputs differ (0 expected in fp32).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import torch

from ..core.sampling import SamplingParams
from ..reference.divergence import describe as describe_divergence
from ..reference.divergence import greedy_divergences
from ..reference.engine import EngineConfig, ReferenceEngine, Request, RequestOutput
from ..reference.loading import load_engine_drafter, load_target
from ..reference.precision import cpu_model
from ..reference.prompts import load_prompt_ids


@dataclass
class RunFigures:
    mode: str
    budget: int
    requests: int
    tokens: int
    seconds: float
    tokens_per_s: float
    mean_accept_length: float
    draft_round_s: list[
        float
    ]  # mean draft head seconds per verify step, by round: [marginal pass, tree-causal round 1, ...]
    phase_ms: dict[str, float]  # mean milliseconds per verify step of each phase (STEP_PHASES)


STEP_PHASES = ("draft", "tree", "verify", "accept")


class RunTally:
    """One method's timed runs, possibly over several rounds of requests, summed into one RunFigures
    (the bench interleaves its cells round by round, so a machine that speeds up or slows down over
    the run weighs on every cell alike)."""

    def __init__(self, mode: str, budget: int) -> None:
        self.mode, self.budget = mode, budget
        self.seconds = 0.0
        self.outputs: list[RequestOutput] = []
        self.steps: list = []  # StepRecord of every verify step

    def run(self, engine: ReferenceEngine, requests: list[Request]) -> None:
        start = time.perf_counter()
        outputs = engine.generate(requests, budget=self.budget, on_step=self.steps.append)
        self.seconds += time.perf_counter() - start
        self.outputs += outputs

    def figures(self) -> RunFigures:
        outputs, records = self.outputs, self.steps
        tokens = sum(len(o.output_ids) for o in outputs)
        verifies = sum(len(o.accept_lengths) for o in outputs)
        accept = sum(sum(o.accept_lengths) for o in outputs) / max(1, verifies)
        steps = max(1, len(records))
        per_round = [sum(col) / steps for col in zip(*(r.draft_round_s for r in records))]
        phase_ms = {phase: 1000 * sum(getattr(r, f"{phase}_s") for r in records) / steps for phase in STEP_PHASES}
        return RunFigures(
            self.mode,
            self.budget,
            len(outputs),
            tokens,
            self.seconds,
            tokens / self.seconds,
            accept,
            per_round,
            phase_ms,
        )


def timed_run(
    engine: ReferenceEngine, requests: list[Request], budget: int, mode: str
) -> tuple[RunFigures, list[RequestOutput]]:
    tally = RunTally(mode, budget)
    tally.run(engine, requests)
    return tally.figures(), tally.outputs


def run(args) -> dict:
    torch.manual_seed(0)
    target = load_target(args.target, args.dtype, args.device, args.attention)
    chosen = load_engine_drafter(target, args)
    prompt_ids = load_prompt_ids(args.prompts, target.tokenizer, limit=args.num_prompts)
    params = SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
    )
    requests = [Request(ids, params, str(i)) for i, ids in enumerate(prompt_ids)]
    plain = ReferenceEngine(target, None, EngineConfig(max_batch_size=args.batch_size))
    timed_run(plain, requests[:1], 0, "warmup")  # first calls pay one-off allocation costs
    ar, ar_out = timed_run(plain, requests, 0, "autoregressive")
    # A separate engine: the hybrid drafter looks up its engine's finished outputs, and the
    # autoregressive answers to these very prompts must not be among them.
    engine = ReferenceEngine(
        target,
        chosen.drafter,
        EngineConfig(
            tree_width=chosen.tree_width,
            fanout=args.fanout,
            acceptance=args.acceptance,
            max_batch_size=args.batch_size,
            draft_rounds=args.draft_rounds,
            lookup=chosen.lookup,
            tree_sizing=args.tree_sizing,
        ),
    )
    # the speculative run keeps the report key "jetspec"; its mode names the drafter that ran
    spec, spec_out = timed_run(engine, requests, args.budget, {"head": "jetspec"}.get(args.drafter, args.drafter))
    divergences = greedy_divergences(target, ar_out, spec_out) if params.greedy else None
    report = {
        "target": str(target.path),
        "head": chosen.label,
        "prompts": args.prompts,
        "num_prompts": len(requests),
        "batch_size": args.batch_size,
        "max_new_tokens": args.max_new_tokens,
        "sampling": asdict(params),
        "tree": {
            "budget": args.budget,
            "width": chosen.tree_width,
            "fanout": args.fanout,
            "max_depth": chosen.drafter.max_depth,
            "draft_rounds": args.draft_rounds,
            "sizing": args.tree_sizing,
        },
        "device": f"{args.device} ({cpu_model()}, {torch.get_num_threads()} threads), "
        f"{target.precision[0]} ({target.precision[1]})",
        "autoregressive": asdict(ar),
        "jetspec": asdict(spec),
        "speedup": spec.tokens_per_s / ar.tokens_per_s,
        "greedy_outputs_differing": None if divergences is None else len(divergences),
        "greedy_divergences": divergences,
    }
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    return report


def format_report(r: dict) -> str:
    lines = [
        f"target {r['target']}",
        f"head   {r['head']}",
        f"{r['num_prompts']} prompts from {r['prompts']}, {r['max_new_tokens']} new tokens, batch {r['batch_size']}, "
        f"budget {r['tree']['budget']} (width {r['tree']['width']}, depth <= {r['tree']['max_depth']}, "
        f"{r['tree'].get('sizing', 'fixed')} sizing), {r['device']}",
        "",
        f"{'mode':<16}{'tokens':>8}{'seconds':>10}{'tokens/s':>10}{'accept len':>12}",
    ]
    for key in ("autoregressive", "jetspec"):
        f = r[key]
        lines.append(
            f"{f['mode']:<16}{f['tokens']:>8}{f['seconds']:>10.2f}{f['tokens_per_s']:>10.2f}{f['mean_accept_length']:>12.2f}"
        )
    lines.append(f"speedup {r['speedup']:.2f}x")
    if r["greedy_outputs_differing"] is not None:
        lines.append(
            f"greedy outputs differing from autoregressive: {r['greedy_outputs_differing']} of {r['num_prompts']}"
        )
        for d in r["greedy_divergences"]:
            lines.append(f"  request {d['request']}: {describe_divergence(d)}")
    return "\n".join(lines)
