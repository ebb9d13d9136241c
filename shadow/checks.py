"""Per-request checks of emitted tokens against the reference's logits.

Greedy: every token must be the target argmax. A mismatch is a numerical `tie` when the target's
log-probability margin (argmax minus emitted) is at most `tie_margin` nats, else an `error`. The
default 0.05 nats covers bf16 serving against an fp32 reference: bf16 keeps 8 mantissa bits, so
logits of magnitude ~10-20 carry rounding errors of a few hundredths.

Sampled: the randomized probability integral transform of each emitted token x under the request's
own processed distribution p (sglang_jetspec.core.sampling.processed_probs, the function decoding
itself uses), with tokens in a fixed order (descending p, ties by token id):
    u = F(x-) + V * p(x),  V ~ Uniform(0, 1) independent,
is exactly Uniform(0, 1) when x ~ p. Descending order puts the tokens a broken sampler most often
over- or under-weights (the top ones) at one end, so shifts show up as skewed u. A token with p(x) = 0
(outside the request's top-k / top-p / min-p support) cannot occur under lossless sampling and is
`impossible`, an error, unless it sits at the support's edge: when moving every logit by at most
tie_margin / 2 nats in its favour (those above it down, it and those below up, the worst case of that
rounding) puts it inside, serving and reference may simply disagree on the cutoff, and it is a `tie`.
Without that band, one bf16 rounding at a top-p boundary would latch the sticky alarm.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from sglang_jetspec.core.sampling import SamplingParams, processed_probs
from shadow.margins import DEFAULT_TIE_MARGIN

# Rank buckets of the emitted token in the processed order: [start, end) ranks, 0 = most likely.
RANK_EDGES = (0, 1, 2, 4, 8, 16, 64)


@dataclass(frozen=True)
class Mismatch:
    position: int  # index into output_ids
    emitted: int
    expected: int  # target argmax
    margin: float  # log p(argmax) - log p(emitted), nats (inf for an impossible token)
    kind: str  # "tie" | "error" | "impossible"


@dataclass
class RequestCheck:
    request_id: str
    mode: str  # "greedy" | "sampled"
    tokens: int
    mismatches: list[Mismatch] = field(default_factory=list)
    pit: np.ndarray = field(default_factory=lambda: np.zeros(0))  # sampled: u per scorable token
    rank_observed: np.ndarray = field(default_factory=lambda: np.zeros(len(RANK_EDGES)))
    rank_expected: np.ndarray = field(default_factory=lambda: np.zeros(len(RANK_EDGES)))

    @property
    def first_divergence(self) -> int | None:
        """First position whose token the non-speculative target would not have produced."""
        wrong = [m.position for m in self.mismatches if m.kind != "tie"]
        return min(wrong) if wrong else None


def greedy_mismatches(
    logits: torch.Tensor, output_ids: list[int], tie_margin: float = DEFAULT_TIE_MARGIN
) -> list[Mismatch]:
    logprobs = torch.log_softmax(logits.double(), dim=-1)
    best = logprobs.argmax(-1)
    emitted = torch.tensor(output_ids, dtype=torch.long)
    margins = logprobs.gather(-1, best[:, None])[:, 0] - logprobs.gather(-1, emitted[:, None])[:, 0]
    out = []
    for i in torch.nonzero(margins > 0).flatten().tolist():  # margin 0: the emitted token ties for the max
        margin = float(margins[i])
        out.append(Mismatch(i, output_ids[i], int(best[i]), margin, "tie" if margin <= tie_margin else "error"))
    return out


@dataclass
class SampledTransform:
    pit: np.ndarray  # u for the possible tokens
    outside_support: list[Mismatch]  # kind "tie" (at the cutoff, within the margin) or "impossible"
    rank_observed: np.ndarray  # [buckets] emitted-rank counts
    rank_expected: np.ndarray  # [buckets] expected counts: sum over positions of the bucket's mass


def sorted_processed(logits: torch.Tensor, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Processed probabilities in the fixed order (descending, stable in token id) and that order."""
    probs = processed_probs(logits, params).double()
    probs = probs / probs.sum(-1, keepdim=True)
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    return sorted_p.numpy(), order.numpy()


def bucket_mass(sorted_p: np.ndarray) -> np.ndarray:
    """[..., buckets] probability mass of each rank bucket."""
    cdf = np.concatenate([np.zeros(sorted_p.shape[:-1] + (1,)), np.cumsum(sorted_p, axis=-1)], axis=-1)
    edges = [min(e, sorted_p.shape[-1]) for e in RANK_EDGES] + [sorted_p.shape[-1]]
    return np.stack([cdf[..., edges[b + 1]] - cdf[..., edges[b]] for b in range(len(RANK_EDGES))], axis=-1)


def rank_bucket(ranks: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.array(RANK_EDGES), ranks, side="right") - 1


def in_tie_band(logits: torch.Tensor, token: int, params: SamplingParams, tie_margin: float) -> bool:
    """Whether `token` is in the request's support once every logit of the row [V] moves by at most
    tie_margin / 2 in its favour (those above it down, it and those below up): the module doc's band."""
    row = logits.double()
    favoured = row + torch.where(row > row[token], -tie_margin / 2, tie_margin / 2)
    return bool(processed_probs(favoured, params)[token] > 0)


def outside_support(
    logits: torch.Tensor, position: int, emitted: int, expected: int, params: SamplingParams, tie_margin: float
) -> Mismatch:
    """Classify a token the request's processed distribution gives p = 0 at this position (module doc)."""
    if in_tie_band(logits, emitted, params, tie_margin):
        logprobs = torch.log_softmax(logits.double(), dim=-1)
        return Mismatch(position, emitted, expected, float(logprobs[expected] - logprobs[emitted]), "tie")
    return Mismatch(position, emitted, expected, float("inf"), "impossible")


def sampled_transform(
    logits: torch.Tensor,
    output_ids: list[int],
    params: SamplingParams,
    rng: np.random.Generator,
    tie_margin: float = DEFAULT_TIE_MARGIN,
) -> SampledTransform:
    sorted_p, order = sorted_processed(logits, params)
    n = len(output_ids)
    emitted = np.asarray(output_ids)
    ranks = np.argmax(order == emitted[:, None], axis=-1)
    p_x = sorted_p[np.arange(n), ranks]
    before = np.cumsum(sorted_p, axis=-1)[np.arange(n), ranks] - p_x
    v = rng.random(n)
    possible = p_x > 0
    outside = [
        outside_support(logits[i], int(i), int(emitted[i]), int(order[i, 0]), params, tie_margin)
        for i in np.nonzero(~possible)[0]
    ]
    observed = np.bincount(rank_bucket(ranks[possible]), minlength=len(RANK_EDGES)).astype(float)
    expected = bucket_mass(sorted_p[possible]).sum(0) if possible.any() else np.zeros(len(RANK_EDGES))
    u = np.clip(before[possible] + v[possible] * p_x[possible], 0.0, 1.0)
    return SampledTransform(u, outside, observed, expected)
