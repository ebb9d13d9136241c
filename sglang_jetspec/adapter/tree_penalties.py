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


def apply_tree_penalties(
    logits: torch.Tensor,
    penalties: list[RequestPenalties],
    outputs: list[list[int]],
    trees: list[DraftTree],
    num_nodes: int,
) -> None:
    """Penalise `logits` ([bs*num_nodes, V], request b's node i at row b*num_nodes + i) in place.
    `outputs[b]`: request b's committed output token ids (its last one is the tree's root).
    Padding rows past a tree's size are left as they are (no acceptance reads them).

    The whole batch at once, whatever its size: the host lays out every penalised row's occurrences (its
    request's output tokens, then its path's tokens), and a fixed number of device ops applies them. A
    penalty a request did not ask for enters with its neutral value (0 added, a scale of 1), which leaves
    its rows exactly as they were."""
    active = [b for b, pen in enumerate(penalties) if pen.active]
    if not active:
        return
    layout = _PenaltyLayout(vocab=logits.shape[1])
    for a, b in enumerate(active):
        layout.add(a, penalties[b], outputs[b], trees[b], b * num_nodes)
    layout.apply(logits)


class _PenaltyLayout:
    """The penalised rows of one step on the host: rows, occurrences, blocked stop tokens, per-request values."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.rows: list[int] = []  # logits rows penalised
        self.row_request: list[int] = []  # each row's request (index among the penalised ones)
        self.output: tuple[list[int], list[int]] = ([], [])  # (request, token) per committed output token
        self.paths: tuple[list[int], list[int]] = ([], [])  # (row position, token) per path token below the root
        self.blocked: tuple[list[int], list[int]] = ([], [])  # (row position, stop token) under min_new_tokens
        self.frequency: list[float] = []
        self.presence: list[float] = []
        self.repetition: list[float] = []

    def add(self, request: int, pen: RequestPenalties, output_ids: list[int], tree: DraftTree, first_row: int) -> None:
        base = len(self.rows)
        self.rows.extend(range(first_row, first_row + tree.size))
        self.row_request.extend([request] * tree.size)
        self.frequency.append(pen.frequency)
        self.presence.append(pen.presence)
        self.repetition.append(pen.repetition)
        if pen.frequency != 0.0 or pen.presence != 0.0 or pen.repetition != 1.0:
            self.output[0].extend([request] * len(output_ids))
            self.output[1].extend(output_ids)
            for nodes, tokens in _path_levels(tree):
                self.paths[0].extend(base + node for node in nodes)
                self.paths[1].extend(tokens)
        if pen.min_new_tokens > 0 and pen.stop_ids:
            stops = [t for t in pen.stop_ids if 0 <= t < self.vocab]
            for node, depth in enumerate(tree.depths.tolist()):  # output position of each row
                if depth + len(output_ids) < pen.min_new_tokens:
                    self.blocked[0].extend([base + node] * len(stops))
                    self.blocked[1].extend(stops)

    def _occurrences(self, values: torch.Tensor, accumulate: bool, fill: float, device) -> torch.Tensor:
        """[rows, V]: `fill`, then each row's request value added per occurrence (accumulate: one rounding
        per add, as SGLang accumulates a step at a time) or set where its token occurred, over its
        request's output tokens and then its path."""
        per_request = torch.full((len(values), self.vocab), fill, dtype=torch.float32, device=device)
        requests, tokens = (torch.tensor(x, dtype=torch.long, device=device) for x in self.output)
        per_request.index_put_((requests, tokens), values[requests], accumulate=accumulate)
        row_request = torch.tensor(self.row_request, dtype=torch.long, device=device)
        rows = per_request[row_request]
        positions, tokens = (torch.tensor(x, dtype=torch.long, device=device) for x in self.paths)
        rows.index_put_((positions, tokens), values[row_request[positions]], accumulate=accumulate)
        return rows

    def apply(self, logits: torch.Tensor) -> None:
        device = logits.device
        index = torch.tensor(self.rows, dtype=torch.long, device=device)
        rows = logits[index]
        additive = torch.zeros(rows.shape, dtype=torch.float32, device=device)
        if any(self.frequency):
            frequency = torch.tensor(self.frequency, dtype=torch.float32, device=device)
            additive.sub_(self._occurrences(frequency, True, 0.0, device))
        if any(self.presence):
            presence = torch.tensor(self.presence, dtype=torch.float32, device=device)
            additive.sub_(self._occurrences(presence, False, 0.0, device))
        if self.blocked[0]:
            blocked = tuple(torch.tensor(x, dtype=torch.long, device=device) for x in self.blocked)
            additive[blocked] = float("-inf")
        rows.add_(additive.to(rows.dtype))
        if any(r != 1.0 for r in self.repetition):
            repetition = torch.tensor(self.repetition, dtype=torch.float32, device=device)
            scale = self._occurrences(repetition, False, 1.0, device).to(rows.dtype)
            rows = torch.where(rows < 0, rows * scale, rows / scale)
        logits[index] = rows


def apply_logit_bias(logits: torch.Tensor, logit_bias: torch.Tensor | None, num_nodes: int) -> None:
    """SGLang's per-request logit_bias ([bs, V]) on every node row, after the penalties as in a plain decode."""
    if logit_bias is not None:
        logits.add_(torch.repeat_interleave(logit_bias, num_nodes, dim=0))
