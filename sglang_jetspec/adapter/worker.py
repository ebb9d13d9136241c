"""JetSpecWorker: `--speculative-algorithm JETSPEC` as an SGLang 0.5.23 spec-V2 worker.

Structure follows SGLang's NGRAMWorker (speculative/ngram_worker.py), the in-tree worker that
verifies arbitrary trees: no draft TpModelWorker, the target's memory pools, a TARGET_VERIFY pass
with a FULL custom mask, `move_accept_tokens_to_target_kvcache`, the same GenerationBatchResult.
What differs:
- drafting: the core's DraftHead in plain PyTorch beside the target (core.head_drafter.HeadDrafter,
  core.tree_drafting.step_trees), fed by tap-layer rows the target captures in every forward
  (`set_dflash_layers_to_capture`, the hook SGLang's DFLASH uses), projected into the head's
  context K/V at once and kept per KV slot (core.context_pool.SlotContextPool, addressed by the
  target's own slots: a prefix the radix cache hands over brings the head's context along);
- acceptance: the core's lossless rules (adapter.step_outputs.accept_lanes) with each request's own
  sampling parameters and generator, instead of `eagle_sample`; a cohort whose policy says
  `sampled_children: drawn` draws its sampled requests' children from the head's distribution and
  accepts them against it (core.drawn_children);
- the tree budget of each step comes from the runtime policy (adapter.policy.PolicyControl) by
  the batch size's cohort; budget 0 verifies the root alone, i.e. one ordinary decoding step with
  no draft work. A cohort with adaptive tree sizing verifies only the nodes that pay for themselves
  (core.tree_sizing), against a verify cost this worker learns by timing its own verify passes
  (core.learned_verify_cost).
The scheduler runs it synchronously: the overlap scheduler is refused by adapter.server_args, so
every call sees the previous step's results in req.output_ids. On CUDA the verify runs under decode
CUDA graphs at the widths of a ladder (adapter.verify_graphs, init_cuda_graphs).

This module starts the worker and sequences a decode step; each phase lives in its own module and
returns a value the next reads: adapter.step_drafting (Drafted), adapter.tree_verify (VerifyInputs,
Verified), adapter.step_outputs (StepOutputs), adapter.step_commit (SGLang's result), with
adapter.step_reporter reading the clock and the values once the step is done.
"""

from __future__ import annotations

import logging
import time

import torch
from sglang.srt.arg_groups.overrides import resolving_view
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.runtime_context import get_device, get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.spec_utils import record_stream_for_v2_verify

from policies import read_head_capacity
from sglang_jetspec.adapter.attention_backends import tree_mask_layout, verify_attention_backend
from sglang_jetspec.adapter.context_pool_memory import allocate_context_pool
from sglang_jetspec.adapter.draft_model import register_draft_models
from sglang_jetspec.adapter.head_context import HeadContext
from sglang_jetspec.adapter.policy import PolicyControl, load_runtime_policy
from sglang_jetspec.adapter.request_state import DraftStateStore
from sglang_jetspec.adapter.server_args import (
    JetSpecArgsError,
    configured_verify_widths,
    target_info,
    verify_graphs_on,
)
from sglang_jetspec.adapter.spec_inputs import JetSpecDraftState
from sglang_jetspec.adapter.step_commit import StepCommit
from sglang_jetspec.adapter.step_drafting import StepDrafting
from sglang_jetspec.adapter.step_outputs import accept_lanes
from sglang_jetspec.adapter.step_reporter import StepReporter
from sglang_jetspec.adapter.target_views import target_tables
from sglang_jetspec.adapter.tensor_parallel import sglang_ranks
from sglang_jetspec.adapter.tree_verify import TreeVerifier
from sglang_jetspec.adapter.verify_graphs import VerifyGraphs
from sglang_jetspec.adapter.worker_observability import WorkerShadow, worker_metrics, xgrammar_options
from sglang_jetspec.core.context_pool import SlotContextPool
from sglang_jetspec.core.draft_graphs import DraftGraphs, context_buckets
from sglang_jetspec.core.draft_vocab import load_draft_vocab
from sglang_jetspec.core.head_drafter import HeadDrafter
from sglang_jetspec.core.head_io import load_head
from sglang_jetspec.core.learned_verify_cost import LearnedVerifyCost
from sglang_jetspec.core.prompt_lookup import LookupMerge
from sglang_jetspec.core.step_clock import SizingLearners
from sglang_jetspec.core.suffix_store import RECENT_OUTPUT_TOKENS, SuffixStore, load_draft_corpus
from sglang_jetspec.core.tree_sizing import TreeSizer
from sglang_jetspec.core.verify_widths import VerifyWidths

