"""Calibration and power of the shadow tests on real SmolLM2 distributions, without decoding 1e5 tokens.

Generating enough tokens with the CPU engine is infeasible at CPU decoding speeds, so: sample continuations
of real prompts once (non-speculative reference engine), score them with one prefill, and cache the
target logits at those real positions. Emitted tokens are then drawn at random cached positions from
a correct or a deliberately broken sampler applied to those distributions, and checked exactly as the
checker checks real requests (randomized PIT in descending-probability order, rank buckets).

Each position's processed distribution is kept as its top `TOP` tokens in the fixed order plus one
lumped tail token (the remaining mass): a coarsening of the real distribution that both the samplers
and the checks use, so a correct sampler is exactly calibrated.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sglang_jetspec.core.sampling import SamplingParams, processed_probs
from shadow.checks import bucket_mass, in_tie_band, rank_bucket

TOP = 2048  # > the last rank-bucket edge, so the lumped tail only ever joins the last bucket


def build_positions(target, prompt_ids: list[list[int]], tokens: int, seed: int = 0) -> torch.Tensor:
    """Target logits [positions, vocab] at every emitted position of sampled (T=1) continuations."""
    from sglang_jetspec.reference.engine import ReferenceEngine, Request
    from sglang_jetspec.spool.record import RecordSampling, ShadowRecord
    from shadow.target_logits import LocalReference

    engine = ReferenceEngine(target)
    requests = [
        Request(p, SamplingParams(temperature=1.0, seed=seed + i, max_new_tokens=tokens, ignore_eos=True), str(i))
        for i, p in enumerate(prompt_ids)
    ]
    reference = LocalReference(target)
    rows = []
    for out in engine.generate(requests, budget=0):
        record = ShadowRecord(
            request_id=out.request_id,
            model="",
            prompt_ids=out.prompt_ids,
            output_ids=out.output_ids,
            sampling=RecordSampling.of(requests[int(out.request_id)].params),
            finish_reason="length",
            started_at=0.0,
            finished_at=0.0,
        )
        rows.append(reference.score(record).logits)
    return torch.cat(rows)


def cached_positions(target, prompt_ids: list[list[int]], tokens: int, path: str | Path, seed: int = 0) -> torch.Tensor:
    path = Path(path)
    if path.exists():
        return torch.load(path)
    logits = build_positions(target, prompt_ids, tokens, seed).to(torch.float16)  # halves the cache; exact enough
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(logits, path)
    return logits


@dataclass
class Table:
    """Per position: correct processed probabilities in the fixed order (top TOP + tail) and the order."""

    probs: np.ndarray  # [P, TOP + 1] float64
    order: np.ndarray  # [P, TOP] token ids (the tail token has no id)

    @property
    def cdf_before(self) -> np.ndarray:
        return np.cumsum(self.probs, axis=-1) - self.probs


def _coarsen(probs: torch.Tensor, order: torch.Tensor) -> np.ndarray:
    """Probabilities of `probs` [P, V] in `order` [P, V]: top TOP columns and the rest lumped."""
    ordered = probs.double().gather(-1, order)
    return torch.cat([ordered[:, :TOP], ordered[:, TOP:].sum(-1, keepdim=True)], dim=-1).numpy()


def correct_table(logits: torch.Tensor, params: SamplingParams) -> tuple[Table, torch.Tensor]:
    probs = processed_probs(logits.float(), params).double()
    _, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    return Table(_coarsen(probs, order), order[:, :TOP].numpy()), order


# --- broken samplers: each returns the emitted distribution in the correct table's coordinates ----


def one_side(logits: torch.Tensor, order: torch.Tensor, sampler_params: SamplingParams) -> np.ndarray:
    """The sampler used other transforms than the request's (e.g. temperature or top-p on one side only)."""
    return _coarsen(processed_probs(logits.float(), sampler_params).double(), order)


