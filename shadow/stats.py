"""Tests that emitted tokens follow the processed target distribution.

Per window (fixed sample): Kolmogorov-Smirnov of the PIT values against Uniform(0, 1), and a
chi-square of emitted-token rank buckets against their expected counts (buckets with fewer than 5
expected merged into their neighbour), Holm-corrected together.

Continuous monitoring: `BettingMonitor`, an e-process on the PIT stream. For bounded test functions
g_j(u) = cos(j pi u), j = 1..4 (mean 0 under uniformity), each bettor's wealth
W_t = prod_s (1 + lambda_s g_j(u_s)) with predictable lambda_s in [-1/2, 1/2] chosen by online Newton
steps is a nonnegative martingale under H0; so is their average M_t. Ville's inequality gives
P(sup_t M_t >= 1/alpha) <= alpha: checking after every token, forever, keeps the false-alarm rate
at alpha. Under a broken sampler one of the g_j has nonzero mean and the wealth grows exponentially.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

MIN_EXPECTED = 5.0
FREQUENCIES = np.arange(1, 5)
_ONS_RATE = 2.0 / (2.0 - np.log(3.0))
_LAMBDA_MAX = 0.5


@dataclass(frozen=True)
class WindowTestResult:
    name: str  # "ks" | "chi2"
    statistic: float
    p_value: float
    p_holm: float = float("nan")


def ks_test(pit: np.ndarray) -> WindowTestResult:
    result = stats.kstest(pit, "uniform")
    return WindowTestResult("ks", float(result.statistic), float(result.pvalue))


def merge_small(observed: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fold buckets with expected < MIN_EXPECTED into the next one (the last into the previous)."""
    obs, exp = [], []
    carry_o = carry_e = 0.0
    for o, e in zip(observed, expected):
        carry_o, carry_e = carry_o + o, carry_e + e
        if carry_e >= MIN_EXPECTED:
            obs.append(carry_o)
            exp.append(carry_e)
            carry_o = carry_e = 0.0
    if carry_e > 0 or carry_o > 0:
        if exp:
            obs[-1] += carry_o
            exp[-1] += carry_e
        else:
            obs.append(carry_o)
            exp.append(carry_e)
    return np.array(obs), np.array(exp)


def rank_chi2_test(observed: np.ndarray, expected: np.ndarray) -> WindowTestResult:
    """Chi-square of rank-bucket counts; under H0 each count is a sum of independent Bernoullis, whose
    variance is below the multinomial one, so the test is slightly conservative."""
    obs, exp = merge_small(observed, expected)
    if len(obs) < 2:
        return WindowTestResult("chi2", 0.0, 1.0)
    exp = exp * obs.sum() / exp.sum()  # float rounding only: both sum to the token count
    result = stats.chisquare(obs, exp)
    return WindowTestResult("chi2", float(result.statistic), float(result.pvalue))


def holm(results: list[WindowTestResult]) -> list[WindowTestResult]:
    """Holm step-down adjusted p-values (family-wise error control across a window's tests)."""
    m = len(results)
    order = sorted(range(m), key=lambda i: results[i].p_value)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * results[i].p_value))
        adjusted[i] = running
    return [WindowTestResult(r.name, r.statistic, r.p_value, adjusted[i]) for i, r in enumerate(results)]


def window_tests(pit: np.ndarray, rank_observed: np.ndarray, rank_expected: np.ndarray) -> list[WindowTestResult]:
    if len(pit) == 0:
        return []
    return holm([ks_test(pit), rank_chi2_test(rank_observed, rank_expected)])


