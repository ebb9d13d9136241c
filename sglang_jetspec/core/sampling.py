"""Per-request sampling parameters and the target-side logits processing.

Speculative acceptance is lossless only if every tree node is scored with exactly the distribution
ordinary decoding would sample from. Both paths therefore call `processed_probs`, which mirrors
SGLang's pytorch sampler: softmax(logits / temperature), then top-k, top-p and min-p masks computed
on the same sorted, un-renormalised probabilities, then renormalisation.
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


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Distribution ordinary sampling draws from, for logits of shape [..., vocab] (float32 out).

    Greedy requests get a one-hot on the argmax, so callers can treat both modes alike.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_k == -1 and params.top_p >= 1.0 and params.min_p <= 0.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if params.top_k > 0:
        keep[..., params.top_k :] = False
    if params.top_p < 1.0:
        # A token is dropped once the mass strictly before it already exceeds top_p.
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        keep &= mass_before <= params.top_p
    if params.min_p > 0.0:
        keep &= sorted_probs >= sorted_probs[..., :1] * params.min_p
    sorted_probs = sorted_probs * keep
    filtered = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return filtered / filtered.sum(-1, keepdim=True)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A request's own random stream: same seed, same draws, whatever else is in the batch."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
