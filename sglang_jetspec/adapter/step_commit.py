"""The commit phase of a decode step: what SGLang and the head keep of the accepted nodes.

The target KV of each request's kept nodes moves to the front of its verify window (one batched
mover call; a root-only step has nothing to move: the root's KV is already in place), the logprobs of
requests that asked for them are computed from the verify rows, the scheduler is told the new
sequence lengths (`on_publish`, once per forward, right after acceptance: overlap_utils' contract),
the head keeps the context of the committed tokens, and each request notes its budget and accept
length (for the shadow record).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.spec_utils import move_accept_tokens_to_target_kvcache

from sglang_jetspec.adapter.head_context import HeadContext
from sglang_jetspec.adapter.request_state import RequestDraftState
from sglang_jetspec.adapter.step_outputs import StepOutputs
from sglang_jetspec.adapter.tree_verify import Verified
from sglang_jetspec.core.step_clock import Drafted


@dataclass(frozen=True)
class Committed:
    """What the scheduler reads back: committed tokens per request (bonus included) and the new
    sequence lengths, both on the device."""

    accept_lens: torch.Tensor
    new_seq_lens: torch.Tensor


class StepCommit:
    def __init__(self, allocator, head_context: HeadContext | None, device: torch.device) -> None:
        self.allocator, self.head_context, self.device = allocator, head_context, device

    def commit(
        self,
        batch,
        lanes: list[RequestDraftState],
        seq_lens: list[int],
        committed_lens: torch.Tensor,
        drafted: Drafted,
        verified: Verified,
        out: StepOutputs,
        budget: int,
        on_publish,
    ) -> Committed:
        """`committed_lens`: the batch's sequence lengths before the verify bound it (device);
        `seq_lens` the same on the host; `budget`: the plan's, noted per request."""
        accept_lens = out.accept_lens.to(self.device)
        accept_index = out.accept_index.to(self.device)
        new_seq_lens = committed_lens + accept_lens
        if drafted.num_nodes > 1:
            move_accept_tokens_to_target_kvcache(batch, accept_index, accept_lens - 1, self.allocator)
        logits_output = verified.logits_output
        if batch.return_logprob:
            compute_spec_logprobs(batch, logits_output, out.predict.to(self.device), accept_index=accept_index)
        if on_publish is not None:
            on_publish(new_seq_lens)
        taps = logits_output.hidden_states  # [bs*N, taps*H]: every node's tap rows (none when not captured)
        if taps is not None and self.head_context is not None:
            self.head_context.keep_committed(
                lanes, taps, out.row_index, out.row_counts, seq_lens, batch.out_cache_loc, drafted.num_nodes
            )
        for lane, length in zip(lanes, out.row_counts):
            lane.budgets.append(budget)
            lane.accept_lengths.append(length)
        logits_output.hidden_states = None  # tap rows stay on the device; nothing for the host to copy
        batch.forward_mode = ForwardMode.DECODE
        return Committed(accept_lens, new_seq_lens)
