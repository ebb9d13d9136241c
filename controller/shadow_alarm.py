"""The shadow checker's drift alarm, as the controller reads it.

`jetspec shadow run` exposes the gauge `jetspec_shadow_alarm` (1 = alarm in force) on its
`--metrics-port` /metrics page and in the textfile `<out>/shadow.prom`; `--shadow-alarm` names
either (an http(s) URL, or a file path). With the policy's `shadow.gate_on_alarm: true` the
controller pushes budget 0 to every cohort while the alarm is in force (controller/loop.py).
An unreadable source keeps the last value read (failing open or closed on a network blip would flap
speculation); it is counted in `jetspec_controller_telemetry_failures{source}`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from controller.http import Transport

log = logging.getLogger(__name__)

ALARM_METRIC = "jetspec_shadow_alarm"


def parse_alarm(text: str) -> bool:
    """Whether a Prometheus text page shows the alarm in force; ValueError if the gauge is missing."""
    ours = "\n".join(line for line in text.splitlines() if ALARM_METRIC in line)
    for family in text_string_to_metric_families(ours + "\n"):
        for sample in family.samples:
            if sample.name == ALARM_METRIC:
                return sample.value >= 1.0
    raise ValueError(f"no {ALARM_METRIC} gauge on the page -- is it the shadow checker's /metrics or shadow.prom?")


class ShadowAlarmSource:
    def __init__(self, location: str, transport: Transport, timeout_s: float = 5.0):
        self.location = location
        self._transport = transport
        self._timeout_s = timeout_s
        self.in_force = False  # last value read

    def _page(self) -> str:
        if self.location.startswith(("http://", "https://")):
            url = (
                self.location
                if self.location.rstrip("/").endswith("/metrics")
                else self.location.rstrip("/") + "/metrics"
            )
            status, body = self._transport("GET", url, {}, None, self._timeout_s)
            if status != 200:
                raise ConnectionError(f"GET {url} answered {status}")
            return body.decode()
        return Path(self.location).read_text()

    def read(self) -> bool:
        """Refresh from the source; raises ConnectionError/OSError/ValueError (and keeps the old value)."""
        self.in_force = parse_alarm(self._page())
        return self.in_force
