"""Names sglang/srt/mem_cache (host KV offload, disaggregation) imports on CUDA; unused without
hierarchical caching (see the package docstring)."""

from sgl_kernel._missing import missing

_NAMES = [
    "transfer_kv_all_layer",
    "transfer_kv_all_layer_direct_lf_pf",
    "transfer_kv_all_layer_lf_pf",
    "transfer_kv_all_layer_lf_ph",
    "transfer_kv_all_layer_mla",
    "transfer_kv_all_layer_mla_lf_pf",
    "transfer_kv_direct",
    "transfer_kv_per_layer",
    "transfer_kv_per_layer_direct_pf_lf",
    "transfer_kv_per_layer_mla",
    "transfer_kv_per_layer_mla_pf_lf",
    "transfer_kv_per_layer_pf_lf",
    "transfer_kv_per_layer_ph_lf",
]
globals().update({name: missing(f"sgl_kernel.kvcacheio.{name}") for name in _NAMES})
__all__ = list(_NAMES)
