"""Telemetry sources: how much each (cohort, budget) ran and committed since the last read.

Two sources read the worker counters of the telemetry contract:
- `ScrapeSource` scrapes each server's /metrics (Prometheus text format) and differences the
  cumulative counters itself, treating a decrease as a counter reset (server restart);
- `PrometheusApiSource` asks a Prometheus server for `increase(...)` over the interval, for fleets.

Neither sends a key: SGLang serves /metrics without auth even with --api-key or --admin-api-key (its
middleware, sglang/srt/utils/auth.py, lets /health*, /ready* and /metrics* through, for probes and
Prometheus), and so does the reference server.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families

from controller.http import Transport

log = logging.getLogger(__name__)

# Usage field -> worker counter (labels cohort, budget). Goodput = committed_tokens / request_seconds.
COUNTERS = {
    "steps": "jetspec_steps_total",
    "committed_tokens": "jetspec_committed_tokens_total",
    "request_seconds": "jetspec_request_seconds_total",
}

Key = tuple[str, int]  # (cohort, budget)


@dataclass(frozen=True)
class Usage:
    """Counter increases of one (cohort, budget) over one interval."""

    steps: float = 0.0
    committed_tokens: float = 0.0
    request_seconds: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.steps + other.steps,
            self.committed_tokens + other.committed_tokens,
            self.request_seconds + other.request_seconds,
        )


@dataclass
class Reading:
    """One read: usage per (cohort, budget), or None while no baseline exists yet; failed sources."""

    usage: dict[Key, Usage] | None
    failed: list[str] = field(default_factory=list)


class TelemetrySource(Protocol):
    def read(self) -> Reading: ...


def _add_usage(total: dict[Key, Usage], key: Key, name: str, value: float) -> None:
    total[key] = total.get(key, Usage()) + Usage(**{name: value})


def parse_counters(text: str) -> dict[tuple[str, Key], float]:
    """Cumulative jetspec counters in a /metrics page: {(usage field, (cohort, budget)): value}."""
    wanted = {metric: name for name, metric in COUNTERS.items()}
    # A server's page holds hundreds of other series; parse only the lines about ours.
    ours = "\n".join(line for line in text.splitlines() if "jetspec_" in line)
    values: dict[tuple[str, Key], float] = {}
    for family in text_string_to_metric_families(ours + "\n"):
        for sample in family.samples:
            name = wanted.get(sample.name)
            if name is None:
                continue
            key = (sample.labels["cohort"], int(sample.labels["budget"]))
            # The same series on a page twice (two exporters behind one endpoint) adds up.
            values[(name, key)] = values.get((name, key), 0.0) + sample.value
    return values


class CounterDeltas:
    """Differences of cumulative counters between reads, surviving counter resets."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, Key], float] | None = None

    def update(self, current: dict[tuple[str, Key], float]) -> dict[Key, Usage] | None:
        previous, self._last = self._last, current
        if previous is None:
            return None
        usage: dict[Key, Usage] = {}
        for series, value in current.items():
            before = previous.get(series, 0.0)  # a series born since the last read started at 0
            # A counter that went down was reset (process restart): everything it shows is new.
            delta = value - before if value >= before else value
            if delta:
                _add_usage(usage, series[1], series[0], delta)
        return usage


class ScrapeSource:
    def __init__(self, server_urls: list[str], transport: Transport, timeout_s: float = 5.0):
        self._urls = list(server_urls)
        self._transport = transport
        self._timeout_s = timeout_s
        self._deltas = {url: CounterDeltas() for url in self._urls}

    def read(self) -> Reading:
        total: dict[Key, Usage] | None = None
        failed = []
        for url in self._urls:
            try:
                status, body = self._transport("GET", f"{url}/metrics", {}, None, self._timeout_s)
                if status != 200:
                    raise ConnectionError(f"GET {url}/metrics answered {status}")
                usage = self._deltas[url].update(parse_counters(body.decode()))
            except (ConnectionError, ValueError, KeyError) as exc:
                log.warning("telemetry: cannot scrape %s: %s", url, exc)
                failed.append(url)
                continue
            if usage is not None:
                total = total if total is not None else {}
                for key, part in usage.items():
                    total[key] = total.get(key, Usage()) + part
        return Reading(total, failed)


class PrometheusApiSource:
    def __init__(self, base_url: str, interval_s: float, transport: Transport, timeout_s: float = 10.0):
        self._base_url = base_url.rstrip("/")
        self._range = f"{max(1, round(interval_s))}s"
        self._transport = transport
        self._timeout_s = timeout_s

    def query_for(self, metric: str) -> str:
        return f"sum by (cohort, budget) (increase({metric}[{self._range}]))"

    def read(self) -> Reading:
        usage: dict[Key, Usage] = {}
        for name, metric in COUNTERS.items():
            url = f"{self._base_url}/api/v1/query?" + urllib.parse.urlencode({"query": self.query_for(metric)})
            try:
                status, body = self._transport("GET", url, {}, None, self._timeout_s)
                payload = json.loads(body)
                if status != 200 or payload.get("status") != "success":
                    raise ConnectionError(f"query answered {status}: {payload.get('error', '')}")
                for series in payload["data"]["result"]:
                    key = (series["metric"]["cohort"], int(series["metric"]["budget"]))
                    _add_usage(usage, key, name, float(series["value"][1]))
            except (ConnectionError, ValueError, KeyError, TypeError) as exc:
                log.warning("telemetry: Prometheus query for %s failed: %s", metric, exc)
                return Reading({}, [self._base_url])
        return Reading(usage)
