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

    The whole batch at once, whatever its size, and only where a penalty applies: the host works out, for
    every (row, token) a penalty touches (a token in the row's request's output or on its path, a stop
    token under min_new_tokens), the additive term and the repetition scale; the device gathers those
    logits, applies them and scatters them back (a fixed handful of ops). Every other logit would get
    + 0 and x 1 from a dense computation, which leaves it exactly as it is."""
    active = [b for b, pen in enumerate(penalties) if pen.active]
    if not active:
        return
    layout = _PenaltyLayout(vocab=logits.shape[1])
    for b in active:
        layout.add(penalties[b], outputs[b], trees[b], b * num_nodes)
    layout.apply(logits)


class _PenaltyLayout:
    """A step's penalised (row, token) entries, laid out on the host."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        # one entry per occurrence (a row's request's output token, or a token on the row's path) and per
        # blocked stop token, keyed row * vocab + token, each with its request's penalty values
        self.occurrences: list[torch.Tensor] = []
        self.occurrence_values: list[torch.Tensor] = []  # [n, 3]: frequency, presence, repetition
        self.blocked: list[torch.Tensor] = []
        self.any = {"frequency": False, "presence": False, "repetition": False}

    def add(self, pen: RequestPenalties, output_ids: list[int], tree: DraftTree, first_row: int) -> None:
        n, vocab = tree.size, self.vocab
        rows = torch.arange(first_row, first_row + n)
        if pen.frequency != 0.0 or pen.presence != 0.0 or pen.repetition != 1.0:
            output = torch.tensor(output_ids, dtype=torch.long)
            keys = [(rows.repeat_interleave(len(output)) * vocab + output.repeat(n))]
            for nodes, tokens in _path_levels(tree):
                keys.append((first_row + torch.tensor(nodes)) * vocab + torch.tensor(tokens))
            keys = torch.cat(keys)
            self.occurrences.append(keys)
            values = torch.tensor([pen.frequency, pen.presence, pen.repetition], dtype=torch.float32)
            self.occurrence_values.append(values.expand(len(keys), 3))
            self.any["frequency"] |= pen.frequency != 0.0
            self.any["presence"] |= pen.presence != 0.0
            self.any["repetition"] |= pen.repetition != 1.0
        if pen.min_new_tokens > 0 and pen.stop_ids:
            blocked_rows = rows[(tree.depths + len(output_ids)) < pen.min_new_tokens]  # output position of each row
            stops = torch.tensor([t for t in pen.stop_ids if 0 <= t < vocab], dtype=torch.long)
            self.blocked.append((blocked_rows.unsqueeze(1) * vocab + stops.unsqueeze(0)).flatten())

    def apply(self, logits: torch.Tensor) -> None:
        occurrences = torch.cat(self.occurrences) if self.occurrences else torch.zeros(0, dtype=torch.long)
        blocked = torch.cat(self.blocked) if self.blocked else torch.zeros(0, dtype=torch.long)
        keys, entry = torch.unique(torch.cat([occurrences, blocked]), return_inverse=True)
        of_occurrence, of_blocked = entry[: len(occurrences)], entry[len(occurrences) :]
        values = torch.cat(self.occurrence_values) if self.occurrence_values else torch.zeros(0, 3)
        # SGLang's order, per entry: additive = 0 - frequency x count (one rounding per occurrence) - presence
        # (once it occurred), -inf where blocked; logit += additive; then the repetition scale where it occurred
        additive = torch.zeros(len(keys), dtype=torch.float32)
        if self.any["frequency"]:
            additive.sub_(torch.zeros(len(keys)).index_put_((of_occurrence,), values[:, 0], accumulate=True))
        if self.any["presence"]:
            additive.sub_(torch.zeros(len(keys)).index_put_((of_occurrence,), values[:, 1]))
        additive[of_blocked] = float("-inf")
        device = logits.device
        index = ((keys // self.vocab).to(device), (keys % self.vocab).to(device))
        penalised = logits[index]
        penalised.add_(additive.to(device, penalised.dtype))
        if self.any["repetition"]:
            scale = torch.ones(len(keys)).index_put_((of_occurrence,), values[:, 2]).to(device, penalised.dtype)
            penalised = torch.where(penalised < 0, penalised * scale, penalised / scale)
        logits[index] = penalised


def apply_logit_bias(logits: torch.Tensor, logit_bias: torch.Tensor | None, num_nodes: int) -> None:
    """SGLang's per-request logit_bias ([bs, V]) on every node row, after the penalties as in a plain decode."""
    if logit_bias is not None:
        logits.add_(torch.repeat_interleave(logit_bias, num_nodes, dim=0))
