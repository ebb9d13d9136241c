"""The controller gates speculation off in every cohort while the shadow alarm is in force."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import start_http_server

from controller.http import urllib_transport
from controller.loop import SHADOW_ALARM, Controller
from controller.observability import Observer
from controller.shadow_alarm import ShadowAlarmSource
from controller.telemetry import Reading
from policies.loader import parse_policy_text
from policies.problems import PolicyError
from shadow.metrics import ShadowMetrics

POLICY = """\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 16], default: 16}
  - {name: bs2-8, min_batch: 2, max_batch: 8, budgets: [0, 4, 8], default: 4}
shadow: {gate_on_alarm: %s}
"""


class NoTelemetry:
    def read(self) -> Reading:
        return Reading(None)


def controller(gate: bool, source: ShadowAlarmSource) -> Controller:
    observer = Observer(TracerProvider().get_tracer("test"))
    return Controller(
        parse_policy_text(POLICY % str(gate).lower()),
        NoTelemetry(),
        [],
        lambda: 100.0,
        observer,
        dry_run=True,
        shadow_alarm=source,
    )


def test_alarm_in_the_textfile_gates_every_cohort_off_and_release_restores(tmp_path):
    metrics = ShadowMetrics()
    prom = tmp_path / "shadow.prom"
    metrics.alarm.set(1)
    metrics.write_textfile(prom)
    ctl = controller(True, ShadowAlarmSource(str(prom), urllib_transport))
    decisions = ctl.step()
    assert ctl.table.budgets() == {"bs1": 0, "bs2-8": 0}
    assert all(c.probe is None for c in ctl.table.cohorts)
    assert {(d.cohort, d.previous, d.budget, d.reason) for d in decisions} == {
        ("bs1", 16, 0, SHADOW_ALARM),
        ("bs2-8", 4, 0, SHADOW_ALARM),
    }
    metrics.alarm.set(0)
    metrics.write_textfile(prom)
    ctl.step()
    assert ctl.table.budgets() == {"bs1": 16, "bs2-8": 4}


def test_alarm_read_from_the_checkers_metrics_endpoint_and_kept_when_unreadable(tmp_path):
    metrics = ShadowMetrics()
    metrics.alarm.set(1)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    source = ShadowAlarmSource(f"http://127.0.0.1:{server.server_port}", urllib_transport)
    ctl = controller(True, source)
    ctl.step()
    assert ctl.table.budgets() == {"bs1": 0, "bs2-8": 0}
    server.shutdown()
    server.server_close()
    ctl.step()  # checker gone: keep the last value read, count the failure
    assert ctl.table.budgets() == {"bs1": 0, "bs2-8": 0}
    assert (
        ctl._observer.registry.get_sample_value(
            "jetspec_controller_telemetry_failures_total", {"source": source.location}
        )
        == 1
    )


def test_policy_without_gate_on_alarm_ignores_the_alarm(tmp_path):
    metrics = ShadowMetrics()
    metrics.alarm.set(1)
    metrics.write_textfile(tmp_path / "shadow.prom")
    ctl = controller(False, ShadowAlarmSource(str(tmp_path / "shadow.prom"), urllib_transport))
    ctl.step()
    assert ctl.table.budgets() == {"bs1": 16, "bs2-8": 4}


def test_gate_on_alarm_needs_off_in_every_cohort():
    text = POLICY.replace("budgets: [0, 4, 8], default: 4", "budgets: [4, 8], default: 4") % "true"
    with pytest.raises(PolicyError, match=r"cohorts\[1\] 'bs2-8' cannot be gated off"):
        parse_policy_text(text)
