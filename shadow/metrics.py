"""The checker's Prometheus metrics (names agreed in the ops alert rules and dashboards).

Exposed on `jetspec shadow run --metrics-port` and written as a node-exporter textfile
(`<out>/shadow.prom`), which is also what `python -m controller --shadow-alarm FILE` can read.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, write_to_textfile

MODES = ("greedy", "sampled")
KINDS = ("tie", "error")
TESTS = ("ks", "chi2", "sequential")


class ShadowMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter("jetspec_shadow_requests_checked", "Shadow requests re-checked", ["mode"], registry=r)
        self.tokens = Counter("jetspec_shadow_tokens_checked", "Emitted tokens re-checked", ["mode"], registry=r)
        self.mismatches = Counter(
            "jetspec_shadow_mismatches",
            "Tokens the non-speculative target would not have emitted, by kind: error (greedy: "
            "not the argmax beyond the tie margin; sampled: outside the request's support beyond "
            "it) or tie (within the margin)",
            ["kind"],
            registry=r,
        )
        self.p_value = Gauge(
            "jetspec_shadow_p_value",
            "p-value of the latest window (ks, chi2: Holm-adjusted; sequential: anytime-valid)",
            ["test"],
            registry=r,
        )
        self.alarm = Gauge("jetspec_shadow_alarm", "1 while the shadow drift alarm is in force", registry=r)
        self.alarms = Counter("jetspec_shadow_alarms", "Windows that raised the drift alarm", registry=r)
        self.last_check = Gauge(
            "jetspec_shadow_last_check_timestamp_seconds", "Unix time of the latest checked window", registry=r
        )
        for mode in MODES:  # every series exists from the start: rate() and absent() alerts see zeros
            self.requests.labels(mode)
            self.tokens.labels(mode)
        for kind in KINDS:
            self.mismatches.labels(kind)
        for test in TESTS:
            self.p_value.labels(test).set(1.0)

    def write_textfile(self, path: str | Path) -> None:
        write_to_textfile(str(path), self.registry)  # atomic: written to a temp file, then renamed
