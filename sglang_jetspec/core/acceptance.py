"""Which drafted tokens a request keeps after the target scored every tree node, batched over requests.

Greedy: follow the child whose token is the target argmax, as deep as possible; the argmax at the
deepest accepted node is the bonus token. Stochastic, two lossless rules for deterministic (top-K)
drafts, selectable per call:
  * "match" (sample then match): draw the target's token at every node from its processed
    distribution; follow the child whose token equals the draw; the draw at the last node is emitted.
  * "residual" (SpecInfer-style recursive rejection with point-mass proposals): at a node, try the
    children in rank order; accept child token t with probability p(t); on rejection set p(t) = 0 and
    renormalise; if every child is rejected, draw the correction from what is left.
And for trees whose children were drawn from the draft distribution (core/drawn_children.py):
  * "draw": the same recursion, with each drawn child accepted with probability min(1, r(t) / q(t))
    under the proposal q it was drawn from, and a rejection leaving normalise(max(r - q, 0)).
All three emit exactly the processed target distribution at every position. All randomness comes from
uniforms drawn from each request's own generator, so a seed reproduces a request whatever its batch.

Sample-then-match draws at every node of the sampled trees in one pass where the logits live, in chunks
of at most SAMPLED_ELEMENTS_PER_CHUNK rows x vocabulary, each top-k / top-p draw from its largest
candidates alone (their masses in vocabulary order: the inverse CDF of the full distribution), and copies
the draws to the host once (a walk depth by depth would read the device once per depth). The residual
and drawn rules turn into probabilities only the nodes the walk visits (`visited_probs`, one [V] row per
visited node, depth by depth): a batch's [B, N, V] logits never become a [B, N, V] distribution at once
(GBs at B=24, N=32, V=152k).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import Kept, SamplingParams, kept_candidates, processed_probs
from .tree import DraftTree, padded_trees

METHODS = ("match", "residual", "draw")


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
        """The batch's trees padded to the largest, in a fixed number of tensor ops whatever the batch size:
        a node's sibling rank is the number of earlier nodes with its parent (children in index order)."""
        batch, n = len(trees), max(t.size for t in trees)
        tokens, parents, _ = padded_trees(trees, n)  # no child links reach a padding node
        nodes = torch.arange(n)
        earlier_sibling = (parents[:, :, None] == parents[:, None, :]) & (nodes[None, None, :] < nodes[None, :, None])
        rank = earlier_sibling.sum(-1)  # [B, N]
        child = parents >= 0
        k = int(torch.where(child, rank + 1, 1).max())  # the largest fanout, at least 1
        child_index = torch.full((batch, n, k), -1, dtype=torch.long)
        lane = torch.arange(batch)[:, None].expand(batch, n)
        child_index[lane[child], parents[child], rank[child]] = nodes.expand(batch, n)[child]
        child_token = torch.where(
            child_index >= 0, tokens.gather(1, child_index.clamp(min=0).flatten(1)).view_as(child_index), -1
        )
        return cls(tokens, child_index, child_token, max(t.max_depth for t in trees))


def target_argmax(logits: torch.Tensor) -> torch.Tensor:
    """argmax over the last dimension, ties to the first index (as torch.argmax, SGLang's greedy sampler).
    Through `max`, whose CPU kernel is vectorised in every dtype where `argmax`'s is not
    (docs/design/reference-engine.md, "Measured costs behind code choices"); both return the first
    maximum, so the same index wins."""
    return logits.max(-1).indices


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: token i with cdf[i-1] <= u*total < cdf[i]; zero-probability tokens are never hit."""
    cdf = probs.double().cumsum(-1)
    target = uniforms.double().unsqueeze(-1) * cdf[..., -1:]
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)


def reject_token(probs: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> None:
    """Residual step after rejecting `tokens` at `rows`: remove the rejected token and renormalise."""
    probs[rows, tokens] = 0.0
    probs[rows] /= probs[rows].sum(-1, keepdim=True).clamp(min=1e-30)


def visited_probs(logits: torch.Tensor, params: list[SamplingParams], rows: torch.Tensor, nodes: torch.Tensor):
    """Processed target distribution at node nodes[i] of request rows[i]: [len(rows), V] float32.

    `logits` are [B, N, V] and `params` has one entry per request; only the named rows are processed,
    those with identical distribution parameters together.
    """
    picked = logits[rows.to(logits.device), nodes.to(logits.device)]
    groups = _groups(params, rows.tolist())
    if len(groups) == 1:
        return processed_probs(picked, next(iter(groups)))
    out = torch.empty(len(rows), logits.shape[-1], dtype=torch.float32, device=logits.device)
    for group, members in groups.items():
        idx = torch.tensor(members, device=logits.device)
        out[idx] = processed_probs(picked[idx], group)
    return out


def _groups(params: list[SamplingParams], requests: list[int]) -> dict[SamplingParams, list[int]]:
    """Positions into `requests` grouped by what shapes a request's distribution (a seed or a stop list
    does not), keyed by the first member's parameters: a batch of requests that differ only in their
    seeds is processed in one go, not one request at a time."""
    keys: dict[tuple, SamplingParams] = {}
    groups: dict[SamplingParams, list[int]] = {}
    for i, b in enumerate(requests):
        first = keys.setdefault(_distribution_key(params[b]), params[b])
        groups.setdefault(first, []).append(i)
    return groups


def _distribution_key(params: SamplingParams) -> tuple:
    """What processed_probs reads of a request's parameters."""
    return (params.temperature, params.top_p, params.top_k, params.min_p)


