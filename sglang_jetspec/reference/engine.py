"""The reference engine: continuous batching of requests over a HF target, speculative or not.

Every step, each running request (a lane) brings a tree: the root alone for ordinary decoding
(budget 0 = off, or 1), or a drafted tree. One target forward verifies all trees; acceptance picks
each lane's tokens; the KV cache keeps only the accepted path and the tapped hidden rows of the same
nodes are appended. Invariant per lane: kv_len == tap_rows == committed_len - 1 (the newest token,
the next root, has neither yet).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Protocol

import torch

from ..core.acceptance import AcceptResult, accept_batch
from ..core.branch_gap import rank1_branch_gap
from ..core.context_cache import ContextCache
from ..core.learned_verify_cost import LearnedVerifyCost
from ..core.prompt_lookup import LookupMerge
from ..core.sampling import SamplingParams, make_generator
from ..core.step_clock import Drafted, SizingLearners, StepClock
from ..core.step_record import StepRecord
from ..core.suffix_store import RECENT_OUTPUT_TOKENS, SuffixStore
from ..core.tree import root_only_tree
from ..core.tree_drafting import DraftTiming, budget_spec, step_trees
from ..core.tree_sizing import SIZINGS, TreeSizer
from .invariants import check_invariants
from .kv_cache import SlotKVCache
from .target import Segment, TargetModel
from .verify_cost import verify_cost


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = ""


@dataclass
class RequestOutput:
    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str  # "eos" | "length" | "stop"
    accept_lengths: list[int]  # committed tokens per verify step (bonus included), prefill excluded
    text: str = ""


class Drafter(Protocol):
    max_depth: int

    def propose(self, lanes: list["Lane"], depth: int) -> torch.Tensor:
        """Draft logits [lanes, depth, V] for depths 1..depth after each lane's root (depth <= max_depth)."""


FROM_CONFIG = "config"  # RunningBatch.step: use the engine config's lookup merge


@dataclass
class EngineConfig:
    tree_width: int = 8
    fanout: str = "uniform"
    # sampled requests: "match", "residual" or "draw" (children drawn from the head: core/drawn_children.py)
    acceptance: str = "match"
    max_batch_size: int = 4
    check_invariants: bool = False  # verify KV / hidden-row bookkeeping after every step (debugging, tests)
    draft_rounds: int = 0  # tree-causal rounds after the marginal tree (0 = per-depth marginals only)
    lookup: LookupMerge | None = None  # the hybrid drafter: prompt-lookup guesses merged into the head's trees
    rank1_gap: bool = False  # record each lane's rank-1 branch gap (draft - target log-prob) in StepRecord
    tree_sizing: str = "fixed"  # "adaptive": verify only the nodes that pay for themselves (core/tree_sizing.py)

    def __post_init__(self) -> None:
        if self.tree_sizing not in SIZINGS:
            raise ValueError(f"tree_sizing={self.tree_sizing!r}: choose one of {', '.join(SIZINGS)}")
        if self.draft_rounds < 0:
            raise ValueError(f"draft_rounds={self.draft_rounds}: must be >= 0 (0 = marginal tree only)")


