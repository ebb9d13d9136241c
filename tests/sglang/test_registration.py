"""Registration: the entry point, a cheap idempotent load, a complete spec class, SGLang symbols."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ADAPTER = Path(__file__).resolve().parents[2] / "sglang_jetspec" / "adapter"
PLUGIN = ADAPTER.parent / "sglang_plugin.py"


def test_entry_point_is_declared_and_loads_load_plugin():
    (ep,) = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "jetspec"]
    assert ep.value == "sglang_jetspec.sglang_plugin:load_plugin"
    from sglang_jetspec.sglang_plugin import load_plugin

    assert ep.load() is load_plugin


def _run(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        cwd=ADAPTER.parents[1],
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_the_entry_module_imports_nothing_heavy():
    got = _run(
        "import sys, json; import sglang_jetspec.sglang_plugin; "
        "print(json.dumps({m: m in sys.modules for m in ('torch', 'sglang', 'prometheus_client')}))"
    )
    assert got == {"torch": False, "sglang": False, "prometheus_client": False}


def test_load_plugin_is_idempotent_touches_no_device_and_loads_no_model_code():
    got = _run(
        "import sys, json, time\n"
        "from sglang.srt.plugins import load_plugins\n"
        "from sglang_jetspec.sglang_plugin import load_plugin\n"
        "t = time.perf_counter(); load_plugins(); first = time.perf_counter() - t\n"
        "t = time.perf_counter(); load_plugin(); load_plugin(); again = time.perf_counter() - t\n"
        "import torch\n"
        "from sglang.srt.plugins.hook_registry import HookRegistry\n"
        "from sglang_jetspec.adapter.registration import HOOKS\n"
        "from sglang.srt.speculative.spec_registry import _REGISTRY\n"
        "print(json.dumps({'cuda_initialized': torch.cuda.is_initialized(),\n"
        "  'model_code': [m for m in ('sglang.srt.models.registry', 'sglang.srt.models.dflash', "
        "'sglang_jetspec.adapter.worker', 'sglang_jetspec.core.head') if m in sys.modules],\n"
        "  'hooks_per_target': [len(HookRegistry._hooks[t]) for t, _, _ in HOOKS],\n"
        "  'patched': sorted(t for t, _, _ in HOOKS if t in HookRegistry._patched),\n"
        "  'registered': sorted(_REGISTRY), 'again_s': again, 'first_s': first}))\n"
    )
    assert got["cuda_initialized"] is False
    assert got["model_code"] == []
    assert got["hooks_per_target"] == [1] * 14  # loaded three times, registered once (14 = len(HOOKS))
    assert len(got["patched"]) == 14
    assert got["registered"] == ["JETSPEC"]
    assert got["again_s"] < 0.05, "a repeated load must be a no-op"


def test_from_string_returns_the_plugin_spec(jetspec_registered):
    from sglang_jetspec.adapter.spec_algo import JetSpecAlgo

    assert isinstance(jetspec_registered, JetSpecAlgo)
    assert jetspec_registered.name == "JETSPEC"
    assert jetspec_registered.is_speculative() and not jetspec_registered.is_eagle()
    assert jetspec_registered.supports_overlap is False


def _required_methods() -> set[str]:
    """Every method the scheduler may call on an algorithm: the installed enum's and CustomSpecAlgo's."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    enum_methods = {
        n
        for n, v in vars(SpeculativeAlgorithm).items()
        if not n.startswith("_") and callable(getattr(v, "__func__", v)) and not isinstance(v, SpeculativeAlgorithm)
    }
    enum_methods -= {"from_string", "register"}  # classmethods of the enum, not per-algorithm calls
    custom = {n for n, v in vars(CustomSpecAlgo).items() if not n.startswith("_") and callable(v)}
    return enum_methods | custom


def test_spec_class_has_every_method_of_the_installed_sglang(jetspec_registered):
    required = _required_methods()
    # the four the notes list as missing from CustomSpecAlgo must be among them (sanity of the walk)
    assert {"carries_draft_hidden_states", "create_future_map", "need_topk", "get_platform_worker_cls"} <= required
    missing = sorted(n for n in required if not callable(getattr(jetspec_registered, n, None)))
    assert missing == []
    assert jetspec_registered.carries_draft_hidden_states() is False
    assert jetspec_registered.need_topk() is False
    # SGLang reads a non-None answer as "an out-of-tree platform replaces the worker"
    assert jetspec_registered.get_platform_worker_cls() is None