@dataclass
class BettingState:
    """Wealth of each bettor; arrays have any leading batch shape (independent streams) + [len(FREQUENCIES)]."""

    log_wealth: np.ndarray
    lam: np.ndarray
    curvature: np.ndarray
    tokens: np.ndarray

    @classmethod
    def fresh(cls, batch: tuple[int, ...] = ()) -> BettingState:
        shape = batch + (len(FREQUENCIES),)
        return cls(np.zeros(shape), np.zeros(shape), np.ones(shape), np.zeros(batch, dtype=np.int64))

    def log_evidence(self) -> np.ndarray:
        """log of the mixture wealth M_t (equal weights over bettors)."""
        top = self.log_wealth.max(-1, keepdims=True)
        return (top + np.log(np.exp(self.log_wealth - top).mean(-1, keepdims=True)))[..., 0]

    def to_json(self) -> dict:
        return {k: getattr(self, k).tolist() for k in ("log_wealth", "lam", "curvature", "tokens")}

    @classmethod
    def from_json(cls, data: dict) -> BettingState:
        return cls(
            *(np.asarray(data[k], dtype=float) for k in ("log_wealth", "lam", "curvature")),
            np.asarray(data["tokens"], dtype=np.int64),
        )


def bet(state: BettingState, u: np.ndarray) -> None:
    """Update with one PIT value per stream (u has the batch shape): bet, then adapt lambda (ONS)."""
    g = np.cos(np.pi * FREQUENCIES * u[..., None])
    gain = 1.0 + state.lam * g
    state.log_wealth += np.log(gain)
    grad = g / gain
    state.curvature += grad**2
    state.lam = np.clip(state.lam + _ONS_RATE * grad / state.curvature, -_LAMBDA_MAX, _LAMBDA_MAX)
    state.tokens += 1


class BettingMonitor:
    """Anytime-valid monitor of one PIT stream; `crossed` once the evidence reaches 1/alpha (sticky)."""

    def __init__(
        self, alpha: float, state: BettingState | None = None, crossed_at: int | None = None, peak: float = 0.0
    ):
        self.alpha = alpha
        self.state = state or BettingState.fresh()
        self.crossed_at = crossed_at  # tokens seen when the threshold was first reached
        self.peak = peak  # largest log evidence so far

    @property
    def threshold(self) -> float:
        return float(np.log(1.0 / self.alpha))

    @property
    def log_evidence(self) -> float:
        return float(self.state.log_evidence())

    @property
    def crossed(self) -> bool:
        return self.crossed_at is not None

    def p_value(self) -> float:
        """Anytime-valid p-value: min(1, 1 / largest evidence so far)."""
        return float(min(1.0, np.exp(-self.peak)))

    def update(self, pit: np.ndarray) -> None:
        for u in np.asarray(pit, dtype=float):
            bet(self.state, np.asarray(u))
            self.peak = max(self.peak, self.log_evidence)
            if self.crossed_at is None and self.peak >= self.threshold:
                self.crossed_at = int(self.state.tokens)

    def force_alarm(self) -> None:
        """Evidence no uniform stream can produce (an impossible token): cross now."""
        self.peak = float("inf")
        if self.crossed_at is None:
            self.crossed_at = int(self.state.tokens)

    def to_json(self) -> dict:
        return {
            "alpha": self.alpha,
            "state": self.state.to_json(),
            "crossed_at": self.crossed_at,
            "peak": None if np.isinf(self.peak) else self.peak,
        }

    @classmethod
    def from_json(cls, data: dict) -> BettingMonitor:
        peak = float("inf") if data["peak"] is None else data["peak"]
        return cls(data["alpha"], BettingState.from_json(data["state"]), data["crossed_at"], peak)


def tokens_to_cross(pit: np.ndarray, alpha: float) -> np.ndarray:
    """For streams pit[S, T]: tokens until the mixture evidence first reaches 1/alpha (T+1 = never)."""
    streams, length = pit.shape
    state = BettingState.fresh((streams,))
    first = np.full(streams, length + 1)
    threshold = np.log(1.0 / alpha)
    for t in range(length):
        bet(state, pit[:, t])
        hit = (state.log_evidence() >= threshold) & (first > length)
        first[hit] = t + 1
    return first
