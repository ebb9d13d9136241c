"""The commit phase of a decode step: what SGLang and the head keep of the accepted nodes.

Every tensor-parallel rank first checks that all accepted the same tokens. Then the target KV of each
request's kept nodes moves to the front of its verify window (one batched mover call; a root-only step
has nothing to move: the root's KV is already in place), the logprobs of requests that asked for them
are computed from the verify rows, the batch's sequence lengths advance in place (so the scheduler reads
none back) and the scheduler is told them (`on_publish`, once per forward, right after acceptance:
overlap_utils' contract), the head keeps the context of the
committed tokens, and each request notes its budget and accept length (for the shadow record). The
phase returns the GenerationBatchResult the scheduler reads.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.spec_utils import move_accept_tokens_to_target_kvcache

from sglang_jetspec.adapter.head_context import HeadContext
from sglang_jetspec.adapter.request_state import RequestDraftState
from sglang_jetspec.adapter.spec_inputs import JetSpecDraftState
from sglang_jetspec.adapter.step_outputs import StepOutputs
from sglang_jetspec.adapter.tree_verify import Verified, VerifyInputs
from sglang_jetspec.core.step_clock import Drafted


class StepCommit:
    """`reserved`: the verify width per request SGLang reserved (reported back with every result)."""

    def __init__(self, allocator, head_context: HeadContext | None, ranks, reserved: int, device: torch.device) -> None:
        self.allocator, self.head_context, self.ranks = allocator, head_context, ranks
        self.reserved, self.device = reserved, device

    def commit(
        self,
        batch,
        lanes: list[RequestDraftState],
        drafted: Drafted,
        inputs: VerifyInputs,
        verified: Verified,
        out: StepOutputs,
        budget: int,
        on_publish,
    ) -> GenerationBatchResult:
        """Keep what `out` accepted, once every rank agrees on it; `budget`: the plan's, noted per request.
        Returns the result the scheduler reads: committed tokens (request b's at b*stride, accept_lens[b]
        of them), the new sequence lengths and the next step's roots."""
        self.ranks.agree("accepted tokens", [out.accept_lens, out.next_token_ids])
        accept_lens = out.accept_lens.to(self.device)
        accept_index = out.accept_index.to(self.device)
        if drafted.num_nodes > 1:
            move_accept_tokens_to_target_kvcache(batch, accept_index, accept_lens - 1, self.allocator)
        logits_output = verified.logits_output
        if batch.return_logprob:
            compute_spec_logprobs(batch, logits_output, out.predict.to(self.device), accept_index=accept_index)
        new_seq_lens = advance_committed_lens(inputs, accept_lens, out.row_counts)
        if on_publish is not None:
            on_publish(new_seq_lens)
        taps = logits_output.hidden_states  # [bs*N, taps*H]: every node's tap rows (none when not captured)
        if taps is not None and self.head_context is not None:
            rows = (out.row_index, out.row_counts)
            # a native step (budget 0) keeps the context for speculation to resume: written with later ones
            native = budget == 0
            self.head_context.keep_committed(lanes, taps, *rows, batch.out_cache_loc, drafted.num_nodes, native)
        for lane, length in zip(lanes, out.row_counts):
            lane.budgets.append(budget)
            lane.accept_lengths.append(length)
        logits_output.hidden_states = None  # tap rows stay on the device; nothing for the host to copy
        batch.forward_mode = ForwardMode.DECODE
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=out.next_token_ids.to(self.device),
            can_run_cuda_graph=verified.can_run_cuda_graph,
            accept_lens=accept_lens,
            new_seq_lens=new_seq_lens,
            next_draft_input=JetSpecDraftState(out.bonus_tokens.to(self.device), new_seq_lens),
            speculative_num_draft_tokens=self.reserved,
            speculative_output_stride=out.stride,
        )


def advance_committed_lens(inputs: VerifyInputs, accept_lens: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Advance the batch's own sequence-length tensors in place by each request's committed tokens (`counts`
    on the host, `accept_lens` on the device) and return the device one. The scheduler copies a returned
    tensor other than `batch.seq_lens` to the host (a sync per step on a GPU); this one it keeps as it is,
    and its host mirror is already right, from the lengths the acceptance read."""
    lens, mirror = inputs.committed_lens, inputs.committed_lens_cpu
    lens.add_(accept_lens)
    if mirror is not None and mirror.untyped_storage().data_ptr() != lens.untyped_storage().data_ptr():
        mirror.add_(torch.tensor(counts, dtype=mirror.dtype))  # on a CPU device the two can be one tensor
    return lens