def _sglang_references() -> list[str]:
    """Every `sglang.*` module or name the adapter imports, read from its source, plus hook targets."""
    refs = []
    for path in [*ADAPTER.glob("*.py"), PLUGIN]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sglang":
                refs += [f"{node.module}:{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                refs += [a.name for a in node.names if a.name.split(".")[0] == "sglang"]
    from sglang_jetspec.adapter.registration import HOOKS

    return sorted(set(refs)) + [target for target, _, _ in HOOKS]


def test_every_sglang_symbol_the_adapter_uses_exists(jetspec_registered):
    refs = _sglang_references()
    assert len(refs) >= 12, refs  # the walk really found the adapter's imports
    missing = []
    for ref in refs:
        try:
            pkgutil.resolve_name(ref)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{ref}: {exc}")
    assert missing == []


def test_registering_twice_in_process_keeps_one_spec_and_one_hook_each(jetspec_registered):
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_jetspec.adapter.registration import HOOKS, register

    register()
    assert SpeculativeAlgorithm.from_string("jetspec") is jetspec_registered
    assert [len(HookRegistry._hooks[t]) for t, _, _ in HOOKS] == [1] * len(HOOKS)


def test_a_request_the_scheduler_aborts_outside_the_output_stream_drops_its_draft_state(jetspec_registered):
    """`retract_decode` aborts the decode batch's last request when even it no longer fits the KV pool: the
    request leaves the batch with a to_finish that never becomes a finish reason (the worker's sweep never
    sees it finish), and the scheduler reports it through `send_abort_output` alone. Its draft state leaked
    (one state left behind after an OOM abort in the radix-cache test under load); the hook drops it."""
    from types import SimpleNamespace

    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_jetspec.adapter.worker import JetSpecWorker

    HookRegistry.apply_hooks()
    worker = JetSpecWorker.__new__(JetSpecWorker)  # only its release is called
    released, sent = [], []
    worker.release_request = released.append
    tokenizer = SimpleNamespace(send_output=lambda output, req: sent.append(output))
    scheduler = SimpleNamespace(
        rust_server=None, draft_worker=worker, ipc_channels=SimpleNamespace(send_to_tokenizer=tokenizer)
    )
    Scheduler.send_abort_output(scheduler, "abort-output", SimpleNamespace(rid="r1"))
    assert sent == ["abort-output"]  # SGLang's own report still goes out
    assert released == ["r1"]
    scheduler.draft_worker = None  # another algorithm's scheduler: nothing to release
    Scheduler.send_abort_output(scheduler, "abort-output", SimpleNamespace(rid="r2"))
    assert released == ["r1"] and len(sent) == 2


@pytest.mark.parametrize(
    "arch, expected",
    [
        ("DFlashDraftModel", "JetSpecDraftModel"),
        ("DFlash2DraftModel", "JetSpecDFlash2DraftModel"),
        ("JetSpecDraftModel", "JetSpecDraftModel"),
    ],
)
def test_published_head_architectures_map_to_registered_jetspec_classes(jetspec_registered, arch, expected):
    from sglang.srt.models.registry import ModelRegistry

    from sglang_jetspec.adapter.draft_model import jetspec_architecture, register_draft_models

    register_draft_models()
    register_draft_models()
    cls, name = ModelRegistry.resolve_model_cls([jetspec_architecture(arch)])
    assert name == expected and cls.__name__ == expected
    # SGLang's own DFlash classes stay in place for DFLASH servers
    assert ModelRegistry.models["DFlashDraftModel"].__module__ == "sglang.srt.models.dflash"


def test_unknown_head_architecture_is_refused_with_the_expected_names():
    pytest.importorskip("sglang")
    from sglang_jetspec.adapter.draft_model import jetspec_architecture

    with pytest.raises(ValueError, match="LlamaForCausalLM.*DFlashDraftModel"):
        jetspec_architecture("LlamaForCausalLM")


def test_causal_head_becomes_sglang_is_causal(head_dir):
    pytest.importorskip("sglang")
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.models.dflash import _get_dflash_attention_type
    from transformers import AutoConfig

    from sglang_jetspec.adapter.draft_model import apply_causal_head

    config = AutoConfig.from_pretrained(head_dir)
    assert _get_dflash_attention_type(config, default=AttentionType.ENCODER_ONLY) == AttentionType.ENCODER_ONLY
    apply_causal_head(config)  # the shipped head is causal: its block attends causally
    assert _get_dflash_attention_type(config, default=AttentionType.ENCODER_ONLY) == AttentionType.DECODER
    config.dflash_config = {**config.dflash_config, "causal_head": False}
    config.is_causal = None
    apply_causal_head(config)
    assert _get_dflash_attention_type(config, default=AttentionType.ENCODER_ONLY) == AttentionType.ENCODER_ONLY


def test_warm_up_forwards_get_a_jetspec_dummy_verify_input(jetspec_registered):
    """SGLang's create_dummy_verify_input returns None for plugin algorithms, and FlashInfer's autotune
    warm-up then asserts at start-up; the hooked function gives JETSPEC's verify input instead."""
    import torch
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.speculative import spec_info
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_jetspec.adapter.spec_inputs import JetSpecVerifyInput

    HookRegistry.apply_hooks()
    mask = torch.ones(64, dtype=torch.bool)
    with pytest.MonkeyPatch.context() as mp:  # the real function reads the published spec config first
        mp.setattr(spec_info, "get_spec_config", lambda: None)
        dummy = spec_info.create_dummy_verify_input(jetspec_registered, mask, 8, False)
        assert isinstance(dummy, JetSpecVerifyInput)
        assert dummy.draft_token_num == 8 and dummy.custom_mask is mask
        assert dummy.capture_hidden_mode == CaptureHiddenMode.FULL
        assert spec_info.create_dummy_verify_input(jetspec_registered, mask, 8, True) is None  # no draft runner
        assert spec_info.create_dummy_verify_input(SpeculativeAlgorithm.NONE, mask, 8, False) is None