log = logging.getLogger(__name__)


class JetSpecWorker(BaseSpecWorker):
    _draft_worker = None  # no draft TpModelWorker: the head runs in PyTorch beside the target

    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker) -> None:
        """Read SGLang's resolved flags, load the head, policy and stores they name, then assemble."""
        # SGLang keeps the flags as typed and records its resolutions beside them: read resolved values.
        # validate_server_args has already refused what JETSPEC cannot run with (paged KV, ...).
        cfg = resolving_view(server_args)
        device = get_device().device
        model_runner = target_worker.model_runner
        # The JetSpec classes for published DFlash-layout heads, for any SGLang code that loads the head
        # by architecture; this process already imports model code, unlike the plugin's entry point.
        register_draft_models()
        draft_path = cfg.speculative_draft_model_path
        head = load_head(
            draft_path, target_info(cfg.model_path, cfg.trust_remote_code), dtype=model_runner.dtype, device=device
        )
        model = model_runner.model
        if not hasattr(model, "set_dflash_layers_to_capture"):
            raise JetSpecArgsError(
                [
                    f"--model-path {cfg.model_path}: SGLang's {type(model).__name__} cannot "
                    "capture the tap layers' hidden states (no set_dflash_layers_to_capture); JETSPEC "
                    "needs a target whose SGLang model class has that hook (Llama, Qwen3, Qwen3-MoE, ...; not "
                    "Qwen2 in SGLang 0.5.23)"
                ]
            )
        # The target's backends and graphs are not built yet, so every forward from now on captures.
        model.set_dflash_layers_to_capture(list(head.config.target_layer_ids))
        vocab = head.config.vocab_size
        ranks = sglang_ranks()  # under tensor parallelism rank 0 drafts and the others follow
        policy = load_runtime_policy(draft_path)
        self._assemble(
            target_worker,
            HeadDrafter(head, *target_tables(model, vocab, ranks), load_draft_vocab(draft_path, vocab)),
            policy,
            # for cohorts whose drafter is hybrid: prompt lookup, the head's draft corpus, and what this
            # worker's finished requests wrote
            LookupMerge.from_policy(
                policy.lookup,
                load_draft_corpus(draft_path, vocab) or SuffixStore(),
                SuffixStore(max_tokens=RECENT_OUTPUT_TOKENS),
            ),
            capacity=read_head_capacity(draft_path),
            ranks=ranks,
            device=device,
            mask_layout=tree_mask_layout(verify_attention_backend(cfg)[1]),  # validated: a tree-mask backend
            reserved=get_spec().speculative_num_draft_tokens,
            widths=configured_verify_widths(get_spec().speculative_num_draft_tokens, verify_graphs_on(cfg)),
            metrics=worker_metrics(cfg.enable_metrics and ranks.drafts),  # the drafting rank reports
            admin_key_configured=cfg.admin_api_key is not None,
            shadow=WorkerShadow.from_env(
                policy.shadow.sample_rate,
                model=cfg.served_model_name or cfg.model_path,
                head=str(draft_path),
                grammar=xgrammar_options(cfg),
            )
            if ranks.drafts
            else None,
        )
        self.server_args = server_args
        # Read by SGLang's metrics reporter (sglang:spec_num_steps / spec_num_draft_tokens).
        self.speculative_num_steps = get_spec().speculative_num_steps

    @classmethod
    def assembled(cls, target_worker, drafter: HeadDrafter, policy, hybrid: LookupMerge, **parts) -> JetSpecWorker:
        """A worker from explicit parts, without SGLang's runtime (tests drive it with a stand-in target)."""
        worker = cls.__new__(cls)
        worker._assemble(target_worker, drafter, policy, hybrid, **parts)
        return worker

    def _assemble(
        self,
        target_worker,
        drafter: HeadDrafter,
        policy,
        hybrid: LookupMerge,
        *,
        capacity=None,
        ranks,
        device: torch.device,
        mask_layout,
        reserved: int,
        metrics=None,
        admin_key_configured: bool = False,
        shadow: WorkerShadow | None = None,
        tree_width: int | None = None,
        widths: VerifyWidths = VerifyWidths(),
    ) -> None:
        """`reserved`: the verify width per request SGLang sized KV reservations and buffers for (the
        widest tree any policy allows, reported as the result's speculative_num_draft_tokens);
        `capacity`: the head's (bounds pushed tree widths; its tree width is the default one);
        `widths`: the verify widths each step's trees are padded to (core.verify_widths)."""
        BaseSpecWorker.__init__(self)
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner  # NGRAMWorker exposes the target's runner the same way
        # spells the text a request's grammar forces next (None under --skip-tokenizer-init: nothing forced)
        self.tokenizer = target_worker.tokenizer
        self.device, self.ranks = device, ranks
        self.vocab_size = drafter.head.config.vocab_size
        self.speculative_num_draft_tokens = reserved
        self.states = DraftStateStore()
        self.context_pool: SlotContextPool | None = None  # built with the target's pools (alloc_memory_pool)
        self.head_context: HeadContext | None = None
        self.metrics, self.shadow = metrics, shadow
        self.policy_control = PolicyControl(  # read by adapter.internal_state's /set_internal_state hooks
            policy,
            admin_key_configured=admin_key_configured,
            on_change=metrics.show_policy if metrics is not None else None,
            head=capacity,
            on_same_allocation=metrics.show_same_allocation if metrics is not None else None,
        )
        # adaptive tree sizing (cohorts whose policy asks for it): one calibration and draft gate for the
        # worker, as the reference engine keeps one per engine, and the verify cost it has timed; a
        # verify of n nodes runs at its padded width
        self.learners = SizingLearners(TreeSizer(width=widths.width_for), LearnedVerifyCost())
        width = tree_width if tree_width is not None else capacity.tree_width
        self.drafting = StepDrafting(
            drafter, hybrid, self.learners, ranks, self.tokenizer, reserved, width, device, widths
        )
        self.verifier = TreeVerifier(target_worker, self.model_runner.model, mask_layout, device, ranks.drafts)
        self.committer = StepCommit(None, None, ranks, reserved, device)  # its pools come with alloc_memory_pool
        self.reporter = StepReporter(metrics, ranks.drafts, self.learners, device)

    # ---- lifecycle (scheduler.py init_memory_pools / init_all_* / result processor) ----

    def alloc_memory_pool(self, **kwargs) -> None:
        # As NGRAMWorker: the verify writes the target's own pools. Beside them, the head's context
        # per KV slot, addressed by the same slot indices.
        self.req_to_token_pool, self.token_to_kv_pool_allocator = self._target_worker.get_memory_pool()
        pool = allocate_context_pool(
            self.drafting.drafter.head.config, self.token_to_kv_pool_allocator, self.model_runner.dtype, self.device
        )
        self.use_context_pool(pool, self.token_to_kv_pool_allocator)

    def use_context_pool(self, pool: SlotContextPool, allocator) -> None:
        """The head's context lives in `pool`, per slot of the target's KV `allocator`."""
        self.context_pool = self.drafting.drafter.context = pool
        self.head_context = HeadContext(pool, self.drafting.drafter.head, self.device)
        head_context = self.head_context if self.ranks.drafts else None
        self.committer = StepCommit(allocator, head_context, self.ranks, self.speculative_num_draft_tokens, self.device)

    def init_cuda_graphs(self) -> None:
        """After SGLang captured the target's verify graph at the widest width (scheduler
        init_all_cuda_graphs): one more per lower width of the ladder and the plain decode graph
        (adapter.verify_graphs); the head's drafting pass by batch and context bucket, captured at each
        bucket's first use (core.draft_graphs)."""
        widths = self.drafting.widths
        captured = getattr(self.model_runner, "decode_cuda_graph_captured", False)
        if not captured or not widths.pads or self.device.type != "cuda":
            return
        self.verifier.graphs = VerifyGraphs.capture(self.model_runner, widths.rungs)
        if self.ranks.drafts:
            drafter, table = self.drafting.drafter, self.req_to_token_pool.req_to_token
            batches = tuple(self.model_runner.decode_cuda_graph_runner.capture_bs)
            drafter.graphs = DraftGraphs(
                drafter, self.context_pool, batches, context_buckets(table.shape[1]), capture=True
            )

    def _draft_model_runners(self) -> tuple:
        return ()  # no SGLang draft runner: no draft KV pool for disaggregation, HiCache or resizing

    def weight_update_runners(self) -> list:
        # The head is loaded from --speculative-draft-model-path, not through SGLang's updates; the
        # target's embedding and lm_head it shares are read from the model at every step.
        return []

    def clear_cache_pool(self) -> None:
        self.states.drop_all()
        if self.context_pool is not None:  # SGLang flushed its KV pool and radix tree: every slot is free
            self.context_pool.clear()

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        # Called by the decode result processor once the request's finish state and tokens are final;
        # the per-forward sweep catches every other exit (finished at prefill, aborted while running).
        self._retire(rid)

    def release_request(self, rid: str) -> None:
        """A request left without finishing here (aborted in the waiting queue, perhaps after a
        retraction, or aborted by retraction itself when even it no longer fits the KV pool): drop its
        draft state (adapter.scheduler_hooks)."""
        self._retire(rid)

    def live_draft_states(self) -> int:
        """Requests holding draft state: 0 whenever none is running or waiting after a retraction."""
        self.retire_finished()
        return len(self.states.rids())

    def context_pool_state(self) -> dict:
        """The head's context pool: its slots, bytes, the slots holding a token's context, and the target's
        slots in use (running and cached tokens): never fewer than the valid ones, or context outlived its KV."""
        allocator = self.token_to_kv_pool_allocator
        return {**self.context_pool.describe(), "target_held_slots": allocator.size - allocator.available_size()}

    def verify_widths_state(self) -> dict:
        """The verify widths steps are padded to (none: no padding) and the steps run at each width."""
        return self.reporter.verify_widths(self.drafting.widths.rungs)

    # ---- forward ----

    def forward_batch_generation(
        self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None
    ) -> GenerationBatchResult:
        record_stream_for_v2_verify(batch, None, torch.get_device_module(self.device).current_stream())
        self.retire_finished()
        if batch.forward_mode.is_decode():
            result = self._decode_step(batch, on_publish)
        else:
            result = self._prefill(batch, on_publish, pp_proxy_tensors)
        self._show_live_states()
        return result

    def refresh_idle(self) -> None:
        """What a step would refresh, between steps (the scheduler's idle loop, adapter.scheduler_hooks):
        requests that finished leave, an expired push reverts, the last step's clock is read, and the gauges
        say so while no step runs."""
        self.retire_finished()
        self.reporter.flush()
        self.policy_control.refresh(time.time())
        self._show_live_states()

    def _show_live_states(self) -> None:
        if self.metrics is not None:
            self.metrics.live_draft_states.set(len(self.states.rids()))

    def retire_finished(self) -> None:
        """Drop the states of requests that finished since the last forward (and tee a sampled share).
        The scheduler set their finish reason while processing the previous result, so every exit
        (finished at prefill, aborted, finished mid-decode) is seen here exactly once."""
        for rid in self.states.rids():
            if self.states.get(rid).req.finished():
                self._retire(rid)

    def _retire(self, rid: str) -> None:
        """Drop a finished request's state, offering it to the shadow tee first (it samples and
        keeps only natural finishes)."""
        state = self.states.drop(rid)
        if state is not None:
            self._show_live_states()
        if state is None or state.req is None or not state.req.finished():
            return
        recent = self.drafting.hybrid.recent
        if recent is not None and self.ranks.drafts:  # only the drafting rank looks outputs up
            recent.add(list(state.req.output_ids))
        if self.shadow is not None:
            self.shadow.finished(state.req, state)

    def _prefill(self, batch, on_publish, pp_proxy_tensors) -> GenerationBatchResult:
        """Extend (or idle): the target forward samples the first token (SGLang's sampler, as in
        NGRAMWorker); FULL capture returns the tap rows of every computed position."""
        is_extend = batch.forward_mode.is_extend()
        self.policy_control.interrupted()
        result = self._target_worker.forward_batch_generation(
            batch,
            pp_proxy_tensors=pp_proxy_tensors,
            # the tap rows feed the head's context, which only the drafting rank keeps
            capture_hidden_mode=CaptureHiddenMode.FULL if is_extend and self.ranks.drafts else None,
        )
        logits_output = result.logits_output
        if is_extend:
            self._store_prefill_rows(batch, logits_output.hidden_states)
        logits_output.hidden_states = None  # tap rows stay on the device; nothing for the host to copy
        new_seq_lens = batch.seq_lens.clone()
        if on_publish is not None:
            on_publish(new_seq_lens)
        predict = result.next_token_ids
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=predict,
            can_run_cuda_graph=result.can_run_cuda_graph,
            accept_lens=torch.ones(len(batch.reqs), dtype=torch.int32, device=self.device),
            new_seq_lens=new_seq_lens,
            next_draft_input=JetSpecDraftState(predict, new_seq_lens),
            speculative_num_draft_tokens=self.speculative_num_draft_tokens,
        )

    def _store_prefill_rows(self, batch, taps: torch.Tensor) -> None:
        """Each request's draft state, and the head's context of every computed position. A request whose
        cached prefix (radix-cache hit, earlier chunk, earlier prefill before a retraction) has its context
        in the pool drafts from it; one whose prefix does not has lost its context for good."""
        req_to_token = batch.req_to_token_pool.req_to_token
        states = []
        for req, prefix_len in zip(batch.reqs, batch.prefix_lens):
            prefix = req_to_token[req.kv.req_pool_idx, :prefix_len]
            # no prefix: held; ranks that do not draft keep no context and judge nothing
            held = not self.ranks.drafts or self.context_pool.holds(prefix)
            states.append(self.states.admit(req, self.vocab_size, held))
        if self.ranks.drafts:
            self.head_context.store_prefill(batch, taps, states)

    # ---- one decode step: plan -> lanes -> Drafted -> VerifyInputs -> Verified -> StepOutputs -> result ----

    def _decode_step(self, batch, on_publish) -> GenerationBatchResult:
        """One decode step, phase by phase; each phase hands its value on, and the reporter reads them all."""
        own_plan, started = None, time.perf_counter()
        if self.ranks.drafts:  # a seeded request's steps run the table's plan (PolicyControl.step_plan)
            seeded = any(req.sampling_params.sampling_seed is not None for req in batch.reqs)
            own_plan = self.policy_control.step_plan(len(batch.reqs), time.time(), seeded)
        plan = self.ranks.share(own_plan)  # rank 0's on every rank: the policy's expiry reads this process's clock
        clock = self.reporter.start(plan)
        lanes = self.states.lanes(batch, plan.keep_draft_context, self.vocab_size)
        drafted = self.drafting.draft(batch, lanes, plan)
        clock.mark("drafted")
        inputs = self.verifier.bind(batch, lanes, drafted)
        clock.mark("bound")
        verified = self.verifier.forward(batch, lanes, drafted, inputs, reads_taps=plan.keep_draft_context)
        clock.mark("verified")
        out = accept_lanes(drafted, verified.logits_output.next_token_logits, lanes, plan.sampled_children)
        clock.mark("accepted")
        result = self.committer.commit(batch, lanes, drafted, inputs, verified, out, plan.budget, on_publish)
        clock.mark("committed")
        self.reporter.finish(clock, plan, drafted, out, batch.reqs)
        if self.ranks.drafts:  # the rank that plans measures what each plan served
            self.policy_control.served(len(batch.reqs), sum(out.row_counts), time.perf_counter(), started)
        return result
