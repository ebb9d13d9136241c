"""The SpecInput objects JETSPEC puts on SGLang's ScheduleBatch.

- JetSpecVerifyInput: the TARGET_VERIFY input. It is SGLang's NgramVerifyInput (NGRAM verifies
  arbitrary trees with a FULL custom mask, and FlashInfer / Triton plan such a verify through its
  `generate_attn_arg_prefill`) plus FULL hidden-state capture, so the verify pass also returns the
  tap layers' rows the head needs for the accepted nodes.
- JetSpecDraftState: what a request carries between rounds (`GenerationBatchResult.next_draft_input`,
  then `batch.spec_info`). The worker keeps its real state by request id, so this only has to
  survive ScheduleBatch.filter_batch / merge_batch; it carries the last committed tokens and the new
  sequence lengths, plus the empty fields SGLang's relay code reads by name. It reuses the
  NGRAM_VERIFY type, the type SGLang's own NGRAM worker gives its between-round input.
- bind_verify_batch: puts a step's verify tensors on the batch.
- bind_decode_batch: the same batch as one ordinary decode forward of each request's root, for a step
  whose trees are all root-only (speculation gated off, adaptive sizing keeping no node, no
  request drafting): SGLang's decode path is cheaper than a one-node TARGET_VERIFY, and the root's KV lands in
  the same slot either way.
"""

from __future__ import annotations

from typing import Optional

import torch
from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.speculative.ngram_info import NgramVerifyInput
from sglang.srt.speculative.spec_info import SpecInput, SpecInputType


class JetSpecVerifyInput(NgramVerifyInput):
    # ForwardBatch.init_new takes max(request mode, spec_info.capture_hidden_mode): FULL makes the
    # logits processor return the packed tap rows of every verify token.
    capture_hidden_mode = CaptureHiddenMode.FULL


def bind_verify_batch(
    batch, tensors, seq_lens: list[int], num_nodes: int, mask_layout, device, capture_taps: bool = True
) -> None:
    """Rebind the batch for a TARGET_VERIFY pass over `num_nodes` tree nodes per request, as
    NGRAMWorker._prepare_for_speculative_decoding does; the scheduler's _forward_isolation restores
    every field afterwards. `tensors`: verify_inputs.build_verify_tensors of the step's trees."""
    draft_token = tensors.draft_token.to(device, non_blocking=True)
    batch.forward_mode = ForwardMode.TARGET_VERIFY
    batch.input_ids = draft_token
    batch.out_cache_loc = assign_extend_cache_locs_func(
        req_pool_indices=batch.req_pool_indices,
        req_to_token=batch.req_to_token_pool.req_to_token,
        start_offset=batch.seq_lens,
        end_offset=batch.seq_lens + num_nodes,
        batch_size=len(seq_lens),
        draft_token_num=num_nodes,
        device=device,
    )
    batch.spec_info = JetSpecVerifyInput(
        draft_token=draft_token,
        custom_mask=tensors.custom_mask(mask_layout, seq_lens, device),
        positions=tensors.positions.to(device, non_blocking=True),
        retrieve_index=tensors.retrieve_index.to(device, non_blocking=True),
        retrieve_next_token=tensors.retrieve_next_token.to(device, non_blocking=True),
        retrieve_next_sibling=tensors.retrieve_next_sibling.to(device, non_blocking=True),
        draft_token_num=num_nodes,
    )
    batch.seq_lens_sum = None  # ForwardBatch.init_new recomputes it from the host mirror (the commit does not)
    if not capture_taps:  # nothing will read the tap rows (no rank-0 lane drafts): skip gathering them
        batch.spec_info.capture_hidden_mode = CaptureHiddenMode.NULL


def bind_decode_batch(batch, root_tokens: torch.Tensor, device) -> None:
    """Rebind the batch for a DECODE forward of each request's root token (the last committed token,
    not in KV yet), as ScheduleBatch.prepare_for_decode lays out a plain decode: seq_lens count the
    root, whose position is the committed length and whose KV slot is the first one reserved past
    it. The scheduler's _forward_isolation restores every field afterwards."""
    seq_lens = batch.seq_lens
    batch.forward_mode = ForwardMode.DECODE
    batch.input_ids = root_tokens.to(device, non_blocking=True)
    batch.out_cache_loc = assign_extend_cache_locs_func(
        req_pool_indices=batch.req_pool_indices,
        req_to_token=batch.req_to_token_pool.req_to_token,
        start_offset=seq_lens,
        end_offset=seq_lens + 1,
        batch_size=len(root_tokens),
        draft_token_num=1,
        device=device,
    )
    batch.seq_lens = seq_lens + 1
    if batch.seq_lens_cpu is not None:
        batch.seq_lens_cpu = batch.seq_lens_cpu + 1
    batch.seq_lens_sum = None  # ForwardBatch.init_new recomputes it
    batch.spec_info = None  # no tree: nothing for the attention backend to mask


class JetSpecDraftState(SpecInput):
    # Read with getattr by SGLang's relay (RelayPayload.from_draft_input); JETSPEC relays nothing.
    topk_p = None
    topk_index = None
    hidden_states = None
    draft_probs = None

    def __init__(
        self, bonus_tokens: torch.Tensor, new_seq_lens: torch.Tensor, future_indices: Optional[torch.Tensor] = None
    ) -> None:
        super().__init__(SpecInputType.NGRAM_VERIFY)
        self.bonus_tokens = bonus_tokens  # [bs] the last committed token of each request
        self.new_seq_lens = new_seq_lens
        self.future_indices = future_indices

    def filter_batch(self, new_indices: torch.Tensor, new_indices_cpu=None) -> None:
        if self.future_indices is not None:
            self.future_indices = self.future_indices[new_indices]
            return
        self.bonus_tokens = self.bonus_tokens[new_indices]
        self.new_seq_lens = self.new_seq_lens[new_indices]

    def merge_batch(self, other: "JetSpecDraftState") -> None:
        if self.future_indices is not None:
            self.future_indices = torch.cat([self.future_indices, other.future_indices])
            return
        self.bonus_tokens = torch.cat([self.bonus_tokens, other.bonus_tokens])
        self.new_seq_lens = torch.cat([self.new_seq_lens, other.new_seq_lens])
