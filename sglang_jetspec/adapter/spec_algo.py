"""The JETSPEC entry in SGLang's algorithm registry.

SGLang 0.5.23's `CustomSpecAlgo` lacks four methods its scheduler calls on every algorithm
(`carries_draft_hidden_states`, `create_future_map`, `need_topk`, `get_platform_worker_cls`); this
subclass supplies them, and sets the speculative shape SGLang sizes KV reservations and buffers by.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from sglang.srt.arg_groups.overrides import resolving_view
from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from sglang_jetspec.adapter.server_args import resolve_speculative_shape

NAME = "JETSPEC"
log = logging.getLogger(__name__)


class JetSpecAlgo(CustomSpecAlgo):
    def carries_draft_hidden_states(self) -> bool:
        return False  # no disaggregated prefill->decode hand-over of draft state

    def need_topk(self) -> bool:
        return False  # the tree lives in the verify mask, not in EAGLE top-k buffers

    def get_platform_worker_cls(self):
        # SGLang's meaning: an out-of-tree platform's replacement worker, None for the built-in one.
        # JETSPEC has no platform variant; create_worker reaches JetSpecWorker through the factory.
        return None

    def has_draft_kv(self) -> bool:
        return False  # the head keeps its context K/V itself, outside SGLang's KV pools

    def create_future_map(
        self, device, req_to_token_pool, needs_cpu_seq_lens: bool = True, needs_confidence_relay: bool = False
    ):
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def handle_server_args(self, server_args) -> None:
        steps, topk, draft_tokens = resolve_speculative_shape(server_args)
        server_args.speculative_num_steps = steps
        server_args.speculative_eagle_topk = topk
        server_args.speculative_num_draft_tokens = draft_tokens
        graphs = server_args.cuda_graph_config
        if graphs.prefill.backend != "disabled":
            # JETSPEC's prefill asks for FULL hidden-state capture (the head's tap rows), which SGLang's
            # prefill graph runner does not replay: the graphs would be captured, never used, and hold memory.
            log.warning(
                "JETSPEC: prefill CUDA graphs (%s) switched off: JETSPEC's prefill captures the full hidden "
                "states, which SGLang's prefill graphs do not replay",
                graphs.prefill.backend,
            )
            server_args.cuda_graph_config = replace(graphs, prefill=replace(graphs.prefill, backend="disabled"))

    def resolve_max_speculative_num_draft_tokens(self, server_args):
        cfg = resolving_view(server_args)
        if cfg.speculative_num_draft_tokens is not None:
            return cfg.speculative_num_draft_tokens
        return resolve_speculative_shape(cfg)[2]
