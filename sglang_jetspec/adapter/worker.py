"""JetSpecWorker: `--speculative-algorithm JETSPEC` as an SGLang 0.5.23 spec-V2 worker.

Structure follows SGLang's NGRAMWorker (speculative/ngram_worker.py), the in-tree worker that
verifies arbitrary trees: no draft TpModelWorker, the target's memory pools, a TARGET_VERIFY pass
with a FULL custom mask, `move_accept_tokens_to_target_kvcache`, the same GenerationBatchResult.
What differs:
- drafting: the core's DraftHead in plain PyTorch beside the target (core.head_drafter.HeadDrafter,
  core.tree_drafting.draft_trees), fed by tap-layer rows the target captures in every forward
  (`set_dflash_layers_to_capture`, the hook SGLang's DFLASH uses), projected into the head's
  context K/V at once and kept per KV slot (core.context_pool.SlotContextPool, addressed by the
  target's own slots: a prefix the radix cache hands over brings the head's context along);
- acceptance: the core's lossless rules (adapter.step_outputs.accept_step) with each request's own
  sampling parameters and generator, instead of `eagle_sample`; a cohort whose policy says
  `sampled_children: drawn` draws its sampled requests' children from the head's distribution and
  accepts them against it (core.drawn_children);
- the tree budget of each step comes from the runtime policy (adapter.policy.PolicyControl) by
  the batch size's cohort; budget 0 verifies the root alone, i.e. one ordinary decoding step with
  no draft work. A cohort with adaptive tree sizing verifies only the nodes that pay for themselves
  (core.tree_sizing), against a verify cost this worker learns by timing its own verify passes
  (core.learned_verify_cost).
The scheduler runs it synchronously: the overlap scheduler and decode CUDA graphs are refused by
adapter.server_args, so every call sees the previous step's results in req.output_ids.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from sglang.srt.arg_groups.overrides import resolving_view
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.observability.req_time_stats import set_time_batch
from sglang.srt.runtime_context import get_device, get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.spec_utils import move_accept_tokens_to_target_kvcache, record_stream_for_v2_verify

from policies import StepPlan, read_head_capacity
from sglang_jetspec.adapter.attention_backends import tree_mask_layout, verify_attention_backend
from sglang_jetspec.adapter.context_pool import allocate_context_pool
from sglang_jetspec.adapter.draft_model import register_draft_models
from sglang_jetspec.adapter.policy import PolicyControl, load_runtime_policy
from sglang_jetspec.adapter.request_sampling import core_sampling_params
from sglang_jetspec.adapter.request_state import DraftStateStore, RequestDraftState
from sglang_jetspec.adapter.server_args import JetSpecArgsError, target_info
from sglang_jetspec.adapter.spec_inputs import JetSpecDraftState, bind_decode_batch, bind_verify_batch
from sglang_jetspec.adapter.step_outputs import accept_step
from sglang_jetspec.adapter.tap_capture import taps_uncaptured
from sglang_jetspec.adapter.target_views import target_tables
from sglang_jetspec.adapter.tensor_parallel import perturbed, sglang_ranks
from sglang_jetspec.adapter.tree_grammar import TreeGrammar
from sglang_jetspec.adapter.tree_penalties import apply_logit_bias, apply_tree_penalties, request_penalties
from sglang_jetspec.adapter.verify_inputs import build_verify_tensors
from sglang_jetspec.adapter.worker_observability import (
    WorkerShadow,
    step_tracer,
    trace_step,
    worker_metrics,
    xgrammar_options,
)
from sglang_jetspec.core.context_pool import SlotContextPool
from sglang_jetspec.core.draft_vocab import load_draft_vocab
from sglang_jetspec.core.head_drafter import HeadDrafter
from sglang_jetspec.core.head_io import load_head
from sglang_jetspec.core.learned_verify_cost import LearnedVerifyCost
from sglang_jetspec.core.prompt_lookup import LookupMerge
from sglang_jetspec.core.step_record import StepRecord
from sglang_jetspec.core.suffix_store import RECENT_OUTPUT_TOKENS, SuffixStore, load_draft_corpus
from sglang_jetspec.core.tree import DraftTree, root_only_tree
from sglang_jetspec.core.tree_drafting import budget_spec, step_trees
from sglang_jetspec.core.tree_sizing import TreeSizer

log = logging.getLogger(__name__)


@dataclass
class VerifyStep:
    """One decode step as it passes JetSpecWorker._verify's phases."""

    lanes: list[RequestDraftState]
    seq_lens: list[int]  # committed KV length per request
    budget: int  # the plan's node budget
    trees: list[DraftTree]
    num_nodes: int  # verify rows per request
    grammar: TreeGrammar | None
    draft_s: float
    tree_s: float
    sized: bool  # adaptive sizing cut the trees (it learns from their accepted paths)
    adaptive: bool  # the cohort sizes its trees adaptively (it learns the verify cost from every step)
    verify_s: float = 0.0
    accept_started: float = 0.0
    taps: bool = True  # the target captures its tap layers (off when the plan keeps no draft context)


