"""Room in each request's `req_to_token` row for the KV SGLang reserves ahead of a JETSPEC step.

Before every decode step SGLang tops each request's KV up to committed + 2 x the largest draft-token
count (`get_alloc_reserve_per_decode`: a double buffer for overlap scheduling), with that count the
policy's largest candidate budget. The row of `req_to_token` that records those slots is only
context_len + 4 + that count wide (`get_req_to_token_extra_context_len`; SGLang widens it to the
full reserve only for paged top-k trees), so a request within `count - 4` tokens of the context limit
would have its reservation written past the end of its row: another request's row on a GPU, a
scheduler crash on CPU. The AFTER hook below widens JETSPEC's rows to hold the whole reserve (plus a
page's rounding), once, when the pool is built.
"""

from __future__ import annotations

TARGET = "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len"


def after_req_to_token_extra_context_len(result, *args, **kwargs):
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_page_size, get_alloc_reserve_per_decode
    from sglang.srt.runtime_context import get_spec

    if get_spec().speculative_algorithm != "JETSPEC":
        return result
    return max(result, get_alloc_reserve_per_decode() + get_alloc_page_size() - 1)