class Lane:
    """A running request: its committed tokens, its random stream and its tapped hidden rows (all of
    them: the engine's invariant checks compare them with a fresh prefill)."""

    def __init__(
        self, request: Request, tokenizer, eos_ids: frozenset[int], tap_width: int, device: torch.device
    ) -> None:
        self.request = request
        self.generator = make_generator(request.params.seed)
        self.output_ids: list[int] = []
        self.accept_lengths: list[int] = []
        self.finish_reason: str | None = None
        self.draft_cache = ContextCache()
        self._tokenizer, self._eos = tokenizer, eos_ids
        self._rows = torch.zeros(max(16, len(request.prompt_ids) * 2), tap_width, device=device)
        self._num_rows = 0

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def committed_ids(self) -> list[int]:
        return self.request.prompt_ids + self.output_ids

    @property
    def root_token(self) -> int:
        return self.committed_ids[-1]

    def tap_rows(self) -> torch.Tensor:
        return self._rows[: self._num_rows]

    def append_rows(self, rows: torch.Tensor) -> None:
        need = self._num_rows + rows.shape[0]
        if need > self._rows.shape[0]:
            grown = torch.zeros(2 * need, self._rows.shape[1], dtype=self._rows.dtype, device=self._rows.device)
            grown[: self._num_rows] = self._rows[: self._num_rows]
            self._rows = grown
        self._rows[self._num_rows : need] = rows
        self._num_rows = need

    def commit(self, tokens: list[int]) -> int:
        """Append tokens one by one until the request finishes; returns how many were kept."""
        params = self.params
        for kept, token in enumerate(tokens, start=1):
            self.output_ids.append(token)
            if not params.ignore_eos and token in self._eos:
                self.finish_reason = "eos"
            elif params.stop and any(s in self._tokenizer.decode(self.output_ids) for s in params.stop):
                self.finish_reason = "stop"
            elif len(self.output_ids) >= params.max_new_tokens:
                self.finish_reason = "length"
            if self.finish_reason:
                return kept
        return len(tokens)

    def output(self) -> RequestOutput:
        text = self._tokenizer.decode(self.output_ids, skip_special_tokens=True)
        if self.finish_reason == "stop":
            cut = min((text.find(s) for s in self.params.stop if s in text), default=len(text))
            text = text[:cut]
        return RequestOutput(
            self.request.request_id,
            self.request.prompt_ids,
            list(self.output_ids),
            self.finish_reason or "length",
            self.accept_lengths,
            text,
        )


