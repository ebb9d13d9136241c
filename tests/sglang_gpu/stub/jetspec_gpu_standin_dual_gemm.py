"""Stand-in for ``sglang.kernels.ops.gemm.cutedsl_dual_gemm`` on the device machine (test-only).

SGLang's Llama MLP imports that module when the model is built on CUDA, and it imports CUTLASS's
Python DSL (486 MB, more than the device calls can carry) at its top. Its one question there,
``can_use_dual_gemm``, is False on anything but SM100 (Blackwell): the real predicate requires
``is_sm100_supported()``. The device's H100 / H200 are SM90, so answering False is what the real
module answers there; the names it exports are the ones ``sglang/srt/layers/dual_gemm.py`` imports.
"""

from __future__ import annotations

from enum import IntEnum

MAX_DUAL_GEMM_DECODE_TOKENS = 16


class DualGemmQuantMode(IntEnum):
    STATIC_PER_TENSOR = 0
    STATIC_PER_TOKEN = 1
    DYNAMIC_PER_TENSOR = 2
    DYNAMIC_PER_TOKEN = 3
    UNQUANT = 4

    @property
    def is_quantized(self) -> bool:
        return self is not DualGemmQuantMode.UNQUANT


def can_use_dual_gemm(num_tokens: int, hidden_size: int, intermediate_size: int, quant_mode) -> bool:
    import torch

    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10:
        raise NotImplementedError("the dual GEMM stand-in answers for SM90 only; carry nvidia-cutlass-dsl for SM100")
    return False
