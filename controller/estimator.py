"""Goodput per (cohort, budget) with its uncertainty, from per-interval samples in a sliding window.

Each interval contributes one sample (committed tokens y_i, request-seconds x_i). Goodput is the
ratio estimate R = sum(y) / sum(x) (tokens per second per request), which weights busy intervals
more, and its standard error is the usual ratio-estimator one,
    se(R) = sqrt(sum((y_i - R x_i)^2) / (n (n - 1))) / mean(x),
so the spread between intervals (load, noise) is what the decision logic has to beat.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from controller.telemetry import Key, Usage


@dataclass(frozen=True)
class Estimate:
    goodput: float
    stderr: float  # inf with fewer than two samples
    samples: int
    steps: float


@dataclass(frozen=True)
class _Sample:
    at: float
    tokens: float
    request_seconds: float
    steps: float


def ratio_estimate(samples: list[_Sample]) -> Estimate:
    tokens = sum(s.tokens for s in samples)
    seconds = sum(s.request_seconds for s in samples)
    goodput = tokens / seconds
    n = len(samples)
    if n < 2:
        stderr = math.inf
    else:
        residual = sum((s.tokens - goodput * s.request_seconds) ** 2 for s in samples)
        stderr = math.sqrt(residual / (n * (n - 1))) / (seconds / n)
    return Estimate(goodput, stderr, n, sum(s.steps for s in samples))


class GoodputEstimator:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self._samples: dict[Key, deque[_Sample]] = {}

    def add(self, now: float, usage: dict[Key, Usage]) -> None:
        for key, part in usage.items():
            if part.steps > 0 and part.request_seconds > 0:
                self._samples.setdefault(key, deque()).append(
                    _Sample(now, part.committed_tokens, part.request_seconds, part.steps))
        self._prune(now)

    def _prune(self, now: float) -> None:
        oldest = now - self.window_s
        for key in list(self._samples):
            samples = self._samples[key]
            while samples and samples[0].at <= oldest:
                samples.popleft()
            if not samples:
                del self._samples[key]

    def estimates(self) -> dict[Key, Estimate]:
        return {key: ratio_estimate(list(samples)) for key, samples in self._samples.items()}


def gain_over_off(budget: Estimate, off: Estimate) -> tuple[float, float]:
    """Net gain goodput(budget) / goodput(off) and its standard error (delta method, independent)."""
    if off.goodput <= 0:
        return math.inf, math.inf
    gain = budget.goodput / off.goodput
    return gain, math.hypot(budget.stderr, gain * off.stderr) / off.goodput
