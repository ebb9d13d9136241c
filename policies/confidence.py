"""The confidence bar shared by the controller's comparisons and the server's same-allocation control."""

from __future__ import annotations

import functools

from scipy import stats


@functools.lru_cache(maxsize=256)
def t_critical(z: float, dof: int) -> float:
    """Student-t quantile with the same one-sided level as z under the normal (z=2 -> 97.7%): with few
    samples the standard error is itself uncertain, so the bar widens."""
    return float(stats.t.ppf(stats.norm.cdf(z), dof))
