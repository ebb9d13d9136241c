"""harness.step_probe: device ops and host syncs counted on a CPU as a GPU would see them."""

from __future__ import annotations

import time

import pytest
import torch

from harness.step_probe import HostSyncError, StepProbe, machinery_seconds

DEVICE = torch.device("cpu")  # the probe's "device": tensors made before it or on an explicit device


def test_host_data_costs_nothing():
    with StepProbe() as probe:
        host = torch.tensor([3, 1, 2])
        doubled = (host * 2).sort().values
        assert doubled.tolist() == [2, 4, 6]
        assert int(doubled[0]) == 2 and bool(doubled.any())
        assert host[host > 1].tolist() == [3, 2]  # a host mask selects on the host
        torch.rand(4, generator=torch.Generator().manual_seed(0))
    counts = probe.take()
    assert (counts.device_ops, counts.host_syncs) == (0, 0)


def test_host_calls_count_each_torch_call_on_host_data_and_nothing_on_device_data():
    device = torch.ones(3)  # made before the probe: device data
    with StepProbe() as probe:
        host = torch.tensor([3, 1, 2])  # 1
        (host * 2).sum()  # 2
        for value in (1, 2, 3):  # a per-request loop: one call a request
            torch.tensor([value])
        device + 1  # a device op, not a host call
        with probe.paused():
            torch.tensor([0])  # paused: not counted
    counts = probe.take()
    assert counts.host_calls == 6 and counts.device_ops == 1


@pytest.mark.parametrize(
    "read, what",
    [
        (lambda d: d.item(), "item"),
        (lambda d: d.tolist(), "tolist"),
        (lambda d: bool(d), "__bool__"),
        (lambda d: int(d), "__int__"),
        (lambda d: float(d), "__float__"),
        (lambda d: d.cpu(), "cpu"),
        (lambda d: d.numpy(), "numpy"),
        (lambda d: d.nonzero(), "nonzero"),
        (lambda d: torch.where(d > 0), "where"),
        (lambda d: d[d > 0], "__getitem__"),
        (lambda d: d.__setitem__(d > 0, 0.0), "__setitem__"),
        (lambda d: d.unique(), "unique"),
    ],
)
def test_each_read_of_device_data_is_one_sync_at_its_site(read, what):
    device = torch.ones(1)  # made before the probe: device data
    with StepProbe() as probe:
        read(device)
    counts = probe.take()
    assert counts.host_syncs == 1
    ((site, n),) = counts.sync_sites.items()
    assert n == 1 and site.startswith("tests/test_step_probe.py:") and site.endswith(f"({what})")


def test_device_ops_counted_host_copies_become_device_data():
    weight = torch.randn(4, 4)
    with StepProbe() as probe:
        x = torch.ones(4, device=DEVICE)  # an explicit device: device data (1 op)
        y = weight @ x  # 1 op
        shipped = torch.tensor([1, 2]).to(DEVICE)  # host -> device: one copy, then device data
        shipped.tolist()  # a read of the shipped copy syncs
        back = y.cpu()  # 1 sync (a copy)
        back.tolist()  # host data now: free
    counts = probe.take()
    assert counts.host_syncs == 2
    assert counts.device_ops >= 3
    assert counts.op_names["mv.default"] == 1


def test_views_are_device_ops_that_launch_no_kernel():
    device = torch.randn(4, 6)
    with StepProbe() as probe:
        view = device[1:].transpose(0, 1).unsqueeze(0).view(6, 3)  # slice, transpose, unsqueeze, view
        view * 2  # a multiply: a kernel
        device.clone()  # a copy: a kernel
    counts = probe.take()
    assert (counts.device_ops, counts.kernel_ops) == (6, 2), counts.op_names


def test_paused_regions_and_kernels():
    weight = torch.randn(4, 4)
    with StepProbe() as probe:
        with probe.paused():
            (weight @ weight).sum().item()  # the target's forward: not counted
        with probe.kernel("standin:copy"):
            weight[weight > 0].sum().item()  # a stand-in kernel: one op, its insides nothing
    counts = probe.take()
    assert (counts.device_ops, counts.kernel_ops, counts.host_syncs) == (1, 1, 0)
    assert counts.op_names["standin:copy"] == 1


