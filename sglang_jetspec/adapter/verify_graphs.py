"""The tree verify under CUDA graphs: SGLang's own decode graph runner in TARGET_VERIFY mode, one per
verify width of the ladder (core.verify_widths), as SGLang's adaptive EAGLE keeps one per step count.

How a JETSPEC server gets there (SGLang 0.5.23; ../shared/notes/sglang-0.5.23-graph-runner.md):
- SGLang captures the target's TARGET_VERIFY graph itself after the workers exist (scheduler
  init_all_cuda_graphs), at the width it reserved KV for: the ladder's top rung. The worker has set the
  tap layers before (`set_dflash_layers_to_capture`), so the graph returns their rows.
- Its runner builds the capture's dummy verify input by algorithm and knows no plugin: the AFTER hook
  `after_get_spec_info` supplies JETSPEC's (a tree verify over the runner's custom-mask buffer, FULL
  hidden capture, the runner's width), as `dummy_verify` does for SGLang's warm-up forwards.
- A runner replays only batches of the mode and hidden-state capture it was captured with
  (`around_can_run_graph`); SGLang's own check would replay a DECODE batch on the verify graph, and a
  batch asking for more hidden states than the graph captured would raise instead of running eager.
- The worker's `init_cuda_graphs` (called right after the target's) captures the lower rungs, each with
  its own attention backend (a backend's graph buffers belong to one runner; Triton also sizes its mask
  by the width at creation), under SGLang's speculative_num_draft_tokens set to that width; and one
  plain DECODE graph, captured as SGLang captures a server without speculation but with every token's
  hidden state (the tap rows, for a step of roots whose requests keep drafting), for the steps of roots
  alone: a cohort gated off then costs what plain SGLang's decode costs. `VerifyGraphs.select(width)`
  installs a width's backend and runner on the target before its forward; a step no graph serves runs
  eager.

TODO(GPU): none of this has run on a GPU yet (no device was lent to the sessions that wrote it). It is on
by default on CUDA (issue 57); --disable-decode-cuda-graph is the operator's way back to the eager verify.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass

log = logging.getLogger(__name__)

_RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
SPEC_INFO_TARGET = f"{_RUNNER}.get_spec_info"
CAN_RUN_TARGET = f"{_RUNNER}.can_run_graph"


def _serves_jetspec(runner) -> bool:
    from sglang_jetspec.adapter.spec_algo import JetSpecAlgo

    model_runner = runner.model_runner
    return isinstance(model_runner.spec_algorithm, JetSpecAlgo) and not model_runner.is_draft_worker


def after_get_spec_info(result, runner, *args, **kwargs):
    """The dummy verify input a JETSPEC verify graph is captured with: the runner's custom-mask buffer
    (so the attention backend captures its custom-mask kernel) and width, FULL hidden capture (the class
    default: the tap rows of every verify token)."""
    if result is not None or not _serves_jetspec(runner) or not runner.capture_forward_mode.is_target_verify():
        return result
    from sglang_jetspec.adapter.spec_inputs import JetSpecVerifyInput

    return JetSpecVerifyInput(
        draft_token=None,
        custom_mask=runner.buffers.custom_mask,
        positions=None,
        retrieve_index=None,
        retrieve_next_token=None,
        retrieve_next_sibling=None,
        draft_token_num=runner.captured_req_width,
    )


def around_can_run_graph(original, runner, forward_batch, *args, **kwargs):
    """A JETSPEC runner replays only batches of its own mode (a verify graph never replays a DECODE batch of
    roots) that ask for no more hidden states than it captured; anything else runs eager."""
    if _serves_jetspec(runner) and (
        runner.capture_forward_mode != forward_batch.forward_mode
        or runner.capture_hidden_mode < forward_batch.capture_hidden_mode
    ):
        return False
    return original(runner, forward_batch, *args, **kwargs)


@contextmanager
def _without_speculation(model_runner):
    """The target seen as a server without speculation while its plain DECODE graph is captured (SGLang's
    runner captures TARGET_VERIFY whenever the server speculates)."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algorithm = model_runner.spec_algorithm
    model_runner.spec_algorithm = SpeculativeAlgorithm.NONE
    try:
        yield
    finally:
        model_runner.spec_algorithm = algorithm


@contextmanager
def resolved(**fields):
    """SGLang's resolved config leaves set to `fields` while a graph's backend and runner are built (what
    its buffers and capture read: speculative_num_draft_tokens, return_hidden_states_mode), then restored."""
    from sglang.srt.runtime_context import get_context

    context = get_context()
    was = {name: context.config_leaf(name) for name in fields}
    context.override("jetspec.verify_graphs", **fields)
    try:
        yield
    finally:
        context.override("jetspec.verify_graphs", **was)


@dataclass
class WidthGraphs:
    attn_backend: object
    graph_runner: object
    memory_gb: float


class VerifyGraphs:
    """The target's graphs by verify width (1: the plain decode graph). `select(width)` before each forward."""

    def __init__(self, model_runner, by_width: dict[int, WidthGraphs], eager: WidthGraphs) -> None:
        self.model_runner, self.by_width, self.eager = model_runner, by_width, eager

    @classmethod
    def capture(cls, model_runner, rungs: tuple[int, ...], runner_cls=None, free_gb=None) -> VerifyGraphs:
        """SGLang's own capture (the top rung, already on `model_runner`), one more backend and runner per
        lower rung, and the plain decode graph; each one's graph memory is logged."""
        if free_gb is None:
            from sglang.srt.utils.common import get_available_gpu_memory

            def free_gb() -> float:
                return get_available_gpu_memory(model_runner.device, model_runner.gpu_id)

        runner_cls = runner_cls or model_runner._decode_cuda_graph_runner_cls()

        def captured(width: int, build) -> WidthGraphs:
            before = free_gb()
            backend, runner = build()
            graphs = WidthGraphs(backend, runner, before - free_gb())
            what = "plain decode" if width == 1 else f"verify width {width}"
            log.info(
                "JETSPEC %s graphs: batch sizes %s, %.2f GB", what, getattr(runner, "capture_bs", "?"), graphs.memory_gb
            )
            return graphs

        def verify(width: int):
            with resolved(speculative_num_draft_tokens=width):
                backend = model_runner._get_attention_backend(init_new_workspace=True)
                return backend, runner_cls(model_runner, attn_backend=backend, speculative_num_draft_tokens=width)

        def plain_decode():  # with every token's hidden state: a step of roots may keep its tap rows
            with _without_speculation(model_runner), resolved(return_hidden_states_mode="full"):
                backend = model_runner._get_attention_backend(init_new_workspace=True)
                return backend, runner_cls(model_runner, attn_backend=backend)

        top = WidthGraphs(model_runner.attn_backend, model_runner.decode_cuda_graph_runner, 0.0)
        by_width = {rungs[-1]: top}
        for width in rungs[:-1]:
            by_width[width] = captured(width, lambda width=width: verify(width))
        by_width[1] = captured(1, plain_decode)
        return cls(model_runner, by_width, top)

    def select(self, width: int) -> bool:
        """Install `width`'s backend and runner on the target; False when no graph serves that width (the
        forward then runs eager on SGLang's own backend)."""
        chosen = self.by_width.get(width, self.eager)
        self.model_runner.attn_backend = chosen.attn_backend
        self.model_runner.decode_cuda_graph_runner = chosen.graph_runner
        return width in self.by_width
