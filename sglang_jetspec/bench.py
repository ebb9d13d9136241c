"""`jetspec bench`: every drafting method over a grid of tree budgets, batch sizes and temperatures.

Each (batch size, temperature) group first measures autoregressive decoding (budget 0, no drafter)
on the same requests; every speculative cell's speedup is relative to that run. Methods:
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
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers

from .bench_report import AUTOREGRESSIVE, format_summary, markdown_report, plot_report, summarize
from .core.head_config import HeadConfigError
from .core.head_io import read_head_config
from .core.sampling import SamplingParams
from .generate import RunFigures, timed_run
from .core.prompt_lookup import LookupMerge
from .loading import DrafterOptionError, check_lookup_options, load_drafter, load_target, lookup_drafter, lookup_merge
from .models.fetch import sha256_file
from .prompts import HUMANEVAL, PromptError, encode, humaneval_prompts, read_prompt_file
from .reference.divergence import describe as describe_divergence, greedy_divergences
from .reference.precision import cpu_model
from .reference.engine import Drafter, EngineConfig, ReferenceEngine, Request, RequestOutput
from .reference.target import TargetModel

WARMUP_TOKENS = 8


class BenchError(ValueError):
    """Bench input that cannot be used; the message names the flag and the fix."""


@dataclass(frozen=True)
class Contender:
    """A method ready to run: its drafter, the tree width and the tree-causal rounds it drafts with,
    and for the hybrid drafter how prompt-lookup guesses join the head's trees."""

    method: str
    drafter: Drafter
    tree_width: int
    draft_rounds: int = 0
    lookup: LookupMerge | None = None


def jetspec_label(rounds: int) -> str:
    return "jetspec" if rounds == 0 else f"jetspec-r{rounds}"


def hybrid_label(accept: float, variants: int) -> str:
    return "hybrid" if variants == 1 else f"hybrid-a{accept:g}"


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
    # per differing greedy request: where it first departs and the target's logit margins there (reference/divergence.py)
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


def _head_is_causal(flag: str, head_dir: str) -> bool:
    try:
        return read_head_config(head_dir).causal_head
    except HeadConfigError as exc:
        raise BenchError(f"{flag} {head_dir}: {exc}") from exc


def check_options(args) -> None:
    """Refuse missing or swapped heads and impossible lookup settings before anything slow is loaded."""
    methods = set(args.methods)
    if "dflash" in methods:
        if not args.dflash_head:
            raise BenchError("--methods includes dflash but --dflash-head is missing: pass a bidirectional (DFlash-style) head directory, or drop dflash from --methods")
        if _head_is_causal("--dflash-head", args.dflash_head):
            raise BenchError(
                f"--dflash-head {args.dflash_head}: config.json has dflash_config.causal_head true, a causal (JetSpec) head; "
                "dflash needs a bidirectional head (causal_head false). Pass this head as --head instead"
            )
    # --head unset or 'untrained' means the shipped or a fresh head, both causal
    if methods & {"jetspec", "chain", "hybrid"} and args.head not in (None, "untrained") and not _head_is_causal("--head", args.head):
        raise BenchError(
            f"--head {args.head}: config.json has dflash_config.causal_head false, a bidirectional head; "
            "jetspec, chain and hybrid need a causal head. Pass this head as --dflash-head instead"
        )
    if "jetspec" in methods and max(args.draft_rounds) > 0 and not _reads_tree_tokens(args.head):
        raise BenchError(
            f"--draft-rounds {','.join(map(str, args.draft_rounds))} needs a head trained with revealed tokens (config.json "
            f"dflash_config.draft_reveal); --head {args.head or '(shipped head)'} drafts per-depth marginals only. "
            "Train one with `jetspec train --reveal prefix` and pass it as --head, or use --draft-rounds 0"
        )
    check_lookup_options(args)


def _reads_tree_tokens(head: str | None) -> bool:
    """Unset or 'untrained' means the shipped or a fresh head: neither was trained with revealed tokens."""
    if head in (None, "untrained"):
        return False
    try:
        return read_head_config(head).reads_tree_tokens
    except HeadConfigError as exc:
        raise BenchError(f"--head {head}: {exc}") from exc


