"""The draft phase of a decode step: each request's tree, drafted on rank 0 and shared with every
tensor-parallel rank (adapter.tensor_parallel), as a `core.step_clock.Drafted`.

What decides a step's trees, in one place: the plan's node budget (capped by what SGLang reserved KV
for: `verify_nodes`), the requests that draft (`RequestDraftState.drafts`), the drafter (the head, or
the hybrid with prompt lookup and the suffix stores), drawn children for sampled requests, a
constrained request's grammar (its root's allowed tokens, the text it forces, pruning, its verify
rows' mask) and adaptive sizing, which cuts the trees to what pays against the verify cost the worker
learns (or first probes an end of that curve).
"""

from __future__ import annotations

import torch
from sglang.srt.observability.req_time_stats import set_time_batch

from policies import StepPlan
from sglang_jetspec.adapter.request_state import RequestDraftState
from sglang_jetspec.adapter.tree_grammar import TreeGrammar
from sglang_jetspec.core.head_drafter import HeadDrafter
from sglang_jetspec.core.prompt_lookup import LookupMerge
from sglang_jetspec.core.step_clock import Drafted, SizingLearners
from sglang_jetspec.core.tree import root_only_trees
from sglang_jetspec.core.tree_drafting import DraftTiming, budget_spec, step_trees
from sglang_jetspec.core.verify_widths import VerifyWidths


def verify_nodes(plan: StepPlan, reserved: int) -> int:
    """The nodes per request a step of `plan` may verify: its budget (>= 1: budget 0 still verifies the
    root), at most the `reserved` nodes SGLang sized KV reservations and buffers for."""
    return max(1, min(plan.budget, reserved))


class StepDrafting:
    """Drafts a step's trees. `reserved`: the verify width SGLang reserved per request
    (speculative_num_draft_tokens); `tree_width`: the head's, where the plan leaves it 0; `widths`: the
    verify widths a step's trees are padded to (none: each step verifies what it drafted)."""

    def __init__(
        self,
        drafter: HeadDrafter,
        hybrid: LookupMerge,
        learners: SizingLearners,
        ranks,
        tokenizer,
        reserved: int,
        tree_width: int,
        device: torch.device,
        widths: VerifyWidths = VerifyWidths(),
    ) -> None:
        self.drafter, self.hybrid, self.learners, self.ranks = drafter, hybrid, learners, ranks
        self.tokenizer, self.reserved, self.tree_width, self.device = tokenizer, reserved, tree_width, device
        self.widths = widths

    def draft(self, batch, lanes: list[RequestDraftState], plan: StepPlan) -> Drafted:
        """The step's trees: rank 0 drafts every request that drafts (the others keep their root alone),
        every rank receives them. A step that times the ordinary end of the verify cost (adaptive sizing's
        probe 1) drafts nothing; the sizer cuts the trees only once both ends are timed."""
        set_time_batch(batch.reqs, "set_spec_draft_start_time", trace_only=True)
        budget = verify_nodes(plan, self.reserved)
        drafting = [b for b, lane in enumerate(lanes) if budget > 1 and lane.drafts]
        costs = self.learners.verify_costs
        probe = costs.probe(len(lanes), budget) if plan.sizes_adaptively else None
        sizing = plan.sizes_adaptively and probe is None
        drafts = self.ranks.drafts and bool(drafting) and probe != 1
        grammar = TreeGrammar.of_batch(batch)
        # a constrained request's first depth holds only what its grammar allows; the text it forces joins
        constrained = drafts and grammar is not None
        root_allowed = [grammar.root_allowed(b) for b in drafting] if constrained else None
        forced = [grammar.forced_tokens(b, self.tokenizer) for b in drafting] if constrained else None
        if not drafts:
            trees, timing = root_only_trees([lane.root_token for lane in lanes]), DraftTiming([], 0.0)
        else:
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
                root_allowed=root_allowed,
                forced=forced,
                prune=grammar.prune if grammar is not None else None,
            )
        trees = self.ranks.shared_trees(trees if self.ranks.drafts else [], lanes)
        set_time_batch(batch.reqs, "set_spec_draft_end_time", trace_only=True)
        # trees cut by sizing or by grammars verify as many nodes as the longest of them, padded to a
        # verify width a captured graph serves
        longest = max(tree.size for tree in trees) if plan.sizes_adaptively or grammar is not None else budget
        num_nodes = self.widths.width_for(longest)
        mask = grammar.mask(trees, num_nodes, self.device) if grammar is not None else None
        sized = drafts and sizing
        return Drafted(trees, num_nodes, timing, adaptive=plan.sizes_adaptively, sized=sized, verify_mask=mask)
