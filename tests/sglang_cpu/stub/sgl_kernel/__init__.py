"""Test-only stand-in for sgl-kernel's CPU ops, in plain PyTorch.

SGLang 0.5.23's CPU engine (``SGLANG_USE_CPU_ENGINE=1``, ``--attention-backend intel_amx``) calls a
handful of sgl-kernel CPU ops. The PyPI sgl-kernel is a CUDA build that cannot load on a machine
without ``libcuda``, and the CPU build needs sgl-kernel's sources. This package stands in for it when
its parent directory (``tests/sglang_cpu/stub``) comes first on ``PYTHONPATH``; it lives under tests/
and is never installed.

It defines only what SGLang's CPU path calls for a Llama target with plain decoding, NGRAM and a
plugin speculative worker verifying trees in TARGET_VERIFY:

* ``torch.ops.sgl_kernel.extend_attention_cpu`` / ``decode_attention_cpu`` (registered with
  ``torch.library``; see ``_attention.py``),
* the cache-location, accept and tree ops in ``speculative.py``,
* ``copy_all_layer_kv_cache_cpu`` (``_kvcache.py``),
* names EAGLE-only modules import at import time, which raise ``NotImplementedError`` if called.

Every other name is absent on purpose: ``from sgl_kernel import X`` raises ImportError and
``getattr(sgl_kernel, X)`` / ``torch.ops.sgl_kernel.X`` raise AttributeError, so SGLang's own
fallbacks apply. In particular ``convert_weight_packed`` is not defined, so SGLang's
``cpu_has_amx_support()`` is False and norms, activations, rotary embeddings and linear layers take
their ``forward_native`` PyTorch code.
"""

from sgl_kernel._attention import LIBRARY as _LIBRARY
from sgl_kernel._kvcache import copy_all_layer_kv_cache_cpu
from sgl_kernel.speculative import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

# Read by nothing on SGLang's CPU path (its sgl-kernel version check runs on CUDA only, through the
# `sglang-kernel` distribution's metadata); here so a reader of `sgl_kernel.__version__` sees a stand-in.
__version__ = "0.0.0+jetspec.cpu.standin"

STANDIN = True

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]


def _unregister() -> None:
    """Remove the torch.ops.sgl_kernel registrations made at import (for tests that import this
    package in a process that goes on running other tests)."""
    _LIBRARY._destroy()
