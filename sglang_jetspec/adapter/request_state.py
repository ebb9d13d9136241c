"""Per-request draft state of the SGLang worker, keyed by SGLang's request id (pure PyTorch).

For every running request the worker keeps what the core's drafter and acceptance read besides the
head's context: the request's SamplingParams and its own random generator, its penalties, and, set
before each draft, its root token and the KV slots of its context positions. The head's context K/V
itself lives in the worker's pool per KV slot (core.context_pool), beside SGLang's KV, so a prefix
the radix cache hands over brings it along. A request stops drafting for good for one of two
reasons: its context is not all in the pool (`context_lost`: its prefix was written while speculation
was off), or its cohort is gated off by default (`gated_off`: no draft context is kept, so none could
be drafted from later). It still decodes, root-only, with no draft work: lossless, only unspeculated.
"""

from __future__ import annotations

import logging
import time

import torch

from sglang_jetspec.adapter.request_sampling import core_sampling_params
from sglang_jetspec.adapter.tree_penalties import RequestPenalties, request_penalties
from sglang_jetspec.core.sampling import SamplingParams, make_generator

log = logging.getLogger(__name__)


class RequestDraftState:
    """The worker's lane (core.lanes): one request as the drafter (a SlotLane) and the acceptance see it."""

    def __init__(self, rid: str, params: SamplingParams) -> None:
        self.rid = rid
        self.params = params
        self.generator = make_generator(params.seed)  # acceptance draws its uniforms on the host
        self.context_lost = False  # its prefix's context is not all in the pool
        self.gated_off = False  # its cohort keeps no draft context
        self.req = None  # the engine's own request object (SGLang's Req), for its finish state and token ids
        self.penalties = RequestPenalties()  # its frequency / presence / repetition / min_new_tokens
        self.root_token = -1  # set before each draft: the request's last committed token
        self.kv_len = 0  # set before each draft: its committed tokens with KV (all but the root)
        # set before each draft (core.lanes.SlotLane): its context's KV slots are slot_table[slot_row, :kv_len]
        self.slot_table: torch.Tensor | None = None
        self.slot_row = 0
        self.started_at = time.time()  # for the shadow record
        self.budgets: list[int] = []  # tree budget of each verify step (0 = off)
        self.accept_lengths: list[int] = []  # tokens committed by each verify step, bonus included

    @property
    def committed_ids(self) -> list[int]:
        """Prompt and output tokens, from the engine's request (prompt lookup reads them for the hybrid drafter)."""
        return list(self.req.origin_input_ids) + list(self.req.output_ids)

    @property
    def drafts(self) -> bool:
        """The head drafts for this request and keeps its context."""
        return not (self.context_lost or self.gated_off)


class DraftStateStore:
    """The running requests' states; the worker adds them at prefill and drops them when they finish."""

    def __init__(self) -> None:
        self._states: dict[str, RequestDraftState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, rid: str) -> bool:
        return rid in self._states

    def get(self, rid: str) -> RequestDraftState | None:
        return self._states.get(rid)

    def admit(self, req, vocab_size: int, prefix_held: bool) -> RequestDraftState:
        """The state of SGLang request `req` (created here, and only here) at a prefill, one chunk of it,
        a prefill again after a retraction, or a first decode of a request this worker did not prefill;
        `prefix_held`: its prefix's context is all in the pool. Attached to the live Req: its finish
        reason and token ids for the sweep and the shadow, and its penalties."""
        state = self.extended(req.rid, core_sampling_params(req.sampling_params, vocab_size), prefix_held)
        state.req = req
        state.penalties = request_penalties(req)
        return state

    def extended(self, rid: str, params: SamplingParams, prefix_held: bool) -> RequestDraftState:
        """`admit`'s bookkeeping, by request id: the state, created on first sight, loses its
        context for good when its prefix's is not held."""
        state = self._states.get(rid)
        if state is None:
            state = self._states[rid] = RequestDraftState(rid, params)
        if not prefix_held and not state.context_lost:
            log.info(
                "request %s: the head's context of its cached prefix is not in the pool (written while "
                "speculation was off); it decodes without speculation",
                rid,
            )
            state.context_lost = True
        return state

    def lanes(self, batch, keep_draft_context: bool, vocab_size: int) -> list[RequestDraftState]:
        """A decode step's lanes: each request's state, with this step's root token, committed KV length and
        (requests that draft) where the KV slots of their context positions 0..kv_len-1 are: their row of
        req_to_token, read once for the whole batch when the head drafts. No tensor work per request. A plan
        that keeps no draft context gates its requests off for good."""
        lanes = []
        seq_lens = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else batch.seq_lens.cpu()
        for req, kv_len in zip(batch.reqs, seq_lens.tolist()):
            state = self._states.get(req.rid)
            if state is None:  # not prefilled through this worker (e.g. after clear_cache_pool): no context
                state = self.admit(req, vocab_size, prefix_held=False)
            state.root_token = int(req.output_ids[-1])  # sync scheduler: the last committed token
            state.kv_len = kv_len
            if not keep_draft_context:
                state.gated_off = True
            state.slot_table, state.slot_row = batch.req_to_token_pool.req_to_token, req.kv.req_pool_idx
            lanes.append(state)
        return lanes

    def drop(self, rid: str) -> RequestDraftState | None:
        return self._states.pop(rid, None)

    def drop_all(self) -> None:
        self._states.clear()

    def rids(self) -> list[str]:
        return list(self._states)
