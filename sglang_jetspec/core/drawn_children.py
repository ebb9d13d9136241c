"""Drawn children: a sampled request's draft children drawn from the head's distribution, not its top-K.

With deterministic (top-K) children, a node accepts with probability p(children), the target's mass on
them: at T = 1 on HumanEval 0-15 the head's top-1 carries 0.32 of it on average, although the target's
own mode carries 0.58. Drawing a child from the draft distribution q and accepting it with probability
min(1, p(x) / q(x)) accepts with probability sum(min(p, q)) = 0.39 instead, and two children drawn
without replacement 0.49 against 0.43 for the top two (fp32 replay, bench/results/speed/).

The tree's shape still comes from best-first construction on the head's scores; only the tokens of
the children the head proposed from its per-depth marginals are redrawn, parent before child, each
node's children in rank order, without replacement from q_d = softmax(head logits at depth d / T).
Looked-up (prompt-lookup or corpus) children keep their token and count as point-mass proposals, and
are left out of the draws, so no two siblings share a token. The shape depends only on scores, never on
what was drawn, and a drawn node's subtree holds marginal children only, so redrawing its token never
invalidates what lies below it.

Acceptance (`core/acceptance.py`, method "draw") tries a node's children in rank order with recursive
rejection: child j, drawn from q_j (q_d without the tokens `excluded` records for it, renormalised), is
accepted with probability min(1, r(x) / q_j(x)); a rejection leaves r = normalise(max(r - q_j, 0));
a point-mass child is accepted with probability r(x), a rejection zeroes x. If none is accepted, the
emitted token is drawn from what r has left. Each step emits exactly r's distribution whatever the
proposal, as long as the proposal was fixed before the target's coins were thrown (SpecInfer; Jeon et
al., recursive speculative decoding), so the whole walk emits the processed target distribution.
Greedy requests never draw: their acceptance stays the argmax walk.
"""

from __future__ import annotations

import torch

from .tree import DraftTree, DrawnChildren


def proposals_from_logits(depth_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[D+1, V_d] float64 per-depth draft distributions at the request's temperature (row 0 unused)."""
    probs = torch.softmax(depth_logits.double() / temperature, dim=-1)
    return torch.cat([torch.zeros(1, probs.shape[-1], dtype=probs.dtype), probs])


def _columns(tokens: set[int], vocab: torch.Tensor | None) -> list[int]:
    """The proposal columns of `tokens` (those outside a reduced vocabulary have none)."""
    if vocab is None or not tokens:
        return sorted(tokens)
    return (vocab.unsqueeze(1) == torch.tensor(sorted(tokens))).any(1).nonzero().flatten().tolist()


def draw_children(
    tree: DraftTree,
    fixed: dict[tuple[int, ...], set[int]],
    proposals: torch.Tensor,
    vocab: torch.Tensor | None,
    generator: torch.Generator,
) -> DraftTree:
    """`tree` with the tokens of its marginal children redrawn (the module docstring), `tree.drawn` set.

    `fixed` maps a node's token path to the tokens looked up for its children (the hybrid drafter's
    guesses): those children keep their token, and the node's draws leave them out. A node whose
    proposal has fewer tokens than it has children to draw keeps its children as they are."""
    tokens, depths = tree.tokens.tolist(), tree.depths.tolist()
    paths = tree.token_paths()  # the build's own paths: `fixed` is keyed by them
    drawn: dict[int, tuple[int, list[int]]] = {}
    for node, kids in enumerate(tree.children()):
        # a drawn node's own build path was never looked up (it was a marginal child), so this is empty for it
        looked_up = fixed.get(paths[node], set())
        slots = [c for c in kids if tokens[c] not in looked_up]
        if not slots or depths[node] + 1 >= proposals.shape[0]:
            continue
        banned = _columns(looked_up, vocab)
        q = proposals[depths[node] + 1].clone()
        q[banned] = 0.0
        if int((q > 0).sum()) < len(slots):
            continue
        columns = torch.multinomial(q, len(slots), replacement=False, generator=generator).tolist()
        for j, (child, column) in enumerate(zip(slots, columns)):
            drawn[child] = (column, banned + columns[:j])
            tokens[child] = column if vocab is None else int(vocab[column])
    return DraftTree(
        torch.tensor(tokens, dtype=torch.long),
        tree.parents,
        tree.depths,
        tree.ranks,
        tree.cum_logprobs,
        drawn=DrawnChildren(proposals, vocab, drawn) if drawn else None,
    )
