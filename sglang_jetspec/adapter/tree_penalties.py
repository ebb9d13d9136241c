"""SGLang's per-request penalties on tree-verify logits, exactly as a plain decode applies them (pure PyTorch).

A plain SGLang decode of output position p (sampling/penaltylib) penalises the logits with the
request's output tokens before p: frequency (minus frequency_penalty per occurrence, accumulated one
token at a time), presence (minus presence_penalty once a token occurred), min_new_tokens (-inf on
the stop tokens while p < min_new_tokens), all summed into one additive row, then repetition
(scaling: logits below 0 times the penalty, others divided by it) on the tokens that occurred. The
prompt does not count.

SGLang's own speculative path (eagle_prepare_for_decode) advances that state by one token per verify
step and repeats it over every node, "a relaxed version of penalties": the output then differs from
plain SGLang. Here a tree node at depth d (the root's row decodes position k = tokens output so far)
decodes position k + d, after the request's output tokens and the d tokens on its path below the
root; its row gets exactly the penalties a plain decode at k + d would. The state is rebuilt from
the request's committed output every step, so it needs no bookkeeping across steps, retractions or
batch changes. Float order follows SGLang's: each occurrence adds the penalty once (never
count x penalty, which rounds differently), the additive row is summed before the scaling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_jetspec.core.tree import DraftTree


@dataclass(frozen=True)
class RequestPenalties:
    frequency: float = 0.0
    presence: float = 0.0
    repetition: float = 1.0
    min_new_tokens: int = 0
    stop_ids: tuple[int, ...] = ()  # what min_new_tokens blocks: stop ids, EOS ids, the tokenizer's EOS

    @property
    def active(self) -> bool:
        return (
            self.frequency != 0.0
            or self.presence != 0.0
            or self.repetition != 1.0
            or (self.min_new_tokens > 0 and bool(self.stop_ids))
        )


def request_penalties(req) -> RequestPenalties:
    """The penalties of an SGLang Req (read by attribute); the stop set is the one SGLang's
    BatchedMinNewTokensPenalizer builds."""
    sp = req.sampling_params
    stops: set[int] = set(sp.stop_token_ids or ()) | set(getattr(req, "eos_token_ids", None) or ())
    tokenizer = getattr(req, "tokenizer", None)
    if tokenizer is not None:
        stops |= set(getattr(tokenizer, "additional_stop_token_ids", None) or ())
        if getattr(tokenizer, "eos_token_id", None) is not None:
            stops.add(tokenizer.eos_token_id)
    return RequestPenalties(
        frequency=float(sp.frequency_penalty),
        presence=float(sp.presence_penalty),
        repetition=float(sp.repetition_penalty),
        min_new_tokens=int(sp.min_new_tokens or 0),
        stop_ids=tuple(sorted(t for t in stops if t is not None)),
    )


def _path_levels(tree: DraftTree) -> list[tuple[list[int], list[int]]]:
    """For each level l = 1.. of the tree: (nodes at depth >= l, the token of each one's depth-l
    ancestor), so a level touches a node's row at most once."""
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    paths: list[list[int]] = [[] for _ in parents]  # tokens below the root, node itself included
    for node in range(1, len(parents)):  # a parent precedes its children
        paths[node] = paths[parents[node]] + [tokens[node]]
    depth = max(len(p) for p in paths)
    return [
        ([n for n, p in enumerate(paths) if len(p) > level], [p[level] for p in paths if len(p) > level])
        for level in range(depth)
    ]


def _occurrence_rows(
    vocab: int, output: torch.Tensor, levels, n: int, value: float, accumulate: bool, fill: float, device
) -> torch.Tensor:
    """[n, V]: `fill`, then `value` added per occurrence (accumulate) or set where a token occurred,
    over the output tokens and then, level by level, each node's path."""
    row = torch.full((vocab,), fill, dtype=torch.float32, device=device)
    if accumulate:
        row.scatter_add_(0, output, torch.full(output.shape, value, dtype=torch.float32, device=device))
    else:
        row[output] = value
    rows = row.expand(n, vocab).clone()
    for nodes, toks in levels:
        index = (torch.tensor(nodes, device=device), torch.tensor(toks, device=device))
        if accumulate:  # one occurrence per row per level: each add is one rounding, as in SGLang
            rows.index_put_(
                index, torch.full((len(nodes),), value, dtype=torch.float32, device=device), accumulate=True
            )
        else:
            rows[index] = value
    return rows


def apply_tree_penalties(
    logits: torch.Tensor,
    penalties: list[RequestPenalties],
    outputs: list[list[int]],
    trees: list[DraftTree],
    num_nodes: int,
) -> None:
    """Penalise `logits` ([bs*num_nodes, V], request b's node i at row b*num_nodes + i) in place.
    `outputs[b]`: request b's committed output token ids (its last one is the tree's root).
    Padding rows past a tree's size are left as they are (no acceptance reads them)."""
    vocab, device = logits.shape[1], logits.device
    for b, (pen, output_ids, tree) in enumerate(zip(penalties, outputs, trees)):
        if not pen.active:
            continue
        n = tree.size
        rows = logits[b * num_nodes : b * num_nodes + n]
        output = torch.tensor(output_ids, dtype=torch.long, device=device)
        counts_tokens = pen.frequency != 0.0 or pen.presence != 0.0 or pen.repetition != 1.0
        levels = _path_levels(tree) if counts_tokens else []  # min_new_tokens alone reads depths only
        additive = torch.zeros(n, vocab, dtype=torch.float32, device=device)
        if pen.frequency != 0.0:
            additive.sub_(_occurrence_rows(vocab, output, levels, n, pen.frequency, True, 0.0, device))
        if pen.presence != 0.0:
            additive.sub_(_occurrence_rows(vocab, output, levels, n, pen.presence, False, 0.0, device))
        if pen.min_new_tokens > 0 and pen.stop_ids:
            blocked = (tree.depths.to(device) + len(output_ids)) < pen.min_new_tokens  # output position of each row
            stops = torch.tensor([t for t in pen.stop_ids if 0 <= t < vocab], dtype=torch.long, device=device)
            additive[blocked.nonzero().flatten().unsqueeze(1), stops.unsqueeze(0)] = float("-inf")
        rows.add_(additive.to(rows.dtype))
        if pen.repetition != 1.0:
            scale = _occurrence_rows(vocab, output, levels, n, pen.repetition, False, 1.0, device).to(rows.dtype)
            rows.copy_(torch.where(rows < 0, rows * scale, rows / scale))


def apply_logit_bias(logits: torch.Tensor, logit_bias: torch.Tensor | None, num_nodes: int) -> None:
    """SGLang's per-request logit_bias ([bs, V]) on every node row, after the penalties as in a plain decode."""
    if logit_bias is not None:
        logits.add_(torch.repeat_interleave(logit_bias, num_nodes, dim=0))