def select_prompts(source: str, selection: slice | None) -> tuple[list, range]:
    """Prompt records (raw strings for HumanEval) chosen by --prompt-range, and their indices."""
    if source == HUMANEVAL:
        records: list = humaneval_prompts()
    elif not Path(source).is_file():
        raise BenchError(f"--prompts {source}: no such file; pass 'humaneval' or a JSONL file with a prompt or messages field per line")
    else:
        try:
            records = read_prompt_file(source)
        except PromptError as exc:
            raise BenchError(f"--prompts {exc}") from exc
    indices = range(len(records))[selection or slice(None)]
    if not indices:
        raise BenchError(f"--prompt-range selects none of the {len(records)} prompts in {source}; pick start:stop within 0:{len(records)}")
    return [records[i] for i in indices], indices


def _load_head(target: TargetModel, flag: str, value: str | None) -> tuple[Drafter, str]:
    try:
        return load_drafter(target, value)
    except HeadConfigError as exc:
        raise BenchError(f"{flag} {value}: {exc}") from exc


def load_contenders(args, target: TargetModel) -> tuple[list[Contender], dict[str, str]]:
    """Drafters for the requested methods (each head loaded once) and the label of each head used."""
    labels: dict[str, str] = {}
    head = dflash_head = None
    if {"jetspec", "chain", "hybrid"} & set(args.methods):
        head, labels["head"] = _load_head(target, "--head", args.head)
    if "dflash" in args.methods:
        dflash_head, labels["dflash_head"] = _load_head(target, "--dflash-head", args.dflash_head)
    lookup = lookup_drafter(target.info.vocab_size, args)
    drafting = {"dflash": (dflash_head, args.tree_width), "chain": (head, 1), "lookup": (lookup, 1)}
    contenders = []
    for method in args.methods:
        if method == "jetspec":
            contenders += [Contender(jetspec_label(r), head, args.tree_width, r) for r in args.draft_rounds]
        elif method == "hybrid":
            contenders += [Contender(hybrid_label(p, len(args.lookup_accept)), head, args.tree_width, 0, lookup_merge(p, args))
                           for p in args.lookup_accept]
        else:
            contenders.append(Contender(method, *drafting[method]))
    return contenders, labels


def make_requests(prompt_ids: list[list[int]], temperature: float, max_new_tokens: int, seed: int) -> list[Request]:
    """One request per prompt; sampled requests get their own seed so every method sees the same streams."""
    return [Request(ids, SamplingParams(temperature=temperature, seed=seed + i, max_new_tokens=max_new_tokens), str(i)) for i, ids in enumerate(prompt_ids)]


class GridRunner:
    """Runs cells on one target; a fresh engine per cell because the engine sets the target's tap layers."""

    def __init__(self, target: TargetModel, args) -> None:
        self.target = target
        self.args = args

    def engine(self, drafter: Drafter | None, tree_width: int, batch_size: int, draft_rounds: int = 0,
               lookup: LookupMerge | None = None) -> ReferenceEngine:
        config = EngineConfig(tree_width=tree_width, fanout=self.args.fanout, acceptance=self.args.acceptance, max_batch_size=batch_size,
                              draft_rounds=draft_rounds, lookup=lookup)
        return ReferenceEngine(self.target, drafter, config)

    def warm_up(self, prompt_ids: list[list[int]], batch_size: int) -> None:
        """A short run at this batch size, so one-off allocation costs do not land in the first measurement."""
        requests = make_requests(prompt_ids[:batch_size], 0.0, min(WARMUP_TOKENS, self.args.max_new_tokens), self.args.seed)
        timed_run(self.engine(None, 1, batch_size), requests, 0, "warmup")

    def group(self, contenders: list[Contender], requests: list[Request], batch_size: int, temperature: float) -> list[BenchRecord]:
        """Autoregressive, then every method x budget, on the same requests."""
        baseline, baseline_outputs = timed_run(self.engine(None, 1, batch_size), requests, 0, AUTOREGRESSIVE)

        def record(run: RunFigures, outputs: list[RequestOutput]) -> BenchRecord:
            # sampled outputs legitimately differ from autoregressive ones: only greedy runs are compared
            divergences = greedy_divergences(self.target, baseline_outputs, outputs) if temperature == 0 else None
            cell = BenchRecord(run.mode, run.budget, batch_size, temperature, run.requests, run.tokens, run.seconds, run.tokens_per_s,
                               run.mean_accept_length, run.tokens_per_s / baseline.tokens_per_s,
                               None if divergences is None else len(divergences), divergences, run.draft_round_s,
                               run.phase_ms, draft_token_cost(run.phase_ms, run.budget))
            print(f"batch {batch_size} T={temperature:g} {cell.method:<15} budget {cell.budget:>4}: {cell.tokens_per_s:8.2f} tok/s  "
                  f"accept {cell.mean_accept_length:5.2f}  speedup {cell.speedup_vs_ar:5.2f}x  "
                  f"draft ms/step by round {[round(1000 * s, 1) for s in cell.draft_round_s]}", flush=True)
            for d in divergences or []:
                print(f"    greedy mismatch, request {d['request']}: {describe_divergence(d)}", flush=True)
            return cell

        records = [record(baseline, baseline_outputs)]
        for contender in contenders:
            for budget in self.args.budgets:
                engine = self.engine(contender.drafter, contender.tree_width, batch_size, contender.draft_rounds, contender.lookup)
                records.append(record(*timed_run(engine, requests, budget, contender.method)))
        return records