class ReferenceEngine:
    def __init__(self, target: TargetModel, drafter: Drafter | None = None, config: EngineConfig | None = None) -> None:
        self.target = target
        self.drafter = drafter
        self.config = config or EngineConfig()
        self.tap_layers: tuple[int, ...] = tuple(getattr(drafter, "tap_layers", ()))
        self.tap_width = target.info.hidden_size * len(self.tap_layers)
        self.check_draft_rounds(self.config.draft_rounds)
        self.learners: SizingLearners | None = None  # adaptive sizing's sizer and verify cost, once used
        if self.config.tree_sizing == "adaptive":
            self.sizer_for("adaptive")  # measured before the first request, so no request pays for it
        # what this engine's finished requests wrote: the hybrid drafter looks its continuations up too
        self.recent_outputs = SuffixStore(max_tokens=RECENT_OUTPUT_TOKENS)

    def sizer_for(self, tree_sizing: str) -> TreeSizer | None:
        """The engine's sizer for an adaptive step (None for a fixed one, or without a drafter); a policy
        cohort's first adaptive step measures the verify cost if the engine was started fixed."""
        if tree_sizing not in SIZINGS:
            raise ValueError(f"tree_sizing={tree_sizing!r}: choose one of {', '.join(SIZINGS)}")
        if tree_sizing == "fixed" or self.drafter is None:
            return None
        if self.learners is None:
            start = LearnedVerifyCost.starting_from(verify_cost(self.target, self.tap_layers))
            self.learners = SizingLearners(TreeSizer(), start)
        return self.learners.sizer

    def check_draft_rounds(self, rounds: int) -> None:
        """ValueError unless this engine's drafter can run `rounds` tree-causal rounds."""
        if rounds and not getattr(self.drafter, "reads_tree_tokens", False):
            raise ValueError(
                f"draft_rounds={rounds} needs a head trained with revealed tokens (config.json "
                "dflash_config.draft_reveal, written by `jetspec train --reveal prefix`); this drafter only gives "
                "per-depth marginals: use draft rounds 0 or such a head"
            )

    def start_batch(self) -> "RunningBatch":
        """An empty running batch; requests join with admit() and advance with step()."""
        self.live = RunningBatch(self)  # the running state, for inspection between steps
        return self.live

    def generate(
        self,
        requests: list[Request],
        budget: int | Callable[[int], int] = 0,
        on_step: Callable[[StepRecord], None] | None = None,
    ) -> list[RequestOutput]:
        """Run every request to completion; `budget` is fixed or chosen per step from the batch size."""
        budget_for = budget if callable(budget) else (lambda _batch, b=budget: b)
        waiting = list(enumerate(requests))
        done: dict[int, RequestOutput] = {}
        index = {}
        batch = self.start_batch()
        while waiting or len(batch):
            while waiting and batch.has_room():
                i, request = waiting.pop(0)
                finished = batch.admit(request)
                if finished is not None:
                    done[i] = finished
                else:
                    index[id(request)] = i
            record, finished_outputs = batch.step(budget_for(len(batch)))
            if on_step:
                on_step(record)
            for lane_request, output in finished_outputs:
                done[index[id(lane_request)]] = output
        return [done[i] for i in range(len(requests))]

    def _prefill(self, request: Request) -> tuple[Lane, SlotKVCache]:
        if not request.prompt_ids:
            raise ValueError(f"request {request.request_id!r}: prompt_ids is empty; give at least one token")
        lane = Lane(request, self.target.tokenizer, self.target.eos_token_ids, self.tap_width, self.target.device)
        cache = self.target.new_cache(lanes=1, capacity=len(request.prompt_ids) + 64)
        out = self.target.forward(cache, [Segment.chain(request.prompt_ids, 0)], self.tap_layers)
        n = len(request.prompt_ids)
        cache.commit(0, list(range(n)))
        if out.taps is not None:
            lane.append_rows(out.taps[0, :n])
        last = self.target.logits(out.hidden[:, n - 1 : n])
        first = accept_batch(
            [root_only_tree(request.prompt_ids[-1])], last, [request.params], [lane.generator], self.config.acceptance
        )[0]
        lane.commit(first.tokens)
        return lane, cache

    def _draft(
        self,
        lanes: list[Lane],
        budget: int,
        draft_rounds: int,
        tree_width: int,
        lookup: LookupMerge | None,
        sizer: TreeSizer | None,
        acceptance: str,
    ) -> Drafted:
        """Each lane's tree (cut to what pays by `sizer`, if any): the draft phase."""
        if budget <= 1 or self.drafter is None:
            if budget > 1:
                raise ValueError(
                    f"budget={budget} needs a drafter; pass a head (or use budget 0 for ordinary decoding)"
                )
            trees = [root_only_tree(lane.root_token) for lane in lanes]
            return Drafted(trees, 1, DraftTiming([], 0.0), adaptive=sizer is not None)
        spec = budget_spec(self.drafter.max_depth, budget, tree_width, self.config.fanout)
        trees, timing = step_trees(
            self.drafter,
            lanes,
            spec,
            rounds=draft_rounds,
            lookup=lookup,
            draw=acceptance == "draw",
            sizer=sizer,
            cost=self.learners.verify_costs.curve(len(lanes)) if sizer is not None else None,
        )
        adaptive = sizer is not None
        return Drafted(trees, max(tree.size for tree in trees), timing, adaptive=adaptive, sized=adaptive)

    def _step(
        self,
        cache: SlotKVCache,
        lanes: list[Lane],
        budget: int,
        draft_rounds: int,
        tree_width: int,
        lookup: LookupMerge | None,
        sizer: TreeSizer | None,
        acceptance: str,
    ) -> StepRecord:
        """One step, phase by phase as the SGLang worker's (adapter/worker.py `_decode_step`)."""
        clock = StepClock(settle_on=self.target.device)
        drafted = self._draft(lanes, budget, draft_rounds, tree_width, lookup, sizer, acceptance)
        clock.mark("drafted")
        segments = [
            Segment(tree.tokens, tree.positions(int(cache.lengths[b])), tree.ancestor_mask())
            for b, tree in enumerate(drafted.trees)
        ]
        clock.mark("bound")
        out = self.target.forward(cache, segments, self.tap_layers)
        logits = self.target.logits(out.hidden)
        clock.mark("verified")
        results = accept_batch(
            drafted.trees, logits, [lane.params for lane in lanes], [lane.generator for lane in lanes], acceptance
        )
        clock.mark("accepted")
        committed = self._commit(cache, lanes, results, out.taps)
        clock.mark("committed")
        if sizer is not None:
            self.learners.observe(clock, drafted, results)
        gaps = None
        if self.config.rank1_gap:
            gaps = [rank1_branch_gap(tree, logits[b]) for b, tree in enumerate(drafted.trees)]
        return clock.record(
            drafted, budget, [r.accept_length for r in results], committed_tokens=committed, rank1_gaps=gaps
        )

    def _commit(
        self, cache: SlotKVCache, lanes: list[Lane], results: list[AcceptResult], taps: torch.Tensor | None
    ) -> int:
        committed = 0
        for b, (lane, result) in enumerate(zip(lanes, results)):
            # a request that stops mid-path (EOS, max tokens, stop string) keeps only what it committed
            kept = lane.commit(result.tokens)
            path = result.path[:kept]
            cache.commit(b, path)
            if taps is not None:
                lane.append_rows(taps[b, path])
            lane.accept_lengths.append(kept)
            committed += kept
        return committed


