"""The draft phase of a decode step: each request's tree, drafted on rank 0 and shared with every
tensor-parallel rank (adapter.tensor_parallel), as a `core.step_clock.Drafted`.

What decides a step's trees, in one place: the plan's node budget (capped by what SGLang reserved KV
for: `verify_nodes`), the requests that draft (`RequestDraftState.drafts`), the drafter (the head, or the hybrid with
prompt lookup and the suffix stores), drawn children for sampled requests, a constrained request's
grammar (its root's allowed tokens, the text it forces, pruning) and adaptive sizing, which cuts the
trees to what pays against the verify cost the worker learns (or first probes an end of that curve).
"""

from __future__ import annotations

from sglang.srt.observability.req_time_stats import set_time_batch

from policies import StepPlan
from sglang_jetspec.adapter.request_state import RequestDraftState
from sglang_jetspec.adapter.tree_grammar import TreeGrammar
from sglang_jetspec.core.head_drafter import HeadDrafter
from sglang_jetspec.core.prompt_lookup import LookupMerge
from sglang_jetspec.core.step_clock import Drafted, SizingLearners
from sglang_jetspec.core.tree import DraftTree, root_only_tree
from sglang_jetspec.core.tree_drafting import DraftTiming, budget_spec, step_trees


def verify_nodes(plan: StepPlan, reserved: int) -> int:
    """The nodes per request a step of `plan` may verify: its budget (>= 1: budget 0 still verifies the
    root), at most the `reserved` nodes SGLang sized KV reservations and buffers for."""
    return max(1, min(plan.budget, reserved))


class StepDrafting:
    """Drafts a step's trees. `reserved`: the verify width SGLang reserved per request
    (speculative_num_draft_tokens); `tree_width`: the head's, where the plan leaves it 0."""

    def __init__(
        self,
        drafter: HeadDrafter,
        hybrid: LookupMerge,
        learners: SizingLearners,
        ranks,
        tokenizer,
        reserved: int,
        tree_width: int,
    ) -> None:
        self.drafter, self.hybrid, self.learners, self.ranks = drafter, hybrid, learners, ranks
        self.tokenizer, self.reserved, self.tree_width = tokenizer, reserved, tree_width

    def sizes_adaptively(self, plan: StepPlan) -> bool:
        """A step of `plan` sizes its trees adaptively (and learns from them)."""
        return plan.tree_sizing == "adaptive" and verify_nodes(plan, self.reserved) > 1

    def draft(self, batch, lanes: list[RequestDraftState], plan: StepPlan, grammar: TreeGrammar | None) -> Drafted:
        set_time_batch(batch.reqs, "set_spec_draft_start_time", trace_only=True)
        budget, adaptive = verify_nodes(plan, self.reserved), self.sizes_adaptively(plan)
        if self.ranks.drafts:
            trees, timing, sized = self._trees(lanes, plan, budget, adaptive, grammar)
        else:
            trees, timing, sized = [], DraftTiming([], 0.0), False
        if self.ranks.size > 1:
            trees = self._agree_on_trees(trees, lanes)
        set_time_batch(batch.reqs, "set_spec_draft_end_time", trace_only=True)
        # trees cut by sizing or by grammars verify as many nodes as the longest of them
        num_nodes = max(tree.size for tree in trees) if adaptive or grammar is not None else budget
        return Drafted(trees, num_nodes, timing, adaptive=adaptive, sized=sized)

    def _trees(
        self, lanes: list[RequestDraftState], plan: StepPlan, budget: int, adaptive: bool, grammar: TreeGrammar | None
    ) -> tuple[list[DraftTree], DraftTiming, bool]:
        """Each request's tree (root-only for budget 1 and for requests that do not draft), the head and tree seconds,
        and whether the sizer cut them (not on a step that times a missing end of the verify cost)."""
        trees = [root_only_tree(lane.root_token) for lane in lanes]
        drafting = [b for b, lane in enumerate(lanes) if budget > 1 and lane.drafts]
        costs = self.learners.verify_costs
        probe = costs.probe(len(lanes), budget) if adaptive else None
        if not drafting or probe == 1:  # probe 1: time an ordinary step, without draft work
            return trees, DraftTiming([], 0.0), False
        sizing = adaptive and probe is None
        trees, timing = step_trees(
            self.drafter,
            lanes,
            budget_spec(self.drafter.max_depth, budget, plan.tree_width or self.tree_width),
            rounds=plan.draft_rounds,
            lookup=self.hybrid if plan.drafter == "hybrid" else None,
            draw=plan.sampled_children == "drawn",
            sizer=self.learners.sizer if sizing else None,
            cost=costs.curve(len(lanes)) if sizing else None,
            drafting=drafting,
            root_allowed=[grammar.root_allowed(b) for b in drafting] if grammar is not None else None,
            forced=[grammar.forced_tokens(b, self.tokenizer) for b in drafting] if grammar is not None else None,
            prune=grammar.prune if grammar is not None else None,
        )
        return trees, timing, sizing

    def _agree_on_trees(self, trees: list[DraftTree], lanes: list[RequestDraftState]) -> list[DraftTree]:
        """Rank 0's trees on every rank, with the generator state of each sampled request (rank 0's
        drafting may have drawn from it; acceptance draws next), checked equal before the verify."""
        states = [None if lane.params.greedy else lane.generator.get_state() for lane in lanes]
        trees, states = self.ranks.share((trees, states) if self.ranks.drafts else None)
        for lane, state in zip(lanes, states):
            if state is not None:
                lane.generator.set_state(state)
        trees = self.ranks.received_trees(trees)
        self.ranks.agree("trees", [t for tree in trees for t in (tree.tokens, tree.parents)])
        return trees
