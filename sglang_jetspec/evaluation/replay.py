"""`jetspec replay`: greedy accept lengths of every drafting method at every budget, without verify passes.

Under greedy decoding the engine commits, per step, the deepest tree path whose tokens equal the
target's argmax continuation, plus one bonus token; and along a matching path that continuation is
exactly the autoregressive output. So one autoregressive run and one tapped prefill of
prompt + output per prompt replay every method's step trajectory at every budget: each step drafts
from the rows of the committed prefix, builds the same best-first tree the engine builds, and
advances by the matched depth + 1. The marginal draft of a position does not depend on the budget,
so it is computed once and shared by all budgets. Tree-causal rounds (--draft-rounds) do depend on
the tree, hence on the budget: per position and budget the trees of successive rounds are kept, so
r = 1 and r = 2 share their first round. Exact up to float rounding: the engine's tapped rows
come from verify passes, here from one prefill (tests/test_replay.py checks the two agree).
This is what makes a full HumanEval sweep over budgets up to 256 affordable on a CPU; wall-clock
speedups still come from `jetspec bench`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..core.context_cache import ContextCache
from ..core.prompt_lookup import LookupMerge, lookup_guesses
from ..core.suffix_store import RECENT_OUTPUT_TOKENS, SuffixStore
from ..core.tree import DraftTree, TreeSpec, top_k_per_depth
from ..core.tree_drafting import TreeDraft, refine
from ..reference.engine import Drafter, EngineConfig, ReferenceEngine, RequestOutput
from ..reference.target import Segment, TargetModel
from .report import markdown_table, run_summary_lines, speculative_by_method, style_budget_axes
from .setup import load_run, make_requests, run_command, run_header


@dataclass
class ReplayLane:
    """What a drafter reads from a request, frozen at `committed` tokens of the recorded output."""

    prompt_ids: list[int]
    output_ids: list[int]
    rows: torch.Tensor  # tapped rows of prompt + output, one per token
    committed: int = 0  # committed tokens, prompt included
    draft_cache: ContextCache = field(default_factory=ContextCache)

    @property
    def committed_ids(self) -> list[int]:
        return (self.prompt_ids + self.output_ids)[: self.committed]

    @property
    def root_token(self) -> int:
        return self.committed_ids[-1]

    def tap_rows(self) -> torch.Tensor:
        return self.rows[: self.committed - 1]


def matched_depth(tree: DraftTree, continuation: list[int]) -> int:
    """Depth of the deepest tree path from the root whose tokens are a prefix of `continuation`."""
    kids, node, depth = tree.children(), 0, 0
    tokens = tree.tokens.tolist()
    while depth < len(continuation):
        node = next((c for c in kids[node] if tokens[c] == continuation[depth]), -1)
        if node < 0:
            break
        depth += 1
    return depth


def tapped_rows(target: TargetModel, ids: list[int], taps: tuple[int, ...]) -> torch.Tensor:
    cache = target.new_cache(lanes=1, capacity=len(ids))
    out = target.forward(cache, [Segment.chain(ids, 0)], taps)
    return out.taps[0, : len(ids)]


class DraftMemo:
    """One drafter at one tree width on one request: per position its marginal top-K per depth (for
    all budgets), and per (position, budget, fanout) the trees after 0, 1, ... tree-causal rounds."""

    def __init__(self, drafter: Drafter, tree_width: int, lane: ReplayLane, depth: int) -> None:
        self.drafter, self.tree_width, self.lane, self.depth = drafter, tree_width, lane, depth
        self._marginal: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._rounds: dict[tuple, tuple[TreeDraft, list[DraftTree]]] = {}

    def at(self, committed: int) -> tuple[torch.Tensor, torch.Tensor]:
        if committed not in self._marginal:
            self.lane.committed = committed
            logits = self.drafter.propose([self.lane], min(self.depth, self.drafter.max_depth))[0]
            self._marginal[committed] = top_k_per_depth(
                logits, self.tree_width, getattr(self.drafter, "draft_vocab", None)
            )
        return self._marginal[committed]

    def tree(
        self, committed: int, budget: int, fanout: str, rounds: int = 0, lookup: LookupMerge | None = None
    ) -> DraftTree:
        """The tree the engine drafts at this position: the marginal tree (with the prompt-lookup guess
        merged in for the hybrid drafter), then `rounds` tree-causal rounds."""
        key = (committed, budget, fanout, lookup)
        if key not in self._rounds:
            tokens, logprobs = self.at(committed)
            spec = TreeSpec(budget, min(budget - 1, tokens.shape[0]), self.tree_width, fanout)
            self.lane.committed = committed
            draft = TreeDraft(
                self.lane.root_token,
                tokens,
                logprobs,
                spec,
                guesses=lookup_guesses(self.lane.committed_ids, spec, lookup),
                vocab=getattr(self.drafter, "draft_vocab", None),
            )
            self._rounds[key] = (draft, [draft.tree])
        draft, trees = self._rounds[key]
        while len(trees) <= rounds:
            self.lane.committed = committed
            refine(self.drafter, [self.lane], [draft])
            trees.append(draft.tree)
        return trees[rounds]


def replay_request(
    memo: DraftMemo, output: RequestOutput, budget: int, fanout: str, rounds: int = 0, lookup: LookupMerge | None = None
) -> list[int]:
    """Accept lengths (bonus included) of each step when `memo`'s drafter drafts at `budget` with `rounds`
    (and `lookup`'s merge, for the hybrid drafter)."""
    prompt_len, total = len(output.prompt_ids), len(output.prompt_ids) + len(output.output_ids)
    committed, lengths = prompt_len + 1, []  # the prefill commits the first output token
    full = output.prompt_ids + output.output_ids
    while committed < total:
        tree = memo.tree(committed, budget, fanout, rounds, lookup)
        kept = min(matched_depth(tree, full[committed:]) + 1, total - committed)
        lengths.append(kept)
        committed += kept
    return lengths


@dataclass
class ReplayRecord:
    method: str
    budget: int
    requests: int
    steps: int
    tokens: int
    mean_accept_length: float  # committed tokens per verify, bonus included


def replay(args) -> dict:
    loaded = load_run(args)
    target, contenders = loaded.target, loaded.contenders
    requests = make_requests(loaded.prompt_ids, 0.0, args.max_new_tokens, args.seed)
    outputs = ReferenceEngine(target, None, EngineConfig(max_batch_size=args.ar_batch_size)).generate(requests, 0)
    print(
        f"autoregressive outputs: {sum(len(o.output_ids) for o in outputs)} tokens over {len(outputs)} prompts",
        flush=True,
    )
    depth = max(args.budgets) - 1
    # as in the engine, a hybrid with a draft corpus also looks up the outputs of the requests before
    contenders = [
        replace(c, lookup=replace(c.lookup, recent=SuffixStore(max_tokens=RECENT_OUTPUT_TOKENS)))
        if c.lookup is not None and c.lookup.corpus is not None
        else c
        for c in contenders
    ]
    steps = {(c.method, b): [] for c in contenders for b in args.budgets}
    for i, output in enumerate(outputs):
        # one memo per (drafter, width) and request: jetspec at several --draft-rounds shares it
        rows_by_taps: dict[tuple[int, ...], torch.Tensor] = {}
        memos: dict[tuple[int, int], DraftMemo] = {}
        for contender in contenders:
            taps = tuple(getattr(contender.drafter, "tap_layers", ()))
            if taps not in rows_by_taps:
                rows_by_taps[taps] = (
                    tapped_rows(target, output.prompt_ids + output.output_ids, taps) if taps else torch.zeros(0)
                )
            key = (id(contender.drafter), contender.tree_width)
            if key not in memos:
                memos[key] = DraftMemo(
                    contender.drafter,
                    contender.tree_width,
                    ReplayLane(output.prompt_ids, output.output_ids, rows_by_taps[taps]),
                    depth,
                )
            for budget in args.budgets:
                steps[contender.method, budget].append(
                    replay_request(memos[key], output, budget, args.fanout, contender.draft_rounds, contender.lookup)
                )
        for contender in contenders:
            if contender.lookup is not None and contender.lookup.recent is not None:
                contender.lookup.recent.add(output.output_ids)
        print(f"request {i + 1}/{len(outputs)} replayed", flush=True)
    for contender in contenders:
        print(
            f"{contender.method}: " + "  ".join(f"{b}: {_mean(steps[contender.method, b]):.2f}" for b in args.budgets),
            flush=True,
        )
    records = [
        ReplayRecord(m, b, len(runs), sum(map(len, runs)), sum(map(sum, runs)), _mean(runs))
        for (m, b), runs in steps.items()
    ]
    header = run_header(args, target, loaded.head_labels, loaded.indices) | {"ar_batch_size": args.ar_batch_size}
    report = {"header": header, "records": [asdict(r) for r in records]}
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown_replay(report))
    if args.plot:
        plot_replay(report["records"], args.plot)
    return report


def _mean(runs: list[list[int]]) -> float:
    steps = sum(map(len, runs))
    return sum(map(sum, runs)) / steps if steps else 0.0


def markdown_replay(report: dict) -> str:
    h = report["header"]
    budgets = sorted({r["budget"] for r in report["records"]})
    by_method: dict[str, dict[int, float]] = {}
    for r in report["records"]:
        by_method.setdefault(r["method"], {})[r["budget"]] = r["mean_accept_length"]
    lines = [
        "# jetspec replay: greedy mean accept length (tokens per verify, bonus included)",
        "",
        *run_summary_lines(h),
    ]
    rows = [[m] + [f"{accepts[b]:.2f}" for b in budgets] for m, accepts in by_method.items()]
    return "\n".join(lines + markdown_table(["method"] + [f"budget {b}" for b in budgets], rows)) + "\n"


def plot_replay(records: list[dict], path: str | Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for method, cells in speculative_by_method(records).items():
        ax.plot([c["budget"] for c in cells], [c["mean_accept_length"] for c in cells], marker="o", label=method)
    style_budget_axes(ax, sorted({r["budget"] for r in records}), "mean accept length (greedy)")
    fig.savefig(path, dpi=100)


def run(args) -> int:
    return run_command("replay", replay, args)
