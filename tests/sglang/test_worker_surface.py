"""JetSpecWorker offers everything the installed SGLang's scheduler reaches for on a spec worker.

The surface is read from the installed source: every `<x>.draft_worker.<name>` /
`<x>.model_worker.<name>` attribute and every `getattr(draft_worker, "<name>", ...)` in
sglang/srt/managers, so an SGLang upgrade that starts calling something new fails this test."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

sglang = pytest.importorskip("sglang")

# Reached only for other algorithms, behind their own checks (DSpark's /set_internal_state keys and
# info records, the overlap scheduler's confidence relay, which JETSPEC refuses).
OTHER_ALGORITHMS = {
    "set_dspark_forced_budget_frac",
    "clear_info_records",
    "dump_info_records",
    "get_confidence_budget_prepare",
}


def _scheduler_surface() -> set[str]:
    names = set()
    root = Path(sglang.__file__).parent / "srt" / "managers"
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr in ("draft_worker", "model_worker")
            ):
                names.add(node.attr)
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "getattr"
                and len(node.args) >= 2
                and getattr(node.args[0], "id", getattr(node.args[0], "attr", None)) == "draft_worker"
                and isinstance(node.args[1], ast.Constant)
            ):
                names.add(node.args[1].value)
    return names


def test_every_attribute_the_scheduler_uses_exists():
    from sglang_jetspec.adapter.worker import JetSpecWorker

    surface = _scheduler_surface()
    assert {
        "forward_batch_generation",
        "alloc_memory_pool",
        "note_request_finished",
        "speculative_num_steps",
    } <= surface
    assert OTHER_ALGORITHMS <= surface, "an excluded name vanished from SGLang: shrink OTHER_ALGORITHMS"
    instance_attrs = {"model_runner", "speculative_num_steps", "speculative_num_draft_tokens"}  # set at start-up
    init_source = inspect.getsource(JetSpecWorker.__init__) + inspect.getsource(JetSpecWorker._assemble)
    assert all(f"self.{a} =" in init_source for a in instance_attrs)
    missing = sorted(n for n in surface - OTHER_ALGORITHMS - instance_attrs if not hasattr(JetSpecWorker, n))
    assert missing == []


def test_forward_accepts_both_scheduler_call_forms():
    """Overlap off: forward_batch_generation(batch, pp_proxy_tensors=...); overlap on (refused, but
    the signature must still bind): (batch, on_publish=..., grammar_barrier=...)."""
    from sglang_jetspec.adapter.worker import JetSpecWorker

    sig = inspect.signature(JetSpecWorker.forward_batch_generation)
    sig.bind(None, "batch", pp_proxy_tensors=None)
    sig.bind(None, "batch", on_publish=print, grammar_barrier=None)


def test_result_fields_exist_on_sglang_generation_batch_result():
    """Every keyword the worker and its commit phase pass to GenerationBatchResult is a field of the installed class."""
    import dataclasses

    from sglang.srt.managers.utils import GenerationBatchResult

    from sglang_jetspec.adapter import step_commit, worker  # prefill results, decode results

    fields = {f.name for f in dataclasses.fields(GenerationBatchResult)}
    used = {
        kw.arg
        for module in (worker, step_commit)
        for node in ast.walk(ast.parse(inspect.getsource(module)))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "GenerationBatchResult"
        for kw in node.keywords
    }
    assert {"accept_lens", "new_seq_lens", "next_draft_input", "speculative_output_stride"} <= used
    assert used - fields == set()


def test_base_class_defaults_the_worker_relies_on():
    from sglang.srt.speculative.base_spec_worker import BaseSpecWorker

    from sglang_jetspec.adapter.worker import JetSpecWorker

    assert issubclass(JetSpecWorker, BaseSpecWorker)
    worker = JetSpecWorker.__new__(JetSpecWorker)
    BaseSpecWorker.__init__(worker)  # what JetSpecWorker._assemble calls first
    assert worker._draft_model_runners() == () and worker.weight_update_runners() == []
    assert worker.primary_draft_kv_pool is None and worker.draft_worker is None
    assert (
        worker.graph_memory_usage is not None and worker.weight_load_time == 0.0 and worker.preloaded_weights_bytes == 0
    )


def test_draft_state_survives_filter_and_merge():
    import torch

    from sglang_jetspec.adapter.spec_inputs import JetSpecDraftState

    a = JetSpecDraftState(torch.tensor([5, 6, 7]), torch.tensor([10, 11, 12]))
    a.filter_batch(new_indices=torch.tensor([0, 2]), new_indices_cpu=[0, 2])
    a.merge_batch(JetSpecDraftState(torch.tensor([9]), torch.tensor([3])))
    assert a.bonus_tokens.tolist() == [5, 7, 9] and a.new_seq_lens.tolist() == [10, 12, 3]
    assert a.topk_p is None and a.hidden_states is None and a.is_verify_input()