class RunningBatch:
    """The requests decoding together: their lanes and the shared slot KV cache.

    Admission and steps run under torch.inference_mode: no autograd bookkeeping on any op. The batch's
    tensors are inference tensors as a result: only code under inference mode may change them in place."""

    def __init__(self, engine: ReferenceEngine) -> None:
        self.engine = engine
        self.cache = engine.target.new_cache(lanes=0)
        self.lanes: list[Lane] = []

    def __len__(self) -> int:
        return len(self.lanes)

    def has_room(self) -> bool:
        return len(self.lanes) < self.engine.config.max_batch_size

    @torch.inference_mode()
    def admit(self, request: Request) -> RequestOutput | None:
        """Prefill a request into the batch; its output if it finished on its first token."""
        lane, lane_cache = self.engine._prefill(request)
        if lane.finish_reason:
            return lane.output()
        self.cache.add_lane(lane_cache)
        self.lanes.append(lane)
        return None

    @torch.inference_mode()
    def step(
        self,
        budget: int,
        draft_rounds: int | None = None,
        tree_width: int | None = None,
        lookup: LookupMerge | None | str = FROM_CONFIG,
        tree_sizing: str | None = None,
        acceptance: str | None = None,
    ) -> tuple[StepRecord, list[tuple[Request, RequestOutput]]]:
        """One verify step for every lane (`draft_rounds`, `tree_width`, `lookup`, the hybrid drafter's
        merge or None for the head alone, `tree_sizing` and `acceptance`, the rule for sampled requests,
        override the engine config's, e.g. from a policy table); finished requests leave the batch and are returned."""
        rounds = self.engine.config.draft_rounds if draft_rounds is None else draft_rounds
        self.engine.check_draft_rounds(rounds)
        width = self.engine.config.tree_width if tree_width is None else tree_width
        merge = self.engine.config.lookup if lookup is FROM_CONFIG else lookup
        if (
            merge is not None and merge.corpus is not None
        ):  # a merge without a corpus looks up the request's own tokens only
            merge = replace(merge, recent=self.engine.recent_outputs)
        sizer = self.engine.sizer_for(tree_sizing or self.engine.config.tree_sizing)
        record = self.engine._step(
            self.cache, self.lanes, budget, rounds, width, merge, sizer, acceptance or self.engine.config.acceptance
        )
        if self.engine.config.check_invariants:
            check_invariants(self.cache, self.lanes)
        finished = [(lane.request, lane.output()) for lane in self.lanes if lane.finish_reason]
        for _, output in finished:
            self.engine.recent_outputs.add(output.output_ids)
        if finished:
            keep = [i for i, lane in enumerate(self.lanes) if not lane.finish_reason]
            self.cache.keep_lanes(keep)
            self.lanes = [self.lanes[i] for i in keep]
        return record, finished
