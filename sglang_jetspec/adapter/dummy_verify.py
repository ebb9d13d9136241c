"""JETSPEC's dummy TARGET_VERIFY input for SGLang's warm-up forwards.

SGLang builds the `spec_info` of its dummy forwards (FlashInfer autotune for MoE runner backends and
modelopt FP8/FP4 on sm90+, CUDA-graph capture) with `spec_info.create_dummy_verify_input`, a chain of
per-algorithm branches that returns None for a plugin algorithm; FlashInfer then fails at start-up on
`assert prefix_lens is not None`. The AFTER hook below supplies what the JETSPEC worker itself sends: a
verify input of `num_tokens_per_req` nodes over the warm-up's custom-mask buffer, FULL hidden capture
(the worker's verify always captures the tap rows).
"""

from __future__ import annotations

TARGET = "sglang.srt.speculative.spec_info.create_dummy_verify_input"


def after_create_dummy_verify_input(
    result, spec_algorithm, custom_mask, num_tokens_per_req, is_draft_worker, *args, **kwargs
):
    from sglang_jetspec.adapter.spec_algo import JetSpecAlgo

    if result is not None or is_draft_worker or not isinstance(spec_algorithm, JetSpecAlgo):
        return result
    from sglang_jetspec.adapter.spec_inputs import JetSpecVerifyInput

    return JetSpecVerifyInput(
        draft_token=None,
        custom_mask=custom_mask,
        positions=None,
        retrieve_index=None,
        retrieve_next_token=None,
        retrieve_next_sibling=None,
        draft_token_num=num_tokens_per_req,
    )
