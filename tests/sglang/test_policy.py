"""Runtime policy: flat pushes through SGLang's /set_internal_state controller, readback, TTL revert."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from policies import load_policy
from policies.control_api import table_from_flat_args, table_to_flat_args
from policies.table import default_table
from sglang_jetspec.adapter.policy import POLICY_ENV, PolicyControl, load_runtime_policy, max_budget, policy_path
from tests.builders import internal_state_worker


@pytest.fixture()
def policy():
    return load_policy(policy_path())


def _push(policy, **budgets):
    flat = table_to_flat_args(default_table(policy))
    flat.update({f"jetspec_policy.{k.replace('_', '-')}.budget": v for k, v in budgets.items()})
    return flat


def test_default_policy_file_and_env_override(head_dir, tmp_path, monkeypatch):
    assert policy_path().name == "default.yaml"
    assert max_budget(load_runtime_policy(head_dir)) == 64
    other = tmp_path / "p.yaml"
    other.write_text("cohorts:\n  - {name: all, min_batch: 1, max_batch: 4, budgets: [0], default: 0}\n")
    monkeypatch.setenv(POLICY_ENV, str(other))
    assert max_budget(load_runtime_policy(head_dir)) == 1  # budget 0 still verifies the root


def test_start_up_reads_the_policy_file_once_per_content(head_dir, tmp_path, monkeypatch):
    from sglang_jetspec.adapter import policy as runtime_policy

    loads = []
    monkeypatch.setattr(runtime_policy, "load_policy", lambda path, head: loads.append(path) or load_policy(path, head))
    path = tmp_path / "p.yaml"
    path.write_text("cohorts:\n  - {name: all, min_batch: 1, max_batch: 4, budgets: [0, 4, 8], default: 8}\n")
    monkeypatch.setenv(POLICY_ENV, str(path))
    first = load_runtime_policy(head_dir)
    assert load_runtime_policy(head_dir) is first and len(loads) == 1  # checks, shape, worker: one read
    path.write_text("cohorts:\n  - {name: all, min_batch: 1, max_batch: 4, budgets: [0, 4, 16], default: 16}\n")
    assert max_budget(load_runtime_policy(head_dir)) == 16 and len(loads) == 2  # a new content is read again
    path.write_text("cohorts: [oops\n")
    for _ in range(2):  # an invalid file is refused every time, never served from the cache
        with pytest.raises(Exception, match="p.yaml"):
            load_runtime_policy(head_dir)
    assert len(loads) == 4


def test_flat_round_trip_with_probe(policy):
    table = default_table(policy).model_copy(update={"ttl_s": 30.0})
    flat = table_to_flat_args(table)
    assert all(isinstance(v, (int, float)) for v in flat.values())  # what SGLang's request type admits
    assert table_from_flat_args(flat, policy) == table
    flat["jetspec_policy.bs1.probe_budget"] = 64
    flat["jetspec_policy.bs1.probe_share"] = 0.05
    assert table_from_flat_args(flat, policy).cohorts[0].probe.budget == 64


def test_budget_by_cohort_zero_means_off(policy):
    control = PolicyControl(policy, admin_key_configured=True)
    assert control.step_plan(1, now=0.0) == ("bs1", 32, 0, 0, "hybrid", "adaptive", "top_k", True)
    assert control.step_plan(4, now=0.0) == ("bs2-6", 16, 0, 0, "hybrid", "adaptive", "top_k", True)
    assert control.step_plan(300, now=0.0) == ("bs25-256", 0, 0, 0, "head", None, "top_k", False)


def test_bad_push_is_rejected_and_previous_table_stays(policy):
    shown = []
    control = PolicyControl(policy, admin_key_configured=True, on_change=shown.append)
    assert control.push(_push(policy, bs1=64), now=0.0) == []
    problems = control.push(_push(policy, bs1=48), now=1.0)  # 48 is not a candidate of bs1
    assert problems and "cohorts[0].budget 48 is not a candidate of 'bs1'" in problems[0]
    problems = control.push({"jetspec_policy.nosuch.budget": 8, **_push(policy)}, now=1.0)
    assert any("unknown key jetspec_policy.nosuch.budget" in p for p in problems)
    assert control.step_plan(1, now=2.0) == ("bs1", 64, 0, 0, "hybrid", "adaptive", "top_k", True)
    assert control.readback(2.0)["generation"] == 1 and control.readback(2.0)["source"] == "pushed"
    assert [s.generation for s in shown] == [1]


def test_ttl_revert_to_yaml_default(policy):
    control = PolicyControl(policy, admin_key_configured=True)
    flat = _push(policy, bs1=64)
    flat["jetspec_policy.ttl_s"] = 10.0
    assert control.push(flat, now=100.0) == []
    assert control.step_plan(1, now=109.0) == ("bs1", 64, 0, 0, "hybrid", "adaptive", "top_k", True)
    assert control.step_plan(1, now=110.0) == ("bs1", 32, 0, 0, "hybrid", "adaptive", "top_k", True)
    assert control.readback(110.0)["source"] == "yaml"


def test_pushes_need_an_admin_key(policy):
    control = PolicyControl(policy, admin_key_configured=False)
    assert "--admin-api-key" in control.push(_push(policy, bs1=64), now=0.0)[0]
    assert control.step_plan(1, now=0.0) == ("bs1", 32, 0, 0, "hybrid", "adaptive", "top_k", True)


def _controller(control):
    from sglang.srt.managers.scheduler_components.internal_state import SchedulerInternalStateController

    return SchedulerInternalStateController(
        SimpleNamespace(draft_worker=internal_state_worker(control)), record_step_time=False
    )


def test_hooked_sglang_controller_applies_and_rejects(jetspec_registered, policy):
    """The hooks installed on SGLang's real SchedulerInternalStateController (as load_plugins does)."""
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput, SetInternalStateReq
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_jetspec.adapter import internal_state

    HookRegistry.apply_hooks()
    control = PolicyControl(policy, admin_key_configured=True)
    controller = _controller(control)
    good = controller.set_internal_state(SetInternalStateReq(server_args=_push(policy, bs1=64)))
    assert good.updated is True and control.step_plan(1, now=0.0).budget == 64
    assert control.last_refusal is None
    bad = controller.set_internal_state(SetInternalStateReq(server_args=_push(policy, bs1=48)))
    assert bad.updated is False and control.step_plan(1, now=0.0).budget == 64
    assert any("48" in problem for problem in control.last_refusal["problems"])  # why, for /server_info
    # a valid table next to a key SGLang rejects: all or nothing
    mixed = controller.set_internal_state(SetInternalStateReq(server_args={**_push(policy, bs1=8), "nope": 1}))
    assert mixed.updated is False and control.step_plan(1, now=0.0).budget == 64
    # readback: the AFTER hook on get_internal_state adds the state in force
    result = internal_state.after_get_internal_state(GetInternalStateReqOutput(internal_state={}), controller, None)
    assert result.internal_state["jetspec_policy"]["table"]["cohorts"][0]["budget"] == 64
    assert result.internal_state["jetspec_last_refused_push"] == control.last_refusal


