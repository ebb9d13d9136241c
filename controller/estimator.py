"""Goodput per (cohort, budget) with its uncertainty, from per-interval samples in a sliding window.

Each interval contributes one sample per (cohort, budget) that ran: committed tokens y_i and
request-seconds x_i. Two views of the window:

- `estimates()`: goodput R = sum(y) / sum(x) (tokens per second per request; busy intervals weigh
  more) with the ratio-estimator standard error sqrt(sum((y_i - R x_i)^2) / (n (n - 1))) / mean(x).
- `compare(a, b)`: a paired comparison over the intervals where both budgets ran: goodput_a /
  goodput_b and the standard error of its log. Load, prompt mix and machine noise shared by an
  interval cancel, so probes on a small share of steps are enough to tell budgets apart;
  decisions use this view.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controller.telemetry import Key, Usage
from policies.confidence import t_critical


@dataclass(frozen=True)
class Estimate:
    goodput: float
    stderr: float  # inf with fewer than two samples
    samples: int
    steps: float
    latest: float  # time of the newest sample


@dataclass(frozen=True)
class Comparison:
    ratio: float  # goodput(a) / goodput(b) over the intervals both ran in
    log_stderr: float  # standard error of log(ratio); inf with fewer than two intervals
    samples: int

    @property
    def stderr(self) -> float:
        return self.ratio * self.log_stderr

    def exceeds(self, factor: float, z: float) -> bool:
        """True when the ratio is above `factor` at the one-sided confidence level of `z` normal
        standard errors; with few intervals the standard error is itself uncertain, so the bar is
        the matching Student-t quantile."""
        if self.samples < 2:
            return False
        return math.log(self.ratio) - t_critical(z, self.samples - 1) * self.log_stderr > math.log(factor)


@dataclass(frozen=True)
class _Sample:
    tokens: float
    request_seconds: float
    steps: float


def ratio_estimate(samples: list[_Sample], latest: float) -> Estimate:
    tokens = sum(s.tokens for s in samples)
    seconds = sum(s.request_seconds for s in samples)
    goodput = tokens / seconds
    n = len(samples)
    if n < 2:
        stderr = math.inf
    else:
        residual = sum((s.tokens - goodput * s.request_seconds) ** 2 for s in samples)
        stderr = math.sqrt(residual / (n * (n - 1))) / (seconds / n)
    return Estimate(goodput, stderr, n, sum(s.steps for s in samples), latest)


def paired_comparison(pairs: list[tuple[_Sample, _Sample]]) -> Comparison:
    """Ratio of the two budgets' goodputs (sum of tokens over sum of request-seconds, each over
    the shared intervals), with the standard error of its log from each interval's linearized
    contribution: e_i = (y_a - R_a x_a) / (R_a X_a) - (y_b - R_b x_b) / (R_b X_b).
    Volume-weighted, so intervals with a handful of probe steps cannot swing the result, and
    paired, so a shock common to both budgets in an interval cancels."""
    n = len(pairs)
    tokens_a = sum(a.tokens for a, _ in pairs)
    tokens_b = sum(b.tokens for _, b in pairs)
    seconds_a = sum(a.request_seconds for a, _ in pairs)
    seconds_b = sum(b.request_seconds for _, b in pairs)
    rate_a, rate_b = tokens_a / seconds_a, tokens_b / seconds_b
    if n < 2:
        return Comparison(rate_a / rate_b, math.inf, n)
    contributions = [
        (a.tokens - rate_a * a.request_seconds) / tokens_a - (b.tokens - rate_b * b.request_seconds) / tokens_b
        for a, b in pairs
    ]
    variance = n / (n - 1) * sum(e * e for e in contributions)
    return Comparison(rate_a / rate_b, math.sqrt(variance), n)


class GoodputEstimator:
    def __init__(self, window_s: float):
        self.window_s = window_s
        self._samples: dict[Key, dict[float, _Sample]] = {}  # interval end time -> sample
        self.updated_at: float | None = None  # time of the latest add(): samples from it are new

    def add(self, now: float, usage: dict[Key, Usage]) -> None:
        self.updated_at = now
        for key, part in usage.items():
            # A budget that committed nothing in an interval has no usable ratio for it.
            if part.steps > 0 and part.request_seconds > 0 and part.committed_tokens > 0:
                self._samples.setdefault(key, {})[now] = _Sample(
                    part.committed_tokens, part.request_seconds, part.steps
                )
        oldest = now - self.window_s
        for key in list(self._samples):
            kept = {t: s for t, s in self._samples[key].items() if t > oldest}
            if kept:
                self._samples[key] = kept
            else:
                del self._samples[key]

    def estimates(self) -> dict[Key, Estimate]:
        return {key: ratio_estimate(list(samples.values()), max(samples)) for key, samples in self._samples.items()}

    def compare(self, a: Key, b: Key) -> Comparison | None:
        """Paired comparison of a against b; None when they never ran in the same interval."""
        first, second = self._samples.get(a, {}), self._samples.get(b, {})
        pairs = [(first[t], second[t]) for t in first if t in second]
        return paired_comparison(pairs) if pairs else None
