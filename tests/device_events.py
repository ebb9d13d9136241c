"""A GPU's timing events on a CPU: torch.cuda.Event replaced by `DeviceEvent` (whose device time the test
sets), and any device-wide wait refused, for code that must time a GPU step without stalling it."""

from __future__ import annotations

import torch


class DeviceEvent:
    """torch.cuda.Event on a device whose clock the test sets: an event is reached at `device_ms` as it
    stands when recorded, `elapsed_time` reads those times (ms), `query` says whether the device got
    there yet (`reached`), and `log` lists what was asked of events."""

    device_ms = 0.0
    reached = True
    log: list[str] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at_ms = None

    def record(self) -> None:
        self.at_ms = DeviceEvent.device_ms
        DeviceEvent.log.append("record")

    def query(self) -> bool:
        return DeviceEvent.reached

    def synchronize(self) -> None:
        DeviceEvent.log.append("wait")

    def elapsed_time(self, other: DeviceEvent) -> float:
        return other.at_ms - self.at_ms


def fake_device_events(monkeypatch) -> type[DeviceEvent]:
    """DeviceEvent reset and installed as torch.cuda.Event; torch.cuda.synchronize raises."""
    DeviceEvent.device_ms, DeviceEvent.reached, DeviceEvent.log = 0.0, True, []
    monkeypatch.setattr(torch.cuda, "Event", DeviceEvent)

    def refused(*args, **kwargs):
        raise AssertionError("the step waited for the device")

    monkeypatch.setattr(torch.cuda, "synchronize", refused)
    return DeviceEvent
