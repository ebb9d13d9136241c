"""Per-request sampling parameters and the target-side logits processing.

Speculative acceptance is lossless only if every tree node is scored with exactly the distribution
ordinary decoding would sample from. Both paths therefore call `processed_probs`, which mirrors
SGLang's pytorch sampler: softmax(logits / temperature), then top-k, top-p and min-p masks computed
on the same sorted, un-renormalised probabilities, then renormalisation (sorting only the few
largest candidates the masks can keep, never the whole vocabulary when top-k or top-p bounds them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """What a request asked for. temperature 0 means greedy; top_k <= 0 means no top-k."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: must be >= 0 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p}: must be in (0, 1] (1 = disabled)")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p={self.min_p}: must be in [0, 1) (0 = disabled)")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k={self.top_k}: must be >= 1, or -1 to disable")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: must be >= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def truncates(self) -> bool:
        """A sampled request whose top-k or top-p cuts its distribution to its largest candidates."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1.0)


# Top-p without sorting the vocabulary: take the largest candidates first and widen only while they
# hold less than top_p of the mass (plus a margin for rounding), so every token left out is one the
# full sort would drop too; at worst the candidates grow to the whole vocabulary (top_p near 1).
TOP_P_FIRST_CANDIDATES = 1024
TOP_P_GROWTH = 8
TOP_P_MARGIN = 1e-3


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Distribution ordinary sampling draws from, for logits of shape [..., vocab] (float32 out).

    Greedy requests get a one-hot on the argmax, so callers can treat both modes alike. No full
    vocabulary sort: min-p alone is a threshold on the maximum; top-k and top-p look only at the
    largest candidates (`_largest`). The result equals sorting everything: the same masks on the
    same descending probabilities, scattered back and renormalised over the same vocabulary.
    """
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    probs = _tempered(logits, params)
    if not params.truncates:
        return _min_p(probs, params)
    kept = _kept(probs, params, widen=True)
    filtered = torch.zeros_like(probs).scatter_(-1, kept.ids, kept.masses)
    return filtered / filtered.sum(-1, keepdim=True)


@dataclass(frozen=True)
class Kept:
    """What ordinary sampling keeps of a distribution, row by row: `masses` [rows, k] (un-renormalised),
    each at vocabulary id `ids` [rows, k] (None: the whole vocabulary, in its order); `sufficed` [rows], a
    device bool False where top-p's mass lay past the candidates looked at (that row's masses are then
    wrong and must be redone with `processed_probs`), or None when they always suffice."""

    masses: torch.Tensor
    ids: torch.Tensor | None
    sufficed: torch.Tensor | None


def kept_candidates(logits: torch.Tensor, params: SamplingParams, candidates: int = TOP_P_FIRST_CANDIDATES) -> Kept:
    """`processed_probs` of sampled rows [rows, vocab] without reading the device and without going back
    to the vocabulary: a top-k / top-p request keeps its first `candidates` (fewer with top-k) as the
    masks leave them, so a draw reads k masses, not the vocabulary's. Any other request (temperature
    alone, min-p alone) keeps its whole distribution."""
    probs = _tempered(logits, params)
    if not params.truncates:
        return Kept(_min_p(probs, params), None, None)
    return _kept(probs, params, widen=False, candidates=candidates)


def _tempered(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """softmax(logits / temperature) in float32."""
    return torch.softmax(logits.float() / params.temperature, dim=-1)


def _min_p(probs: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Min-p alone needs no order, only the maximum."""
    if params.min_p <= 0.0:
        return probs
    filtered = probs * (probs >= probs.amax(-1, keepdim=True) * params.min_p)
    return filtered / filtered.sum(-1, keepdim=True)


def _kept(probs: torch.Tensor, params: SamplingParams, widen: bool, candidates: int = TOP_P_FIRST_CANDIDATES) -> Kept:
    sorted_probs, order, sufficed = _largest(probs, params, widen, candidates)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)  # top-k: only the top_k largest are candidates
    if params.top_p < 1.0:
        # A token is dropped once the mass strictly before it already exceeds top_p.
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        keep &= mass_before <= params.top_p
    if params.min_p > 0.0:
        keep &= sorted_probs >= sorted_probs[..., :1] * params.min_p
    return Kept(sorted_probs * keep, order, sufficed)


def _largest(
    probs: torch.Tensor, params: SamplingParams, widen: bool = True, candidates: int = TOP_P_FIRST_CANDIDATES
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The candidates top-k / top-p can keep, in descending order (values, vocabulary indices), and, when
    not `widen`ing, whether the first candidates sufficed in each row (device bools; None when they
    always do).

    top-k bounds them at top_k. top-p starts from TOP_P_FIRST_CANDIDATES and widens until, in every
    row, the candidates' mass exceeds top_p + TOP_P_MARGIN: the first token left out then has more
    than top_p before it, so it, and every smaller one, is dropped by the rule itself.
    """
    vocab = probs.shape[-1]
    limit = vocab if params.top_k <= 0 else min(params.top_k, vocab)
    if params.top_p >= 1.0:
        return (*probs.topk(limit, dim=-1), None)
    k = min(limit, candidates)
    while True:
        values, order = probs.topk(k, dim=-1)
        if k == limit:
            return values, order, None
        sufficed = values.sum(-1, dtype=torch.float64) > params.top_p + TOP_P_MARGIN
        if not widen:
            return values, order, sufficed
        if bool(sufficed.all()):
            return values, order, None
        k = min(limit, k * TOP_P_GROWTH)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A request's own random stream: same seed, same draws, whatever else is in the batch."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
