"""Per-request draft state of the SGLang worker, keyed by SGLang's request id (pure PyTorch).

For every running request the worker keeps what the core's drafter and acceptance read: the head's
ContextCache (its projected context K/V), the tapped target rows it has not projected yet, the
request's SamplingParams and its own random generator.

Invariant, as in the reference engine: rows == KV length == committed tokens - 1 (the newest token,
the next root, has neither). Prefill writes rows for the positions it computed; each verify
appends the rows of [root, accepted nodes]. A request whose rows have a gap (its prefix came from
SGLang's radix cache, which holds no tap rows) is `blind`: it still decodes, root-only, with no
draft work, so it stays lossless and only loses speculation.
"""

from __future__ import annotations

import logging
import time

import torch

from sglang_jetspec.adapter.tree_penalties import RequestPenalties
from sglang_jetspec.core.drafter import ContextCache
from sglang_jetspec.core.sampling import SamplingParams, make_generator

log = logging.getLogger(__name__)


class RequestDraftState:
    """One request as the drafter (a DraftLane) and the acceptance see it.

    Rows the head has projected into `draft_cache` are freed as soon as it has (`release_projected`,
    which HeadDrafter calls right after syncing, and every append): the cache holds all the head ever
    reads of them (a position's context K/V depends only on its own row), and the raw rows are several
    times larger, outside SGLang's KV pool. So the state keeps only rows `first_tap_row` ..
    `num_rows - 1`, the ones not projected yet.

    Memory held per request (`nbytes`), outside SGLang's KV pool:
      * context K/V: capacity x 2 x head layers x KV heads x head_dim x dtype bytes
        (`core.drafter.context_bytes_per_token`), capacity <= 2 x context length (doubling growth);
      * tap rows: only the unprojected ones, taps x hidden x dtype bytes each, in a buffer sized
        exactly when it starts empty (the usual step: one verify's rows) and grown by doubling while
        rows pile up without a draft (speculation off), so <= 2 x the unprojected rows.
    """

    def __init__(self, rid: str, params: SamplingParams, tap_width: int, device, dtype) -> None:
        self.rid = rid
        self.params = params
        self.generator = make_generator(params.seed)  # acceptance draws its uniforms on the host
        self.draft_cache = ContextCache()
        self.blind = False
        self.req = None  # the engine's own request object (SGLang's Req), for its finish state and token ids
        self.penalties = RequestPenalties()  # its frequency / presence / repetition / min_new_tokens
        self.root_token = -1  # set before each draft: the request's last committed token
        self.started_at = time.time()  # for the shadow record
        self.budgets: list[int] = []  # tree budget of each verify step (0 = off)
        self.accept_lengths: list[int] = []  # tokens committed by each verify step, bonus included
        self._rows = torch.empty(0, tap_width, device=device, dtype=dtype)  # rows first_tap_row .. num_rows-1
        self._first_row = 0
        self._num_rows = 0

    @property
    def committed_ids(self) -> list[int]:
        """Prompt and output tokens, from the engine's request (prompt lookup reads them for the hybrid drafter)."""
        return list(self.req.origin_input_ids) + list(self.req.output_ids)

    @property
    def num_rows(self) -> int:
        """Rows known for this request: one per KV position (freed rows included)."""
        return self._num_rows

    @property
    def first_tap_row(self) -> int:
        return self._first_row

    def tap_rows(self) -> torch.Tensor:
        """The rows not freed yet, from position `first_tap_row` on."""
        return self._rows[: self._num_rows - self._first_row]

    def nbytes(self) -> int:
        """Bytes this request holds outside SGLang's KV pool: its tap-row buffer and its context K/V."""
        return self._rows.untyped_storage().nbytes() + self.draft_cache.nbytes()

    def stop_drafting(self) -> None:
        """Never draft for this request again (its cohort is gated off by default): free its tap rows
        and the head's context, and keep none from now on. It decodes root-only until it finishes."""
        if self.blind:
            return
        self.blind = True
        self._rows = self._rows.new_empty(0, self._rows.shape[1])
        self._first_row = self._num_rows
        self.draft_cache = ContextCache()

    def truncate(self, length: int) -> None:
        """Forget rows from `length` on (a retracted request is prefilled again from there)."""
        if length >= self._num_rows:
            return
        self.draft_cache.truncate(length)
        if length <= self._first_row:  # every row kept was past `length`; what stays before it is in the cache
            self._first_row = length
            self._rows = self._rows.new_empty(0, self._rows.shape[1])
        self._num_rows = length

    def append(self, rows: torch.Tensor) -> None:
        self.release_projected()
        kept = self._num_rows - self._first_row
        added = rows.shape[0] if rows.dim() else 0
        if not added:
            return
        need = kept + added
        if need > self._rows.shape[0]:
            # exact when the buffer starts empty (the usual step: the head projected everything);
            # doubling while rows pile up undrafted, so appending stays amortised O(1)
            grown = self._rows.new_empty(need if kept == 0 else 2 * need, self._rows.shape[1])
            grown[:kept] = self._rows[:kept]
            self._rows = grown
        self._rows[kept:need] = rows  # a copy: never a view that would keep the verify's whole tap tensor alive
        self._num_rows += added

    def release_projected(self) -> None:
        """Free the rows the head has projected: keep only the rest, in a buffer of their own size."""
        projected = min(self.draft_cache.length, self._num_rows) - self._first_row
        if projected > 0:
            kept = self._num_rows - self._first_row - projected
            rest = self._rows.new_empty(kept, self._rows.shape[1])
            rest[:] = self._rows[projected : projected + kept]
            self._rows = rest
            self._first_row += projected


class DraftStateStore:
    """The running requests' states; the worker adds them at prefill and drops them when they finish."""

    def __init__(self, tap_width: int, device, dtype) -> None:
        self.tap_width, self.device, self.dtype = tap_width, device, dtype
        self._states: dict[str, RequestDraftState] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, rid: str) -> bool:
        return rid in self._states

    def get(self, rid: str) -> RequestDraftState | None:
        return self._states.get(rid)

    def extended(self, rid: str, params: SamplingParams, prefix_len: int, rows: torch.Tensor) -> RequestDraftState:
        """A prefill (or one chunk of it) computed positions prefix_len .. prefix_len+len(rows)-1."""
        state = self._states.get(rid)
        if state is None:
            state = self._states[rid] = RequestDraftState(rid, params, self.tap_width, self.device, self.dtype)
        if prefix_len > state.num_rows:
            if not state.blind:
                log.warning("request %s: prefill starts at %d but only %d tap rows are known (a radix-cache hit?); "
                            "it decodes without speculation", rid, prefix_len, state.num_rows)
            state.blind = True
            return state
        state.truncate(prefix_len)
        state.append(rows)
        return state

    def committed(self, state: RequestDraftState, rows: torch.Tensor, kv_len: int) -> None:
        """A verify kept `rows` (root + accepted nodes); `kv_len` is the KV length before it."""
        if state.blind:
            return
        if state.num_rows != kv_len:  # bookkeeping broke: never draft from misaligned context
            log.warning("request %s: %d tap rows for KV length %d; it decodes without speculation from now on",
                        state.rid, state.num_rows, kv_len)
            state.blind = True
            return
        state.append(rows)

    def drop(self, rid: str) -> RequestDraftState | None:
        return self._states.pop(rid, None)

    def nbytes(self) -> int:
        """Bytes all running requests hold outside SGLang's KV pool (tap rows and head context)."""
        return sum(state.nbytes() for state in self._states.values())

    def drop_all(self) -> None:
        self._states.clear()

    def rids(self) -> list[str]:
        return list(self._states)
