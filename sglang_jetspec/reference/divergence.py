"""Where a speculative greedy output first departs from the autoregressive one, and how close a call
it was: in bf16 (or fp16) different kernel shapes round differently, and a departure at a near-tie
(a small top-1/top-2 logit margin) is rounding, not a bug. fp32 outputs must not depart at all."""

from __future__ import annotations

import torch

from .target import Segment, TargetModel


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token (a shorter output differs where it ends); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@torch.no_grad()
def first_divergence(
    target: TargetModel, prompt_ids: list[int], reference: list[int], speculative: list[int]
) -> dict | None:
    """None when the outputs are equal; else the index of the first differing token, both tokens, and
    the target's logit margins there (scored on the common prefix, in the target's own dtype):
    `top2_margin` = top-1 minus top-2 logit, `chosen_gap` = logit of the reference's token minus that of
    the speculative one (None where one output had already ended)."""
    index = first_difference(reference, speculative)
    if index is None:
        return None
    ids = prompt_ids + reference[:index]
    cache = target.new_cache(lanes=1, capacity=len(ids))
    logits = target.logits(target.forward(cache, [Segment.chain(ids, 0)]).hidden[0, -1]).float()
    top = logits.topk(2).values
    ref = reference[index] if index < len(reference) else None
    spec = speculative[index] if index < len(speculative) else None
    return {
        "index": index,
        "autoregressive_token": ref,
        "speculative_token": spec,
        "top2_margin": float(top[0] - top[1]),
        "chosen_gap": float(logits[ref] - logits[spec]) if ref is not None and spec is not None else None,
    }


def describe(divergence: dict) -> str:
    gap = divergence["chosen_gap"]
    return (
        f"token {divergence['index']}: autoregressive {divergence['autoregressive_token']} vs speculative "
        f"{divergence['speculative_token']}, top-1/top-2 logit margin {divergence['top2_margin']:.4f}"
        + (f", gap between the two {gap:.4f}" if gap is not None else "")
    )


def greedy_divergences(target: TargetModel, reference: list, outputs: list) -> list[dict]:
    """For each request (engine RequestOutputs, in the same order) whose greedy output differs from
    the autoregressive one: its id, where it first departs and the target's logit margins there."""
    found = []
    for ref, out in zip(reference, outputs):
        divergence = first_divergence(target, ref.prompt_ids, ref.output_ids, out.output_ids)
        if divergence is not None:
            found.append({"request": ref.request_id, **divergence})
    return found
