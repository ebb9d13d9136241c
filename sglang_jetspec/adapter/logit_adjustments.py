"""SGLang's per-request penalties and logit bias, applied to tree-verify logits as SGLang's EAGLE does."""

from __future__ import annotations

import torch
from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties


def apply_sglang_logit_adjustments(logits: torch.Tensor, sampling_info, num_nodes: int) -> None:
    """Penalties and logit bias on the verify logits, in place, exactly as SGLang's eagle_sample
    (speculative/eagle_utils.py) applies them to tree verification: each request's accumulated
    penalties and bias repeated over its num_nodes rows. SGLang calls this "a relaxed version of
    penalties for speculative decoding"; JETSPEC matches what SGLang's EAGLE/NGRAM do."""
    if sampling_info.acc_additive_penalties is not None:
        logits.add_(torch.repeat_interleave(sampling_info.acc_additive_penalties, num_nodes, dim=0))
    if sampling_info.acc_scaling_penalties is not None:
        apply_scaling_penalties(logits, torch.repeat_interleave(sampling_info.acc_scaling_penalties, num_nodes, dim=0))
    if sampling_info.logit_bias is not None:
        logits.add_(torch.repeat_interleave(sampling_info.logit_bias, num_nodes, dim=0))