def sample_kept(kept: Kept, uniforms: torch.Tensor) -> torch.Tensor:
    """`sample_from_probs` of the distribution `kept` stands for, from its candidates alone: their masses
    laid out in vocabulary order give the same inverse CDF (the vocabulary's other tokens add nothing),
    so a uniform draws the token it draws from the renormalised [V] distribution."""
    if kept.ids is None:
        return sample_from_probs(kept.masses, uniforms)
    ids, order = kept.ids.sort(-1)
    at = sample_from_probs(kept.masses.gather(-1, order), uniforms)
    return ids.gather(-1, at.unsqueeze(-1)).squeeze(-1)


# rows x vocabulary of target distributions processed at once when sampled requests draw at every node
SAMPLED_ELEMENTS_PER_CHUNK = 1 << 25


def _sample_nodes(
    sizes: list[int],
    logits: torch.Tensor,
    params: list[SamplingParams],
    origin: torch.Tensor,
    uniforms: torch.Tensor,
    choice: torch.Tensor,
) -> None:
    """Sample-then-match's draws at every node of every sampled request at once: row i (the batch's request
    origin[i], its row of `logits` and `params`) gets the target's draw at nodes 0..sizes[i]-1 in
    `choice` [S, N], from its uniform there. The walk reads only the nodes it reaches, whose draws are
    the ones a depth-by-depth walk would make; drawing them all costs one device-to-host copy a step
    instead of one per depth, and memory bounded per chunk of rows (SAMPLED_ELEMENTS_PER_CHUNK). A
    top-k / top-p row draws from its first candidates (`kept_candidates`); the rare row whose top-p mass
    lies past them is redone from its exact distribution after the copy."""
    rows = torch.tensor([i for i, n in enumerate(sizes) for _ in range(n)], dtype=torch.long)
    nodes = torch.tensor([k for n in sizes for k in range(n)], dtype=torch.long)
    device = logits.device
    chunk = max(1, SAMPLED_ELEMENTS_PER_CHUNK // logits.shape[-1])
    places, draws, checks = [], [], []  # per group of a chunk: its positions into rows (host), draws, check
    for start in range(0, len(rows), chunk):
        r, k = origin[rows[start : start + chunk]], nodes[start : start + chunk]
        picked = logits[r.to(device), k.to(device)]
        for group, members in _groups(params, r.tolist()).items():
            at = torch.tensor(members, dtype=torch.long)
            kept = kept_candidates(picked if len(members) == len(r) else picked[at.to(device)], group)
            at += start
            places.append(at)
            draws.append(sample_kept(kept, uniforms[rows[at], nodes[at]].to(device)))
            checks.append(kept.sufficed)
    # the draws and whether each row's candidates sufficed, in one copy
    host = torch.cat([*draws, *(c.long() for c in checks if c is not None)]).cpu()
    at = torch.cat(places)
    drawn = torch.empty(len(rows), dtype=torch.long)
    drawn[at] = host[: len(rows)]
    sufficed = torch.ones(len(rows), dtype=torch.bool)
    offset = len(rows)
    for place, check in zip(places, checks):
        if check is not None:
            sufficed[place] = host[offset : offset + len(place)].bool()
            offset += len(place)
    short = (~sufficed).nonzero().squeeze(-1)
    if len(short):  # rare: some row's top-p mass lies past its first candidates; redo those exactly
        r, k = origin[rows[short]], nodes[short]
        drawn[short] = sample_from_probs(visited_probs(logits, params, r, k), uniforms[rows[short], k]).cpu()
    choice[rows, nodes] = drawn


def _walk_matching(padded: _PaddedTrees, choice: torch.Tensor) -> tuple[list[list[int]], list[int]]:
    """Follow, from the root, the child whose token equals `choice` at its parent ([B, N] tokens).

    Returns, per row, the accepted path of node indices and the choice at its last node. The walk runs
    on host lists: a few comparisons per depth, where a tensor op per depth costs microseconds. Among
    siblings sharing a token the first in rank order is taken."""
    children, child_tokens = padded.child_index.tolist(), padded.child_token.tolist()
    paths, finals = [], []
    for b, row in enumerate(choice.tolist()):
        path = [0]
        while len(path) <= padded.max_depth:
            here = child_tokens[b][path[-1]]
            if row[path[-1]] not in here:
                break
            path.append(children[b][path[-1]][here.index(row[path[-1]])])
        paths.append(path)
        finals.append(row[path[-1]])
    return paths, finals


def _walk_residual(
    padded: _PaddedTrees,
    logits: torch.Tensor,
    params: list[SamplingParams],
    origin: torch.Tensor,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recursive rejection down the tree; uniforms are [B, D+1, K+1] (K child trials + 1 correction).
    Row i is the batch's request origin[i] (its row of `logits` [B_all, N, V] and `params`); at each
    depth only the rows still walking get their node's distribution.

    Returns the accepted path [B, D+1] and the emitted correction/bonus token per row.
    """
    batch, k = len(origin), padded.child_index.shape[-1]
    cur = torch.zeros(batch, dtype=torch.long)
    active = torch.ones(batch, dtype=torch.bool)
    final = torch.zeros(batch, dtype=torch.long)
    path = torch.full((batch, padded.max_depth + 1), -1, dtype=torch.long)
    path[:, 0] = 0
    for step in range(padded.max_depth + 1):
        live = torch.arange(batch)[active]
        if not len(live):
            break
        node = cur[live]
        p = visited_probs(
            logits, params, origin[live], node
        ).cpu()  # one fresh [V] row per live request: the step edits it
        local = torch.arange(len(live))
        moved = torch.zeros(len(live), dtype=torch.bool)
        nxt = node.clone()
        for r in range(k):
            child = padded.child_index[live, node, r]
            token = padded.child_token[live, node, r].clamp(min=0)
            trying = ~moved & (child >= 0)
            accept = trying & (uniforms[live, step, r] < p[local, token])
            nxt = torch.where(accept, child, nxt)
            moved |= accept
            rejected = trying & ~accept
            if rejected.any():
                reject_token(p, local[rejected], token[rejected])
        if (~moved).any():
            final[live[~moved]] = sample_from_probs(p[~moved], uniforms[live[~moved], step, k])
        active[live] = moved
        cur[live] = nxt
        if step + 1 <= padded.max_depth:
            path[live[moved], step + 1] = nxt[moved]
    return path, final


def reject_drawn(r: torch.Tensor, q: torch.Tensor, vocab: torch.Tensor | None) -> float:
    """Residual after rejecting a child drawn from q ([V_d] over `vocab`'s columns, scaled to r's total):
    r = max(r - q, 0) in place, unnormalised; returns the mass it took away."""
    at = slice(None) if vocab is None else vocab
    removed = float(torch.minimum(r[at], q).sum())  # r - max(r - q, 0) = min(r, q)
    r[at] = (r[at] - q).clamp(min=0.0)
    return removed


def _walk_drawn(
    tree: DraftTree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[list[int], int]:
    """Recursive rejection down one request's tree (`logits` [N, V]), drawn children against the proposal
    they were drawn from and the others as point masses (the module docstring). One request at a time:
    drawn proposals differ per request, and the walk visits a node or two per depth. Uniforms come from
    the request's generator, as many per visited node as it has children, plus one."""
    drawn, kids, tokens, depths = tree.drawn, tree.children(), tree.tokens.tolist(), tree.depths.tolist()
    path = [0]
    while True:
        node = path[-1]
        # r stays unnormalised, its mass tracked in `total`: a rejection then touches the proposal's
        # columns only, not the whole vocabulary
        r = processed_probs(logits[node : node + 1], params)[0].double().cpu()
        total = float(r.sum())
        uniforms = torch.rand(len(kids[node]) + 1, generator=generator, dtype=torch.float64).tolist()
        accepted = None
        for child, u in zip(kids[node], uniforms):
            token = tokens[child]
            if drawn is not None and child in drawn.drawn:
                q = drawn.proposal(child, depths[child])
                if u * float(q[drawn.drawn[child][0]]) * total < float(r[token]):  # u < min(1, (r / total) / q)
                    accepted = child
                    break
                total -= reject_drawn(r, q * total, drawn.vocab)
            else:
                if u * total < float(r[token]):
                    accepted = child
                    break
                total -= float(r[token])
                r[token] = 0.0
        if accepted is None:
            return path, int(sample_from_probs(r, torch.tensor(uniforms[-1], dtype=torch.float64)))
        path.append(accepted)


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
    is_greedy = [p.greedy for p in params]
    greedy = torch.tensor(is_greedy)
    # Work where the logits live (a GPU in SGLang) and copy to the host only what the walk reads:
    # [B, N] ids for greedy rows, one processed [V] row per visited node for sampled rows (whose
    # argmax nobody reads: an all-sampled batch skips it).
    if bool(greedy.all()):
        choice = target_argmax(logits).cpu()
    else:
        choice = torch.zeros(batch, logits.shape[1], dtype=torch.long)
        if bool(greedy.any()):
            rows = greedy.nonzero().squeeze(-1)
            choice[rows] = target_argmax(logits[rows.to(logits.device)]).cpu()

    residual_rows = [] if method == "match" else [b for b in range(batch) if not is_greedy[b]]
    residual_set = set(residual_rows)
    match_rows = [b for b in range(batch) if b not in residual_set]
    results: list[AcceptResult | None] = [None] * batch
    node_tokens = padded.tokens.tolist()  # every tree's tokens, read once for the results

    if match_rows:
        idx = torch.tensor(match_rows)
        whole = len(match_rows) == batch  # the usual case: no copies of the batch's trees
        sub = padded if whole else _subset(padded, idx)
        sub_choice = choice if whole else choice[idx].clone()
        sampled = [j for j, b in enumerate(match_rows) if not is_greedy[b]]
        if sampled:
            # one uniform per node of the request's own tree, from its own generator; a node's uniform
            # is used only if the walk reaches it
            uniforms = torch.zeros(len(sampled), sub.tokens.shape[1], dtype=torch.float64)
            for i, j in enumerate(sampled):
                b = match_rows[j]
                uniforms[i, : trees[b].size] = torch.rand(trees[b].size, generator=generators[b], dtype=torch.float64)
            at = torch.tensor(sampled)
            drawn = sub_choice[at]
            sizes = [trees[match_rows[j]].size for j in sampled]
            _sample_nodes(sizes, logits, params, idx[at], uniforms, drawn)
            sub_choice[at] = drawn
        paths, finals = _walk_matching(sub, sub_choice)
        for j, b in enumerate(match_rows):
            results[b] = _result(node_tokens[b], paths[j], finals[j])

    if residual_rows and method == "draw":
        for b in residual_rows:
            path, final = _walk_drawn(trees[b], logits[b], params[b], generators[b])
            results[b] = _result(node_tokens[b], path, final)
    elif residual_rows:
        idx = torch.tensor(residual_rows)
        sub = _subset(padded, idx)
        uniforms = _residual_uniforms(sub, [trees[b] for b in residual_rows], [generators[b] for b in residual_rows])
        path, final = _walk_residual(sub, logits, params, idx, uniforms)
        for j, b in enumerate(residual_rows):
            results[b] = _result(node_tokens[b], [n for n in path[j].tolist() if n >= 0], int(final[j]))
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


def _result(tokens: list[int], path: list[int], final_token: int) -> AcceptResult:
    """`tokens`: the tree's node tokens (padded past its size: the path never reaches the padding)."""
    return AcceptResult(path=path, tokens=[tokens[n] for n in path[1:]] + [final_token])
