"""Test-only stand-in for sgl-kernel on a GPU, for the device machine that cannot carry the real one.

The device image has torch 2.11 and no SGLang; sgl-kernel's wheel (1.2 GB installed, built against
torch 2.14) cannot travel in 64 MiB calls. SGLang 0.5.23's CUDA path imports a fixed set of names
from ``sgl_kernel`` at import time (layernorm, activation, sampler, kvcacheio, quantization, ...).
This package provides exactly those names (``tests/sglang_gpu/test_gpu_standin.py`` checks the set
against the installed SGLang's import sites) and the run sets ``SGLANG_FORCE_FUSED_OP_BACKEND=torch``,
SGLang's own switch that sends every fused op (RMSNorm, SiluAndMul, RotaryEmbedding, ...) to its
``forward_native`` PyTorch code, and ``--sampling-backend pytorch``. So no op of this package is
called on the path the GPU run takes (Llama, Triton attention, greedy and sampled decoding, tree
verify); each one raises ``NotImplementedError`` naming itself if something does call it, so a
missed path fails loudly instead of computing something else.

Two names do run: ``utils.is_arch_support_pdl`` (SGLang's Triton backend asks it at start-up; False,
no programmatic dependent launch, is always a correct answer) and ``weak_ref_tensor`` (SGLang's CUDA
graph capture keeps captured arguments through it; the stand-in returns the tensor itself, a strong
reference, so captured buffers live until the graph goes instead of until their owner frees them).

Active only when ``tests/sglang_gpu/stub`` comes first on ``PYTHONPATH`` (bench/gpu/run.sh); never
installed.
"""

from sgl_kernel._missing import missing

__version__ = "0.0.0+jetspec.gpu.standin"
STANDIN = True

# imported by sglang/srt/layers/{layernorm,activation,sampler}.py and moe/quantization helpers
_TOP_LEVEL = [
    "fused_add_rmsnorm",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "int8_scaled_mm",
    "moe_sum",
    "moe_sum_reduce",
    "rmsnorm",
    "silu_and_mul",
    "top_k_renorm_prob",
    "top_p_renorm_prob",
]
globals().update({name: missing(f"sgl_kernel.{name}") for name in _TOP_LEVEL})
__all__ = [*_TOP_LEVEL, "weak_ref_tensor"]


def weak_ref_tensor(tensor):
    """sglang/srt/model_executor/runner_backend_utils/weak_ref_tensor.py: see the module docstring."""
    return tensor