class JetSpecWorker(BaseSpecWorker):
    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker) -> None:
        super().__init__()
        self.server_args = server_args
        # SGLang keeps the flags as typed and records its resolutions beside them: read resolved values.
        # validate_server_args has already refused what JETSPEC cannot run with (paged KV, ...).
        cfg = resolving_view(server_args)
        self._target_worker = target_worker
        self._draft_worker = None  # no draft TpModelWorker: the head runs in PyTorch beside the target
        self.model_runner = target_worker.model_runner  # NGRAMWorker exposes the target's runner the same way
        # spells the text a request's grammar forces next (None under --skip-tokenizer-init: nothing forced)
        self.tokenizer = target_worker.tokenizer
        self.device = get_device().device
        self.mask_layout = tree_mask_layout(verify_attention_backend(cfg)[1])  # validated: a tree-mask backend
        # Read by SGLang's metrics reporter (sglang:spec_num_steps / spec_num_draft_tokens) and
        # reported as the result's speculative_num_draft_tokens: the widest tree any policy allows.
        self.speculative_num_steps = get_spec().speculative_num_steps
        self.speculative_num_draft_tokens = get_spec().speculative_num_draft_tokens

        # The JetSpec classes for published DFlash-layout heads, for any SGLang code that loads the head
        # by architecture; this process already imports model code, unlike the plugin's entry point.
        register_draft_models()
        draft_path = cfg.speculative_draft_model_path
        target = target_info(cfg.model_path, cfg.trust_remote_code)
        self.head = load_head(draft_path, target, dtype=self.model_runner.dtype, device=self.device)
        capacity = read_head_capacity(draft_path)
        self.tree_width = capacity.tree_width
        model = self.model_runner.model
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
        model.set_dflash_layers_to_capture(list(self.head.config.target_layer_ids))
        vocab = self.head.config.vocab_size
        # under tensor parallelism rank 0 drafts and the others follow (adapter.tensor_parallel)
        self.ranks = sglang_ranks()
        self.drafter = HeadDrafter(
            self.head, *target_tables(model, vocab, self.ranks), load_draft_vocab(draft_path, vocab)
        )
        self.vocab_size = vocab
        self.states = DraftStateStore()
        self.context_pool: SlotContextPool | None = None  # built with the target's pools (alloc_memory_pool)

        self.metrics = worker_metrics(cfg.enable_metrics and self.ranks.drafts)  # the drafting rank reports
        policy = load_runtime_policy(draft_path)
        self.policy_control = PolicyControl(  # read by adapter.internal_state's /set_internal_state hooks
            policy,
            admin_key_configured=cfg.admin_api_key is not None,
            on_change=self.metrics.show_policy if self.metrics is not None else None,
            head=capacity,
        )
        # for cohorts whose drafter is hybrid: prompt lookup, the head's draft corpus, and what this
        # worker's finished requests wrote
        self.hybrid = LookupMerge.from_policy(
            policy.lookup,
            load_draft_corpus(draft_path, vocab) or SuffixStore(),
            SuffixStore(max_tokens=RECENT_OUTPUT_TOKENS),
        )
        # adaptive tree sizing (cohorts whose policy asks for it): one calibration and draft gate for the
        # worker, as the reference engine keeps one per engine, and the verify cost it has timed
        self.sizer = TreeSizer()
        self.verify_costs = LearnedVerifyCost()
        self.shadow = (
            WorkerShadow.from_env(
                policy.shadow.sample_rate,
                model=cfg.served_model_name or cfg.model_path,
                head=str(draft_path),
                grammar=xgrammar_options(cfg),
            )
            if self.ranks.drafts
            else None
        )

    # ---- lifecycle (scheduler.py init_memory_pools / init_all_* / result processor) ----

    def alloc_memory_pool(self, **kwargs) -> None:
        # As NGRAMWorker: the verify writes the target's own pools. Beside them, the head's context
        # per KV slot, addressed by the same slot indices.
        self.req_to_token_pool, self.token_to_kv_pool_allocator = self._target_worker.get_memory_pool()
        self.context_pool = allocate_context_pool(
            self.head.config, self.token_to_kv_pool_allocator, self.model_runner.dtype, self.device
        )
        self.drafter.context = self.context_pool

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
        retraction): drop its draft state (adapter.scheduler_hooks)."""
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

    # ---- forward ----

    def forward_batch_generation(
        self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None
    ) -> GenerationBatchResult:
        record_stream_for_v2_verify(batch, None, torch.get_device_module(self.device).current_stream())
        self.retire_finished()
        if batch.forward_mode.is_decode():
            result = self._verify(batch, on_publish)
        else:
            result = self._prefill(batch, on_publish, pp_proxy_tensors)
        self._show_live_states()
        return result

    def refresh_idle(self) -> None:
        """What a step would refresh, between steps (the scheduler's idle loop, adapter.scheduler_hooks):
        requests that finished leave, an expired push reverts, and the gauges say so while no step runs."""
        self.retire_finished()
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
        if self.hybrid.recent is not None and self.ranks.drafts:  # only the drafting rank looks outputs up
            self.hybrid.recent.add(list(state.req.output_ids))
        if self.shadow is not None:
            self.shadow.finished(state.req, state)

    def _prefill(self, batch, on_publish, pp_proxy_tensors) -> GenerationBatchResult:
        """Extend (or idle): the target forward samples the first token (SGLang's sampler, as in
        NGRAMWorker); FULL capture returns the tap rows of every computed position."""
        is_extend = batch.forward_mode.is_extend()
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
        """The head's context of every computed position, at its KV slot. A request whose cached
        prefix (radix-cache hit, earlier chunk, earlier prefill before a retraction) has its context
        in the pool drafts from it; one whose prefix does not is blind."""
        req_to_token = batch.req_to_token_pool.req_to_token
        keep, positions, offset = [], [], 0
        for req, prefix_len, extend_len in zip(batch.reqs, batch.prefix_lens, batch.extend_lens):
            params = core_sampling_params(req.sampling_params, self.vocab_size)
            # no prefix: held; ranks that do not draft keep no context and judge nothing
            held = not self.ranks.drafts or self.context_pool.holds(req_to_token[req.kv.req_pool_idx, :prefix_len])
            state = self.states.extended(req.rid, params, held)
            self._attach(state, req)
            if not state.blind:
                keep.append(torch.arange(offset, offset + extend_len))
                positions.append(torch.arange(prefix_len, prefix_len + extend_len))
            offset += extend_len
        if keep and self.ranks.drafts:
            rows, device = torch.cat(keep).to(self.device), self.device
            self.context_pool.write(
                self.drafter.head, taps[rows], torch.cat(positions).to(device), batch.out_cache_loc[rows]
            )

    @staticmethod
    def _attach(state: RequestDraftState, req) -> None:
        state.req = req  # the live Req: its finish reason and token ids for the sweep and the shadow
        state.penalties = request_penalties(req)

    def _trees(
        self,
        lanes: list[RequestDraftState],
        plan: StepPlan,
        budget: int,
        sizer: TreeSizer | None,
        grammar: TreeGrammar | None,
    ) -> tuple[list[DraftTree], float, float, bool]:
        """Each request's tree (root-only for budget <= 1 and for blind requests), head and tree seconds,
        and whether `sizer` cut the trees (adaptive sizing; not on a step that times a missing end of
        the verify cost curve). A constrained request's tree loses the nodes its grammar forbids before
        sizing. The plan gives the tree-causal rounds after the marginal tree (the
        policy allows them only for a head trained with revealed tokens), the tree width (0 = the
        head's) and the drafter (head or hybrid)."""
        trees = [root_only_tree(lane.root_token) for lane in lanes]
        drafting = [b for b, lane in enumerate(lanes) if budget > 1 and not lane.blind]
        probe = self.verify_costs.probe(len(lanes), budget) if sizer is not None else None
        if not drafting or probe == 1:  # probe 1: time an ordinary step, without draft work
            return trees, 0.0, 0.0, False
        spec = budget_spec(self.drafter.max_depth, budget, plan.tree_width or self.tree_width)
        sizing = sizer is not None and probe is None
        trees, timing = step_trees(
            self.drafter,
            lanes,
            spec,
            rounds=plan.draft_rounds,
            lookup=self.hybrid if plan.drafter == "hybrid" else None,
            draw=plan.sampled_children == "drawn",
            sizer=sizer if sizing else None,
            cost=self.verify_costs.curve(len(lanes)) if sizing else None,
            drafting=drafting,
            root_allowed=[grammar.root_allowed(b) for b in drafting] if grammar is not None else None,
            forced=[grammar.forced_tokens(b, self.tokenizer) for b in drafting] if grammar is not None else None,
            prune=grammar.prune if grammar is not None else None,
        )
        return trees, timing.draft_s, timing.tree_s, sizing

    def _agree_on_trees(self, trees: list[DraftTree], lanes: list[RequestDraftState]) -> list[DraftTree]:
        """Rank 0's trees on every rank, with the generator state of each sampled request (rank 0's
        drafting may have drawn from it; acceptance draws next), checked equal before the verify."""
        states = [None if lane.params.greedy else lane.generator.get_state() for lane in lanes]
        trees, states = self.ranks.share((trees, states) if self.ranks.drafts else None)
        for lane, state in zip(lanes, states):
            if state is not None:
                lane.generator.set_state(state)
        if self.ranks.perturbs:
            trees = perturbed(trees)
        self.ranks.agree("trees", [t for tree in trees for t in (tree.tokens, tree.parents)])
        return trees

    def _keep_context(
        self,
        lanes: list[RequestDraftState],
        taps: torch.Tensor,
        out,
        seq_lens: list[int],
        out_cache_loc: torch.Tensor,
        num_nodes: int,
    ) -> None:
        """The head's context of the committed tokens (root + accepted nodes) of each drafting request:
        their verify rows' taps, at positions kv_len + i and the slots the KV mover put their target KV
        in (the first ones of the request's verify window). Rejected nodes' slots are left invalid."""
        if all(lane.blind for lane in lanes):
            return
        # per kept row (request-major, as out.row_index): its request and its place in that request's rows
        counts = torch.tensor(out.row_counts)
        lane_of_row = torch.repeat_interleave(torch.arange(len(lanes)), counts)
        offset = torch.arange(len(lane_of_row)) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        drafting = torch.tensor([not lane.blind for lane in lanes])[lane_of_row]
        positions = (torch.tensor(seq_lens)[lane_of_row] + offset)[drafting]
        window = (lane_of_row * num_nodes + offset)[drafting]
        device = self.device
        self.context_pool.write(
            self.drafter.head,
            taps[out.row_index[drafting].to(device)],
            positions.to(device),
            out_cache_loc[window.to(device)],
        )

    def _sync(self, observed: bool) -> float:
        """A phase boundary. When metrics or traces read the phase timings, wait for the device so they
        measure work rather than kernel launches; otherwise the step never stalls for them."""
        if observed:
            torch.get_device_module(self.device).synchronize()
        return time.perf_counter()

    def _verify(self, batch, on_publish) -> GenerationBatchResult:
        """One decode step: plan, draft, verify, accept, commit, report."""
        t_start, t_start_ns = time.perf_counter(), time.time_ns()
        tracer = step_tracer() if self.ranks.drafts else None  # spans come from rank 0 alone
        observed = tracer is not None or self.metrics is not None
        committed_lens = batch.seq_lens  # a decode forward rebinds batch.seq_lens to count the root
        seq_lens = (batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens.cpu()).tolist()
        # rank 0's plan on every rank: the policy's expiry reads this process's clock
        plan = self.ranks.share(
            self.policy_control.step_plan(len(batch.reqs), time.time()) if self.ranks.drafts else None
        )
        lanes = self._lanes(batch, plan, seq_lens)
        step = self._draft(batch, lanes, plan, seq_lens)
        timed = observed or step.adaptive  # adaptive sizing learns the verify cost from these timings
        logits_output, can_run_cuda_graph = self._verify_forward(batch, step, timed)

        out = accept_step(
            step.trees,
            logits_output.next_token_logits,
            step.num_nodes,
            [lane.params for lane in lanes],
            [lane.generator for lane in lanes],
            "draw" if plan.sampled_children == "drawn" else "match",
        )
        if step.sized:
            self.sizer.observe([result.path for result in out.results])
        self.ranks.agree("accepted tokens", [out.accept_lens, out.next_token_ids])
        t_commit = time.perf_counter()
        accept_lens, new_seq_lens = self._commit(batch, step, out, logits_output, committed_lens, on_publish)
        t_end = self._sync(observed)
        if step.adaptive:  # what a tree costs after its verify forward, charged by the next steps' sizing
            self.sizer.overhead.observe(t_end - step.accept_started, verified_tree=step.num_nodes > 1)

        if observed:
            record = StepRecord(
                batch_size=len(lanes),
                budget=plan.budget,
                committed_tokens=sum(out.row_counts),
                accept_lengths=out.row_counts,
                draft_s=step.draft_s,
                tree_s=step.tree_s,
                verify_s=step.verify_s,
                accept_s=t_end - step.accept_started,
                commit_s=t_end - t_commit,
                wall_s=t_end - t_start,
                verified_nodes=sum(tree.size for tree in step.trees),
            )
            if self.metrics is not None:
                self.metrics.record_step(plan.cohort, record)
            if tracer is not None:
                trace_step(tracer, plan.cohort, record, t_start_ns, [req.rid for req in batch.reqs])
        device = self.device
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=out.next_token_ids.to(device),
            can_run_cuda_graph=can_run_cuda_graph,
            accept_lens=accept_lens,
            new_seq_lens=new_seq_lens,
            next_draft_input=JetSpecDraftState(out.bonus_tokens.to(device), new_seq_lens),
            speculative_num_draft_tokens=self.speculative_num_draft_tokens,
            speculative_output_stride=out.stride,
        )

    def _lanes(self, batch, plan: StepPlan, seq_lens: list[int]) -> list[RequestDraftState]:
        """Each request's draft state, with this step's root token and (drafting requests) context slots."""
        lanes = []
        for req, kv_len in zip(batch.reqs, seq_lens):
            state = self.states.get(req.rid)
            if state is None:  # not prefilled through this worker (e.g. after clear_cache_pool): no context
                state = self.states.extended(
                    req.rid, core_sampling_params(req.sampling_params, self.vocab_size), prefix_held=False
                )
                self._attach(state, req)
            state.root_token = int(req.output_ids[-1])  # sync scheduler: the last committed token
            if not plan.keep_draft_context:
                state.stop_drafting()  # gated off by default: no draft work, no context kept
            if not state.blind:  # a view of its req_to_token row: the slots of positions 0..kv_len-1
                state.context_slots = batch.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :kv_len]
            lanes.append(state)
        return lanes

    def _draft(self, batch, lanes: list[RequestDraftState], plan: StepPlan, seq_lens: list[int]) -> VerifyStep:
        """The step's trees (rank 0 drafts, every rank receives them) and how many nodes the verify takes."""
        # KV reservations and buffers were sized for speculative_num_draft_tokens nodes
        num_nodes = max(1, min(plan.budget, self.speculative_num_draft_tokens))
        set_time_batch(batch.reqs, "set_spec_draft_start_time", trace_only=True)
        sizer = self.sizer if plan.tree_sizing == "adaptive" and num_nodes > 1 else None
        grammar = TreeGrammar.of_batch(batch)
        trees, draft_s, tree_s, sized = (
            self._trees(lanes, plan, num_nodes, sizer, grammar) if self.ranks.drafts else ([], 0.0, 0.0, False)
        )
        if self.ranks.size > 1:
            trees = self._agree_on_trees(trees, lanes)
        set_time_batch(batch.reqs, "set_spec_draft_end_time", trace_only=True)
        if sizer is not None or grammar is not None:  # trees cut by sizing or by grammars
            num_nodes = max(tree.size for tree in trees)  # the verify pads every request to the longest tree
        return VerifyStep(
            lanes,
            seq_lens,
            plan.budget,
            trees,
            num_nodes,
            grammar,
            draft_s,
            tree_s,
            sized,
            sizer is not None,
            taps=plan.keep_draft_context,
        )

    def _verify_forward(self, batch, step: VerifyStep, timed: bool):
        """The target's forward over every request's tree, then each node's logits processed as SGLang's
        sampler would a plain decode's. Returns the logits output and whether it ran as a CUDA graph."""
        t_bind = time.perf_counter()
        device, lanes, trees, num_nodes = self.device, step.lanes, step.trees, step.num_nodes
        # Root-only trees verify nothing: an ordinary decode forward (logits only; the acceptance
        # samples as on every step), cheaper than a one-node TARGET_VERIFY. Logprob requests keep the
        # verify path, whose rows compute_spec_logprobs reads.
        decode = num_nodes == 1 and not batch.return_logprob
        # the tap rows feed the head's context, which only the drafting rank keeps
        capture_taps = self.ranks.drafts and any(not lane.blind for lane in lanes)
        if decode:
            bind_decode_batch(batch, torch.tensor([lane.root_token for lane in lanes]), device)
        else:
            tensors = build_verify_tensors(trees, step.seq_lens, num_nodes)
            bind_verify_batch(
                batch, tensors, step.seq_lens, num_nodes, self.mask_layout, device, capture_taps=capture_taps
            )
        grammar_mask = step.grammar.mask(trees, num_nodes, device) if step.grammar is not None else None
        t_verify = self._sync(timed)
        step.tree_s += t_verify - t_bind  # the verify tensors and grammar masks are part of building the trees
        capture = CaptureHiddenMode.FULL if capture_taps else CaptureHiddenMode.NULL
        with nullcontext() if step.taps else taps_uncaptured(self.model_runner.model):
            result = self._target_worker.forward_batch_generation(
                batch, is_verify=True, capture_hidden_mode=capture if decode else None
            )
        logits = result.logits_output.next_token_logits
        # each node's row penalised as a plain decode at its output position (not SGLang's relaxed
        # per-step penalties), masked to what the request's grammar allows after the node's path, then
        # the request's logit bias: the order of SGLang's own sampler
        apply_tree_penalties(
            logits, [lane.penalties for lane in lanes], [lane.req.output_ids for lane in lanes], trees, num_nodes
        )
        if grammar_mask is not None:
            grammar_mask.apply(logits)
        apply_logit_bias(logits, batch.sampling_info.logit_bias, num_nodes)
        t_accept = self._sync(timed)
        step.verify_s = t_accept - t_verify
        if timed:
            self.verify_costs.observe(len(lanes) * num_nodes, step.verify_s)
        step.accept_started = t_accept
        return result.logits_output, result.can_run_cuda_graph

    def _commit(self, batch, step: VerifyStep, out, logits_output, committed_lens, on_publish):
        """Keep the accepted nodes: their target KV, logprobs, the head's context of their tap rows, and
        each request's accept length. Returns the accept lengths and new sequence lengths (device)."""
        device = self.device
        accept_lens = out.accept_lens.to(device)
        accept_index = out.accept_index.to(device)
        new_seq_lens = committed_lens + accept_lens
        # Target KV of the kept nodes moves to the front of each request's verify window (a root-only
        # step has nothing to move: the root's KV is already in place).
        if step.num_nodes > 1:
            move_accept_tokens_to_target_kvcache(batch, accept_index, accept_lens - 1, self.token_to_kv_pool_allocator)
        if batch.return_logprob:
            compute_spec_logprobs(batch, logits_output, out.predict.to(device), accept_index=accept_index)
        if on_publish is not None:
            on_publish(new_seq_lens)  # once per forward, right after acceptance (overlap_utils contract)
        taps = logits_output.hidden_states  # [bs*N, taps*H]: every node's tap rows (none when not captured)
        if taps is not None:
            self._keep_context(step.lanes, taps, out, step.seq_lens, batch.out_cache_loc, step.num_nodes)
        for lane, length in zip(step.lanes, out.row_counts):
            lane.budgets.append(step.budget)
            lane.accept_lengths.append(length)
        logits_output.hidden_states = None
        batch.forward_mode = ForwardMode.DECODE
        return accept_lens, new_seq_lens
