"""Which drafted tokens a request keeps after the target scored every tree node, batched over requests.

Greedy: follow the child whose token is the target argmax, as deep as possible; the argmax at the
deepest accepted node is the bonus token. Stochastic, two lossless rules for deterministic (top-K)
drafts, selectable per call:
  * "match" (sample then match): draw the target's token at every node from its processed
    distribution; follow the child whose token equals the draw; the draw at the last node is emitted.
  * "residual" (SpecInfer-style recursive rejection with point-mass proposals): at a node, try the
    children in rank order; accept child token t with probability p(t); on rejection set p(t) = 0 and
    renormalise; if every child is rejected, draw the correction from what is left.
Both emit exactly the processed target distribution at every position. All randomness comes from
uniforms drawn from each request's own generator, so a seed reproduces a request whatever its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import SamplingParams, processed_probs
from .tree import DraftTree

METHODS = ("match", "residual")


@dataclass
class AcceptResult:
    path: list[int]  # accepted node indices from the root (index 0) down; KV/hidden rows kept for these
    tokens: list[int]  # committed tokens: the accepted drafted tokens, then the bonus/correction token

    @property
    def accept_length(self) -> int:
        """Committed tokens for this verify, bonus included (= len(path))."""
        return len(self.tokens)


@dataclass
class _PaddedTrees:
    tokens: torch.Tensor  # [B, N]
    child_index: torch.Tensor  # [B, N, K] child node index in rank order, -1 = none
    child_token: torch.Tensor  # [B, N, K] token of that child, -1 = none
    max_depth: int

    @classmethod
    def from_trees(cls, trees: list[DraftTree]) -> "_PaddedTrees":
        batch, n = len(trees), max(t.size for t in trees)
        k = max(t.child_table.shape[1] for t in trees)
        tokens = torch.zeros(batch, n, dtype=torch.long)
        child_index = torch.full((batch, n, k), -1, dtype=torch.long)
        for b, tree in enumerate(trees):
            tokens[b, : tree.size] = tree.tokens
            child_index[b, : tree.size, : tree.child_table.shape[1]] = tree.child_table
        child_token = torch.where(child_index >= 0, tokens.gather(1, child_index.clamp(min=0).flatten(1)).view_as(child_index), -1)
        return cls(tokens, child_index, child_token, max(t.max_depth for t in trees))


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: token i with cdf[i-1] <= u*total < cdf[i]; zero-probability tokens are never hit."""
    cdf = probs.double().cumsum(-1)
    target = uniforms.double().unsqueeze(-1) * cdf[..., -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def reject_token(probs: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> None:
    """Residual step after rejecting `tokens` at `rows`: remove the rejected token and renormalise."""
    probs[rows, tokens] = 0.0
    probs[rows] /= probs[rows].sum(-1, keepdim=True).clamp(min=1e-30)


def node_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Processed target distribution at every node: [B, N, V] from [B, N, V] logits.

    Rows with identical sampling parameters are processed together.
    """
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    groups: dict[SamplingParams, list[int]] = {}
    for b, p in enumerate(params):
        groups.setdefault(p, []).append(b)
    for p, rows in groups.items():
        idx = torch.tensor(rows, device=logits.device)
        out[idx] = processed_probs(logits[idx], p)
    return out


def _walk_matching(padded: _PaddedTrees, choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Follow, from the root, the child whose token equals `choice` at its parent ([B, N] tokens).

    Returns the accepted path as [B, D+1] node indices (-1 padded) and the final node per row.
    """
    batch = choice.shape[0]
    rows = torch.arange(batch)
    cur = torch.zeros(batch, dtype=torch.long)
    active = torch.ones(batch, dtype=torch.bool)
    path = torch.full((batch, padded.max_depth + 1), -1, dtype=torch.long)
    path[:, 0] = 0
    for step in range(1, padded.max_depth + 1):
        match = (padded.child_token[rows, cur] == choice[rows, cur].unsqueeze(-1)) & active.unsqueeze(-1)
        found = match.any(-1)
        nxt = padded.child_index[rows, cur, match.long().argmax(-1)]
        cur = torch.where(found, nxt, cur)
        path[found, step] = cur[found]
        active &= found
        if not active.any():
            break
    return path, cur


def _walk_residual(padded: _PaddedTrees, probs: torch.Tensor, uniforms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Recursive rejection down the tree; uniforms are [B, D+1, K+1] (K child trials + 1 correction).

    Returns the accepted path [B, D+1] and the emitted correction/bonus token per row.
    """
    batch, k = probs.shape[0], padded.child_index.shape[-1]
    rows = torch.arange(batch)
    cur = torch.zeros(batch, dtype=torch.long)
    active = torch.ones(batch, dtype=torch.bool)
    final = torch.zeros(batch, dtype=torch.long)
    path = torch.full((batch, padded.max_depth + 1), -1, dtype=torch.long)
    path[:, 0] = 0
    for step in range(padded.max_depth + 1):
        p = probs[rows.to(probs.device), cur.to(probs.device)].cpu()  # a fresh [B, V] copy: the step edits it
        moved = torch.zeros(batch, dtype=torch.bool)
        nxt = cur.clone()
        for r in range(k):
            child = padded.child_index[rows, cur, r]
            token = padded.child_token[rows, cur, r].clamp(min=0)
            trying = active & ~moved & (child >= 0)
            accept = trying & (uniforms[:, step, r] < p[rows, token])
            nxt = torch.where(accept, child, nxt)
            moved |= accept
            rejected = trying & ~accept
            if rejected.any():
                reject_token(p, rows[rejected], token[rejected])
        stopping = active & ~moved
        if stopping.any():
            final[stopping] = sample_from_probs(p[stopping], uniforms[stopping, step, k])
        active &= moved
        cur = nxt
        if step + 1 <= padded.max_depth:
            path[moved, step + 1] = cur[moved]
        if not active.any():
            break
    return path, final


def accept_batch(
    trees: list[DraftTree],
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator],
    method: str = "match",
) -> list[AcceptResult]:
    """Acceptance for B requests: target `logits` [B, N_max, V] for each request's tree nodes."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}: choose one of {METHODS}")
    padded = _PaddedTrees.from_trees(trees)
    logits = logits[:, : padded.tokens.shape[1]]
    batch = len(trees)
    greedy = torch.tensor([p.greedy for p in params])
    # Work where the logits live (a GPU in SGLang) and copy to the host only what the walk reads:
    # [B, N] ids for greedy and sample-then-match rows, one [V] row per visited node for residual rows.
    choice = logits.argmax(-1).cpu()
    probs = None
    if not bool(greedy.all()):
        probs = node_probs(logits.float(), params)

    residual_rows = [] if method == "match" else [b for b in range(batch) if not greedy[b]]
    residual_set = set(residual_rows)
    match_rows = [b for b in range(batch) if b not in residual_set]
    results: list[AcceptResult | None] = [None] * batch

    if match_rows:
        idx = torch.tensor(match_rows)
        sub = _subset(padded, idx)
        sub_choice = choice[idx].clone()
        sampled = [j for j, b in enumerate(match_rows) if not greedy[b]]
        if sampled:
            # one uniform per node of the request's own tree, from its own generator
            uniforms = torch.zeros(len(sampled), sub.tokens.shape[1], dtype=torch.float64)
            for i, j in enumerate(sampled):
                b = match_rows[j]
                uniforms[i, : trees[b].size] = torch.rand(trees[b].size, generator=generators[b], dtype=torch.float64)
            rows = torch.tensor([match_rows[j] for j in sampled], device=probs.device)
            sub_choice[torch.tensor(sampled)] = sample_from_probs(probs[rows], uniforms.to(probs.device)).cpu()
        path, last = _walk_matching(sub, sub_choice)
        finals = sub_choice[torch.arange(len(match_rows)), last]
        for j, b in enumerate(match_rows):
            results[b] = _result(trees[b], path[j], int(finals[j]))

    if residual_rows:
        idx = torch.tensor(residual_rows)
        sub = _subset(padded, idx)
        path, final = _walk_residual(sub, probs[idx.to(probs.device)], _residual_uniforms(sub, [trees[b] for b in residual_rows], [generators[b] for b in residual_rows]))
        for j, b in enumerate(residual_rows):
            results[b] = _result(trees[b], path[j], int(final[j]))
    return results  # type: ignore[return-value]


def _residual_uniforms(padded: _PaddedTrees, trees: list[DraftTree], generators: list[torch.Generator]) -> torch.Tensor:
    """[B, D+1, K+1] uniforms; each request draws only for its own tree's depth and fanout, so its
    stream does not depend on the other requests in the batch."""
    k = padded.child_index.shape[-1]
    out = torch.zeros(len(trees), padded.max_depth + 1, k + 1, dtype=torch.float64)
    for b, (tree, gen) in enumerate(zip(trees, generators)):
        depth, fanout = tree.max_depth, tree.child_table.shape[1]
        u = torch.rand(depth + 1, fanout + 1, generator=gen, dtype=torch.float64)
        out[b, : depth + 1, :fanout] = u[:, :fanout]
        out[b, : depth + 1, k] = u[:, fanout]
    return out


def _subset(padded: _PaddedTrees, idx: torch.Tensor) -> _PaddedTrees:
    return _PaddedTrees(padded.tokens[idx], padded.child_index[idx], padded.child_token[idx], padded.max_depth)


def _result(tree: DraftTree, path_row: torch.Tensor, final_token: int) -> AcceptResult:
    path = [int(n) for n in path_row.tolist() if n >= 0]
    drafted = tree.tokens[path[1:]].tolist()
    return AcceptResult(path=path, tokens=drafted + [final_token])