def residual_skipped(
    table: Table, logits: torch.Tensor, order: torch.Tensor, children: int = 4, draft_noise: float = 1.0, seed: int = 0
) -> np.ndarray:
    """Residual acceptance without the residual step, exact distribution for one node of `children`
    drafted tokens (the top of a noisy draft = target logits + Gumbel noise x draft_noise): child c_j is
    tried with probability p(c_j) but rejected tokens are never removed, so the final draw again comes
    from p. P(c_j) = prod_{i<j}(1 - p_i) p_j + R p_j, P(x) = R p(x) otherwise, R = prod_i (1 - p_i)."""
    gen = torch.Generator().manual_seed(seed)
    gumbel = -torch.log(-torch.log(torch.rand(logits.shape, generator=gen).clamp(1e-12, 1 - 1e-12)))
    drafted = (logits.float() + draft_noise * gumbel).topk(children, dim=-1).indices  # [P, K] token ids
    rank_of = torch.argsort(order, dim=-1)  # token id -> rank in the fixed order
    ranks = rank_of.gather(-1, drafted).numpy()
    out = np.empty_like(table.probs)
    for i in range(len(out)):
        p = table.probs[i]
        child_p = np.array([p[r] if r < TOP else 0.0 for r in ranks[i]])
        survive = np.cumprod(np.concatenate([[1.0], 1.0 - child_p]))
        out[i] = survive[-1] * p
        for j, r in enumerate(ranks[i]):
            if r < TOP:
                out[i, r] += survive[j] * child_p[j]
    return out


def single_token_bias(table: Table, token: int, share: float = 0.02) -> np.ndarray:
    """Move `share` of the mass onto one fixed token at every position (where it is in the top TOP)."""
    out = table.probs.copy()
    for i in range(len(out)):
        hits = np.nonzero(table.order[i] == token)[0]
        if len(hits):
            out[i] *= 1.0 - share
            out[i, hits[0]] += share
    return out


# --- drawing tokens and their PIT values ---------------------------------------------------------


@dataclass
class Draws:
    pit: np.ndarray  # [S, N] (NaN = impossible token)
    bucket: np.ndarray  # [S, N] rank bucket of each emitted token
    expected: np.ndarray  # [S, N, buckets] the bucket masses at each drawn position


def draw(table: Table, emitted: np.ndarray, streams: int, length: int, rng: np.random.Generator) -> Draws:
    """`streams` x `length` tokens: a uniformly chosen cached position each, the token from `emitted`."""
    positions = rng.integers(0, len(table.probs), size=(streams, length))
    emitted_cdf = np.cumsum(emitted, axis=-1)
    emitted_cdf /= emitted_cdf[:, -1:]
    flat = positions.ravel()
    by_position = np.argsort(flat, kind="stable")
    bounds = np.searchsorted(flat[by_position], np.arange(len(table.probs) + 1))
    ranks = np.empty(flat.shape, dtype=np.int64)
    for i in range(len(table.probs)):  # inverse-CDF draws, one position's tokens at a time
        where = by_position[bounds[i] : bounds[i + 1]]
        ranks[where] = np.searchsorted(emitted_cdf[i], rng.random(len(where)), side="right")
    ranks = np.minimum(ranks, TOP).reshape(streams, length)
    p_x = table.probs[positions, ranks]
    u = table.cdf_before[positions, ranks] + rng.random((streams, length)) * p_x
    u = np.where(p_x > 0, np.clip(u, 0.0, 1.0), np.nan)
    masses = bucket_mass(table.probs)  # [P, buckets]
    return Draws(u, rank_bucket(ranks), masses[positions])


# --- the checker's tie band ----------------------------------------------------------------------


def tie_band_mass(
    logits: torch.Tensor, request: SamplingParams, drawn: SamplingParams, tie_margin: float
) -> tuple[float, float]:
    """Per-token probability, averaged over positions, that a sampler applying `drawn` instead of
    `request` emits a token outside the request's support, and the part of it inside the checker's
    tie band (counted as a tie, not an immediate alarm). Exact, on the full vocabulary."""
    outside_mass = band_mass = 0.0
    for row in logits.double():
        outside = torch.nonzero(processed_probs(row, request) == 0).flatten()
        outside = outside[torch.argsort(row[outside], descending=True)]
        # The band is the top slice of the outside tokens by logit: binary-search its end.
        lo, hi = 0, len(outside)
        while lo < hi:
            mid = (lo + hi) // 2
            if in_tie_band(row, int(outside[mid]), request, tie_margin):
                lo = mid + 1
            else:
                hi = mid
        emitted = processed_probs(row, drawn).double()
        outside_mass += float(emitted[outside].sum())
        band_mass += float(emitted[outside[:lo]].sum())
    return outside_mass / len(logits), band_mass / len(logits)
