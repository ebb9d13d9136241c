"""The verify phase of a decode step: the target's forward over every request's tree, then each node's
logits processed as SGLang's sampler would process a plain decode's.

Two calls with explicit inputs: `bind` lays the step's trees on SGLang's batch (a TARGET_VERIFY pass
with its tree mask, or, for trees that are roots alone, an ordinary DECODE forward: cheaper than a
one-node verify); `forward` runs the target and returns the processed
logits (`Verified`). Logprob requests keep the verify layout, whose rows compute_spec_logprobs reads.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

from sglang_jetspec.adapter.attention_backends import MaskLayout
from sglang_jetspec.adapter.request_state import RequestDraftState
from sglang_jetspec.adapter.spec_inputs import bind_decode_batch, bind_verify_batch
from sglang_jetspec.adapter.tap_capture import taps_uncaptured
from sglang_jetspec.adapter.tree_penalties import apply_logit_bias, apply_tree_penalties
from sglang_jetspec.adapter.verify_inputs import build_verify_tensors
from sglang_jetspec.core.step_clock import Drafted


@dataclass(frozen=True)
class VerifyInputs:
    """What `bind` laid on the batch: a DECODE forward of the roots (`decode`) or a tree verify, whether
    the forward captures tap rows for the head's context, and the batch's own sequence-length tensors of
    the committed tokens as it held them before (device, and the host mirror or None; a decode forward
    rebinds them to count the root). The commit advances these very tensors."""

    decode: bool
    capture_taps: bool
    committed_lens: torch.Tensor
    committed_lens_cpu: torch.Tensor | None


@dataclass(frozen=True)
class Verified:
    """The forward's logits output (processed next_token_logits [bs*N, V]; hidden_states the tap rows, or
    None) and whether SGLang ran it as a CUDA graph."""

    logits_output: object
    can_run_cuda_graph: bool


class TreeVerifier:
    def __init__(self, target_worker, model, mask_layout: MaskLayout, device: torch.device, drafts: bool) -> None:
        self.target_worker, self.model, self.mask_layout, self.device = target_worker, model, mask_layout, device
        self.drafts = drafts  # this rank keeps the head's context, so it reads the tap rows
        self.graphs = None  # adapter.verify_graphs.VerifyGraphs once captured (CUDA, a width ladder)

    def bind(
        self,
        batch,
        lanes: list[RequestDraftState],
        drafted: Drafted,
    ) -> VerifyInputs:
        """Lay the trees on `batch` (the scheduler's _forward_isolation restores it after the step)."""
        committed_lens, committed_lens_cpu = batch.seq_lens, batch.seq_lens_cpu
        seq_lens = [lane.kv_len for lane in lanes]
        decode = drafted.num_nodes == 1 and not batch.return_logprob
        capture_taps = self.drafts and any(lane.drafts for lane in lanes)
        if not decode:
            tensors = build_verify_tensors(drafted.trees, seq_lens, drafted.num_nodes)
            bind_verify_batch(
                batch,
                tensors,
                seq_lens,
                drafted.num_nodes,
                self.mask_layout,
                self.device,
                capture_taps=capture_taps,
            )
        else:
            bind_decode_batch(batch, torch.tensor([lane.root_token for lane in lanes]), self.device)
        return VerifyInputs(decode, capture_taps, committed_lens, committed_lens_cpu)

    def forward(
        self, batch, lanes: list[RequestDraftState], drafted: Drafted, inputs: VerifyInputs, reads_taps: bool
    ) -> Verified:
        """The target's forward (without tap capture when the plan keeps no draft context: `reads_taps`),
        each node's row penalised as a plain decode at its output position (not SGLang's relaxed per-step
        penalties), masked to what the request's grammar allows after the node's path, then the request's
        logit bias: the order of SGLang's own sampler."""
        capture = CaptureHiddenMode.FULL if inputs.capture_taps else CaptureHiddenMode.NULL
        if self.graphs is not None:  # the width's verify graph, or SGLang's eager path for roots alone
            self.graphs.select(1 if inputs.decode else drafted.num_nodes)
        with nullcontext() if reads_taps else taps_uncaptured(self.model):
            result = self.target_worker.forward_batch_generation(
                batch, is_verify=True, capture_hidden_mode=capture if inputs.decode else None
            )
        logits = result.logits_output.next_token_logits
        trees, num_nodes = drafted.trees, drafted.num_nodes
        outputs = [lane.req.output_ids for lane in lanes]
        apply_tree_penalties(logits, [lane.penalties for lane in lanes], outputs, trees, num_nodes)
        if drafted.verify_mask is not None:
            drafted.verify_mask.apply(logits)
        apply_logit_bias(logits, batch.sampling_info.logit_bias, num_nodes)
        return Verified(result.logits_output, result.can_run_cuda_graph)
