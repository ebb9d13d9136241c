"""Register JETSPEC with SGLang: the algorithm (spec class + argument checks + worker factory) and
the policy hooks on the internal-state controller. Idempotent; imports no model code and touches no
device, because SGLang runs it in every one of its processes."""

from __future__ import annotations

from sglang_jetspec.adapter import (
    attention_backends,
    context_pool_memory,
    dummy_verify,
    internal_state,
    kv_reserve,
    push_types,
    scheduler_hooks,
    verify_graphs,
)

# (dotted target, hook, HookType member name): every SGLang function the plugin patches.
HOOKS = (
    (internal_state.SET_TARGET, internal_state.around_set_internal_state, "AROUND"),
    (internal_state.GET_TARGET, internal_state.after_get_internal_state, "AFTER"),
    (scheduler_hooks.ADMISSION_TARGET, scheduler_hooks.before_process_req_with_grammar, "BEFORE"),
    (scheduler_hooks.ABORT_RELEASE_TARGET, scheduler_hooks.after_release_aborted_request, "AFTER"),
    (scheduler_hooks.ABORT_OUTPUT_TARGET, scheduler_hooks.after_send_abort_output, "AFTER"),
    (scheduler_hooks.PREFILL_RESULT_TARGET, scheduler_hooks.after_process_batch_result_prefill, "AFTER"),
    (scheduler_hooks.IDLE_TARGET, scheduler_hooks.after_on_idle, "AFTER"),
    (dummy_verify.TARGET, dummy_verify.after_create_dummy_verify_input, "AFTER"),
    (kv_reserve.TARGET, kv_reserve.after_req_to_token_extra_context_len, "AFTER"),
    (context_pool_memory.CELL_SIZE_TARGET, context_pool_memory.after_dflash_draft_cell_size, "AFTER"),
    (attention_backends.AMX_METADATA_TARGET, attention_backends.after_intel_amx_init_forward_metadata, "AFTER"),
    (push_types.TARGET, push_types.before_setup_and_run_http_server, "BEFORE"),
    (verify_graphs.SPEC_INFO_TARGET, verify_graphs.after_get_spec_info, "AFTER"),
    (verify_graphs.CAN_RUN_TARGET, verify_graphs.around_can_run_graph, "AROUND"),
)


def _worker_class(server_args):
    from sglang_jetspec.adapter.worker import JetSpecWorker

    return JetSpecWorker


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from sglang_jetspec.adapter.server_args import validate_server_args
    from sglang_jetspec.adapter.spec_algo import NAME, JetSpecAlgo

    if get_spec(NAME) is None:
        SpeculativeAlgorithm.register(
            NAME,
            supports_overlap=False,
            validate_server_args=validate_server_args,
            spec_class=JetSpecAlgo,
        )(_worker_class)
    for target, hook, kind in HOOKS:
        if not any(registered is hook for _, registered, _ in HookRegistry._hooks.get(target, ())):
            HookRegistry.register(target, hook, HookType[kind])