def test_other_algorithms_pass_through(jetspec_registered):
    from sglang.srt.managers.io_struct import SetInternalStateReq
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.apply_hooks()
    controller = _controller(None)
    controller.scheduler.draft_worker = None  # e.g. an EAGLE server: SGLang's own answer
    assert (
        controller.set_internal_state(SetInternalStateReq(server_args={"jetspec_policy.ttl_s": 9.0})).updated is False
    )


def test_the_same_allocation_control_runs_native_blocks_but_never_under_a_seeded_request(policy):
    control = PolicyControl(policy, admin_key_configured=False)
    control.plans.control.config = control.plans.control.config.model_copy(
        update={"block_steps": 2, "explore_every": 2}
    )

    def budgets(seeded: bool, steps: int = 8) -> list[int]:
        out = []
        for i in range(steps):
            out.append(control.step_plan(1, 0.0, seeded).budget)
            control.served(1, 3 if out[-1] else 1, float(i + 1))
        return out

    yaml_budget = default_table(policy).budgets()["bs1"]
    # blocks of 2 steps, every second one native: budget 0 with the draft context kept
    assert budgets(seeded=False) == [yaml_budget, yaml_budget, 0, 0] * 2
    assert control.step_plan(1, 0.0).keep_draft_context
    assert budgets(seeded=True) == [yaml_budget] * 8  # a seed's tokens depend on the trees: the plan runs as is
    assert control.same_allocation_state()["bs1"]["blocks"]["native"] == 2
