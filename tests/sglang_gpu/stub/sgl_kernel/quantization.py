"""GGUF kernels sglang/srt/layers/quantization imports on CUDA; unused for an unquantised target."""

from sgl_kernel._missing import missing

_NAMES = ["ggml_dequantize", "ggml_moe_a8", "ggml_mul_mat_a8", "ggml_mul_mat_vec_a8"]
globals().update({name: missing(f"sgl_kernel.quantization.{name}") for name in _NAMES})
__all__ = list(_NAMES)