def test_device_op_seconds_are_the_ops_own_time_not_the_hosts():
    weight = torch.randn(64, 64)
    with StepProbe() as probe:
        time.sleep(0.2)  # host work between ops: not device-op time
        with probe.paused():
            time.sleep(0.2)  # the target's forward: neither
        torch.tensor([1.0, 2.0]) * 3  # ops on host data: neither
        with probe.kernel("standin:slow"):
            time.sleep(0.15)  # a stand-in kernel's whole call is device-op time
        weight @ weight
    counts = probe.take()
    assert counts.device_ops == 2
    assert 0.15 <= counts.device_op_s < 0.3, counts.device_op_s
    with StepProbe() as probe:
        torch.tensor([1.0, 2.0]).sum()
    assert probe.take().device_op_s == 0.0


def test_the_probes_own_time_is_apart_from_the_steps_host_work_and_its_ops():
    weight = torch.randn(64, 64)
    with StepProbe(op_sites=True) as probe:
        time.sleep(0.2)  # host work between ops: the step's, not the probe's
        for _ in range(50):
            weight @ weight  # a device op: its handlers' bookkeeping is the probe's, the op itself is not
            torch.tensor([1, 2])  # a host call
        with probe.paused():
            weight.sum()  # the target's forward: no handler call counts
    counts = probe.take()
    assert counts.device_ops == 50 and counts.host_calls == 50
    # every counted op and host call went through at least one handler (a host call's own aten ops too)
    assert counts.handler_calls >= 150, counts.handler_calls
    assert 0 < counts.probe_s < 0.1, counts.probe_s  # the sleep and the matmuls are not billed to the probe
    assert 0 < counts.device_op_s < 0.2


def test_the_mode_machinery_cost_is_measured_per_handler_call():
    cost = machinery_seconds(calls=400, repeats=2)
    assert 0 <= cost < 2e-4, cost  # microseconds a call, not the loop's whole time


def test_strict_probe_raises_at_the_first_sync():
    device = torch.ones(3)
    with pytest.raises(HostSyncError, match=r"test_step_probe.py:\d+ \(tolist\)"):
        with StepProbe(strict=True):
            (device + 1).tolist()


def test_marked_host_state_is_host_data():
    class Learner:
        def __init__(self):
            self.edges = torch.tensor([0.5, 0.9])
            self.bands = [{"seen": torch.zeros(2)}]

    learner = Learner()
    with StepProbe() as probe:
        probe.mark_host_within(learner)
        float(learner.edges[0]) + float(learner.bands[0]["seen"].sum())
    assert probe.take().host_syncs == 0


def test_a_function_fused_on_cuda_counts_as_the_one_kernel_cuda_dispatches():
    """F.rms_norm decomposes into five ops on a CPU and is one `_fused_rms_norm` on CUDA: the probe counts
    the one, at its caller's site. Each FUSED_ON_CUDA entry is checked against the installed torch's own
    dispatch of a fake CUDA tensor under no_grad (as SGLang runs a step), so a torch that stops fusing it
    fails here."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from harness.step_probe import FUSED_ON_CUDA

    class Dispatched(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "aten":
                self.ops.append(str(func.__name__))
            return func(*args, **(kwargs or {}))

    def on(device: str, func) -> list[str]:
        with FakeTensorMode(), torch.no_grad():
            x, weight = torch.empty(2, 3, 8, device=device), torch.empty(8, device=device)
            with Dispatched() as seen:
                func(x, (8,), weight, 1e-6)
        return seen.ops

    for func, op in FUSED_ON_CUDA.items():
        assert on("cuda", func) == [op]
        assert len(on("cpu", func)) > 1  # what the CPU dispatches (and the probe does not count)

    x, weight = torch.randn(2, 3, 8), torch.rand(8)
    with torch.no_grad(), StepProbe(op_sites=True) as probe:
        normed = torch.nn.functional.rms_norm(x, (8,), weight, 1e-6)
        normed * 2
    counts = probe.take()
    assert (counts.device_ops, counts.kernel_ops) == (2, 2), counts.op_names
    assert counts.op_names["_fused_rms_norm.default"] == 1
    assert [n for site, n in counts.op_sites.items() if site.startswith("tests/test_step_probe.py:")] == [1, 1]
    assert torch.equal(normed, torch.nn.functional.rms_norm(x, (8,), weight, 1e-6))  # computed as ever