def describe_head(label: str) -> dict:
    """A head's source and the sha256 of each of its files (labels of untrained heads have no files)."""
    path = Path(label)
    if not path.is_dir():
        return {"source": label, "sha256": None}
    return {"source": str(path.resolve()), "sha256": {f.name: sha256_file(f) for f in sorted(path.iterdir()) if f.is_file()}}


def run_header(args, target: TargetModel, head_labels: dict[str, str], indices: range) -> dict:
    machine = {"device": args.device, "cpu": cpu_model(), "threads": torch.get_num_threads()}
    if target.device.type == "cuda":
        machine["gpu"] = torch.cuda.get_device_name(target.device)
    return {
        "machine": machine,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": target.precision[0],
        "dtype_choice": target.precision[1],
        "attention": args.attention,
        "target": str(target.path),
        "heads": {flag: describe_head(label) for flag, label in head_labels.items()},
        "command_line": shlex.join(["jetspec", *args.argv]),
        "prompts": args.prompts,
        "prompt_range": f"{indices.start}:{indices.stop}",
        "max_new_tokens": args.max_new_tokens,
        "tree": {"width": args.tree_width, "fanout": args.fanout, "draft_rounds": args.draft_rounds},
        "acceptance": args.acceptance,
        "seed": args.seed,
        # commands without the lookup method's flags (jetspec gap) record none
        "lookup": {"min_ngram": args.lookup_min_ngram, "max_ngram": args.lookup_max_ngram, "max_depth": args.lookup_depth,
                   "accept": args.lookup_accept} if hasattr(args, "lookup_depth") else None,
    }


@dataclass
class LoadedRun:
    """What `bench` and `replay` start from: checked options, the target, the encoded prompts, the drafters."""

    target: TargetModel
    prompt_ids: list[list[int]]
    indices: range
    contenders: list[Contender]
    head_labels: dict[str, str]


def load_run(args) -> LoadedRun:
    """Check the options, then load; bad input fails before anything slow is loaded."""
    check_options(args)
    prompts, indices = select_prompts(args.prompts, args.prompt_range)
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_target(args.target, args.dtype, args.device, args.attention)
    contenders, head_labels = load_contenders(args, target)
    return LoadedRun(target, [encode(p, target.tokenizer) for p in prompts], indices, contenders, head_labels)


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


def run_command(name: str, job, args) -> int:
    """Run `jetspec <name>`: 0 on success, 2 with a message naming the flag on bad input."""
    try:
        job(args)
    except (BenchError, DrafterOptionError) as exc:
        print(f"jetspec {name}: {exc}", file=sys.stderr)
        return 2
    return 0


def run(args) -> int:
    return run_command("bench", bench, args)
