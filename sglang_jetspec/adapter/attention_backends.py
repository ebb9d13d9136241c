"""Which SGLang attention backend runs TARGET_VERIFY, whether it can verify a tree, and the layout of
the tree mask it reads: chosen here, in one place, from the resolved server arguments.

- FULL (FlashInfer, Triton on GPU): per request, N rows of width prefix + N; the prefix columns are
  all True (`generate_attn_arg_prefill` reads it this way).
- QLEN_ONLY (SGLang's CPU backend `intel_amx`): per request only the N x N node-to-node part, the
  prefix implicitly visible (as `eagle_utils.default_tree_mask_mode` sends it on CPU).
Every other backend ignores `spec_info.custom_mask` in target verification (fa3, the Hopper default,
and trtllm_mha take the causal path; torch_native has no verify path at all).
"""

from __future__ import annotations

from enum import Enum


class MaskLayout(str, Enum):
    FULL = "full"
    QLEN_ONLY = "qlen_only"


TREE_MASK_LAYOUTS = {"flashinfer": MaskLayout.FULL, "triton": MaskLayout.FULL, "intel_amx": MaskLayout.QLEN_ONLY}
CPU_BACKENDS = ("intel_amx",)


def verify_attention_backend(cfg) -> tuple[str, str | None]:
    """(flag, backend) that runs TARGET_VERIFY: the prefill or decode backend per
    --speculative-attention-mode, falling back to --attention-backend."""
    if cfg.speculative_attention_mode == "decode":
        return (
            ("--decode-attention-backend", cfg.decode_attention_backend)
            if cfg.decode_attention_backend
            else ("--attention-backend", cfg.attention_backend)
        )
    return (
        ("--prefill-attention-backend", cfg.prefill_attention_backend)
        if cfg.prefill_attention_backend
        else ("--attention-backend", cfg.attention_backend)
    )


def tree_mask_layout(backend: str | None) -> MaskLayout:
    try:
        return TREE_MASK_LAYOUTS[backend]
    except KeyError:
        raise ValueError(
            f"attention backend {backend!r} cannot verify a token tree; use one of {', '.join(TREE_MASK_LAYOUTS)}"
        ) from None


def backend_problems(cfg) -> list[str]:
    """What is wrong with the verify backend for this device, each problem naming the flag and the fix."""
    flag, backend = verify_attention_backend(cfg)
    on_cpu = cfg.device == "cpu"
    fix = (
        "pass --attention-backend intel_amx (SGLang's CPU backend)"
        if on_cpu
        else "pass --attention-backend flashinfer (or triton)"
    )
    if backend not in TREE_MASK_LAYOUTS:
        why = (
            "this attention backend ignores the tree mask in target verification (fa3, the Hopper default, and "
            "trtllm_mha take the causal path; torch_native has no verify path)"
        )
        if backend == "torch_native" and on_cpu:
            why += (
                "; SGLang falls back from intel_amx to torch_native when the platform reports no AMX, so run with "
                "SGLANG_USE_CPU_ENGINE=1 on a CPU with AMX and sgl-kernel's CPU build"
            )
        return [f"{flag} {backend}: {why}; {fix}"]
    if (backend in CPU_BACKENDS) != on_cpu:
        where = "a CPU-only backend" if backend in CPU_BACKENDS else "a GPU backend"
        return [f"{flag} {backend}: {where}, but --device is {cfg.device}; {fix}"]
    return []


# SGLang's CPU backend sizes a verify pass by --speculative-num-draft-tokens, a server constant: the
# extend length it hands the kernel, and with it the tree-mask shape the kernel checks (num_seqs x L x
# L). JETSPEC verifies as many nodes as this step's budget, fewer whenever the policy runs a budget
# below its largest (a pushed table, a probe, speculation off): the AFTER hook below gives the backend
# this step's node count. (FlashInfer and Triton read the count from spec_info themselves.)
AMX_METADATA_TARGET = "sglang.srt.layers.attention.intel_amx_backend.IntelAMXAttnBackend.init_forward_metadata"


def after_intel_amx_init_forward_metadata(result, backend, forward_batch, *args, **kwargs):
    from sglang_jetspec.adapter.spec_inputs import JetSpecVerifyInput

    if forward_batch.forward_mode.is_target_verify() and isinstance(forward_batch.spec_info, JetSpecVerifyInput):
        attn_logits, _ = backend.forward_metadata
        backend.forward_metadata = (attn_logits, forward_batch.spec_info.draft_token_num)
    return result
