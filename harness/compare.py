"""What a comparison of speculative and plain servers reads from them (bench/gpu/sglang_compare.py on a GPU,
bench/sglang_cpu_compare.py on the CPU harness): the accept length from /generate replies, and the JETSPEC
worker's time by phase from its own `jetspec_<phase>_seconds_total` counters."""

from __future__ import annotations

from .client import metrics

# the JETSPEC worker's phases, in step order, as its counters name them
WORKER_PHASES = ("draft", "tree", "verify", "accept", "commit")
# the warm-up request before a timed pass: a text no timed request repeats (the hybrid drafter and NGRAM
# look up finished outputs)
WARMUP_TEXT = "Warm-up request: count from one to five."


def mean_accept_length(responses: list[dict]) -> float | None:
    """Committed tokens per verify step over all responses (None for a server that does not speculate)."""
    steps = sum(r["meta_info"].get("spec_verify_ct") or 0 for r in responses)
    return sum(r["meta_info"]["completion_tokens"] for r in responses) / steps if steps else None


def worker_seconds(url: str) -> dict[str, float]:
    """The JETSPEC worker's phase counters and step count (`steps`) on the server at `url`, summed over
    cohorts and budgets ({} for a server without --enable-metrics: plain, NGRAM)."""
    try:
        found = metrics(url, timeout=30)
    except OSError:
        return {}
    names = {p: f"jetspec_{p}_seconds_total" for p in WORKER_PHASES} | {"steps": "jetspec_steps_total"}
    return {key: sum(found.get(name, {}).values()) for key, name in names.items()}


def worker_phases(seconds: dict[str, float]) -> dict[str, float]:
    """`seconds` (worker_seconds, or a difference of two) by phase, each phase on its own: the worker's
    accept counter runs to the step's end, commit included, so the commit share is taken out of accept
    and the phases add up."""
    phases = {p: seconds.get(p, 0.0) for p in WORKER_PHASES}
    phases["accept"] -= phases["commit"]
    return phases
