"""One verify step's acceptance, in the layout SGLang's spec-V2 contract reads (pure PyTorch).

The decision itself is the core's `accept_batch` (greedy, or lossless sampling with each request's own
parameters and generator: core/acceptance.py); this module lays its per-request results out as:
- tokens [bs, stride]: row b = its committed tokens (accepted drafts, then the bonus), zero padded;
  next_token_ids is it flattened: SGLang's `_resolve_spec_v2_tokens` slices
  `[b*stride : b*stride + accept_lens[b]]` with stride = GenerationBatchResult.speculative_output_stride.
- accept_lens [bs] int32: committed tokens incl. the bonus; accept_index [bs, stride] int32: flat
  verify row b*N + node of each kept node, root first, -1 padded (`move_accept_tokens_to_target_kvcache`
  moves exactly these KV slots to the front of each request's verify window).
- predict [bs*N] int32: EAGLE/NGRAM layout, predict[row of node] = the token the target chose
  after that node, so predict[accept_index] are the committed tokens (`compute_spec_logprobs`).
- bonus_tokens [bs]: each request's last committed token (the next step's root).
- row_index / row_counts: the verify rows whose tapped hidden states become draft context
  (root + accepted nodes of each request, request-major), i.e. the valid entries of accept_index.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_jetspec.core.acceptance import AcceptResult, accept_batch, target_argmax
from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.core.step_clock import Drafted
from sglang_jetspec.core.tree import DraftTree


@dataclass
class StepOutputs:
    # the core's decision per request (accepted path, tokens) on the host; None where the decision stayed
    # on the device (a greedy step of roots alone: nothing on the host reads it)
    results: list[AcceptResult] | None
    tokens: torch.Tensor
    accept_lens: torch.Tensor
    accept_index: torch.Tensor
    predict: torch.Tensor
    bonus_tokens: torch.Tensor
    row_index: torch.Tensor
    row_counts: list[int]

    @property
    def stride(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def next_token_ids(self) -> torch.Tensor:
        return self.tokens.flatten()


def accept_lanes(drafted: Drafted, logits: torch.Tensor, lanes: list, sampled_children: str) -> StepOutputs:
    """`accept_step` for a step's lanes (each with its SamplingParams and generator): sampled requests whose
    children were drawn from the head are accepted against it, the others by matching."""
    method = "draw" if sampled_children == "drawn" else "match"
    params, generators = [lane.params for lane in lanes], [lane.generator for lane in lanes]
    return accept_step(drafted.trees, logits, drafted.num_nodes, params, generators, method)


def accept_step(
    trees: list[DraftTree],
    logits: torch.Tensor,
    num_nodes: int,
    params: list[SamplingParams],
    generators: list[torch.Generator],
    method: str = "match",
) -> StepOutputs:
    """`logits` are the verify pass's rows, [bs*num_nodes, V] in draft_token order."""
    bs = len(trees)
    if logits.shape[0] != bs * num_nodes:
        raise ValueError(f"logits has {logits.shape[0]} rows, expected bs*num_nodes = {bs}*{num_nodes}")
    if num_nodes == 1 and all(p.greedy for p in params):
        return _greedy_roots(logits)
    results = accept_batch(trees, logits.view(bs, num_nodes, -1), params, generators, method)
    stride = max(t.max_depth for t in trees) + 1
    # laid out on the host lists, then one tensor each: no tensor op per request
    accept_index = torch.tensor(
        [[b * num_nodes + n for n in r.path] + [-1] * (stride - len(r.path)) for b, r in enumerate(results)],
        dtype=torch.int32,
    )
    tokens = torch.tensor([r.tokens + [0] * (stride - len(r.tokens)) for r in results], dtype=torch.long)
    accept_lens = torch.tensor([r.accept_length for r in results], dtype=torch.int32)
    kept = accept_index >= 0  # per row a prefix of length accept_lens[b]
    row_index = accept_index[kept].long()
    predict = torch.zeros(bs * num_nodes, dtype=torch.int32)
    predict[row_index] = tokens[kept].to(torch.int32)
    return StepOutputs(
        results=results,
        tokens=tokens,
        accept_lens=accept_lens,
        accept_index=accept_index,
        predict=predict,
        bonus_tokens=tokens[torch.arange(bs), accept_lens.long() - 1],
        row_index=row_index,
        row_counts=accept_lens.tolist(),
    )


def _greedy_roots(logits: torch.Tensor) -> StepOutputs:
    """A step whose trees are roots alone (speculation gated off) and whose requests are all greedy:
    each request commits its argmax, the decision `accept_batch` makes, without its per-request walk
    and without reading it on the host (plain SGLang's decode reads its tokens only after the step)."""
    bs = logits.shape[0]
    tokens = target_argmax(logits).view(bs, 1)
    rows = torch.arange(bs, device=logits.device)
    return StepOutputs(
        results=None,
        tokens=tokens,
        accept_lens=torch.ones(bs, dtype=torch.int32, device=logits.device),
        accept_index=rows.to(torch.int32).view(bs, 1),
        predict=tokens[:, 0].to(torch.int32),
        bonus_tokens=tokens[:, 0],
        row_index=rows,
        row_counts=[1] * bs,
    )
