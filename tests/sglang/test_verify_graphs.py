"""The pieces of the CUDA-graph verify a CPU can check (adapter.verify_graphs): the dummy input SGLang's
decode graph runner captures a JETSPEC verify with, the runner sending roots-only DECODE batches to the
eager path, and the set of runners by width that the verifier selects before each forward. The capture
and replay themselves need a GPU (issue 57's bench/gpu run)."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode  # noqa: E402

from sglang_jetspec.adapter import verify_graphs  # noqa: E402
from sglang_jetspec.adapter.spec_inputs import JetSpecVerifyInput  # noqa: E402
from sglang_jetspec.adapter.verify_graphs import VerifyGraphs  # noqa: E402


def _runner(spec_algorithm, width=8, mode=ForwardMode.TARGET_VERIFY, draft=False, hidden=CaptureHiddenMode.FULL):
    """The fields of a DecodeCudaGraphRunner the hooks read."""
    return SimpleNamespace(
        model_runner=SimpleNamespace(spec_algorithm=spec_algorithm, is_draft_worker=draft),
        capture_forward_mode=mode,
        capture_hidden_mode=hidden,
        buffers=SimpleNamespace(custom_mask=torch.ones(4 * width * (1 + width), dtype=torch.bool)),
        captured_req_width=width,
        speculative_num_steps=3,
        speculative_num_draft_tokens=width,
    )


@pytest.fixture(scope="module")
def runner_cls(jetspec_registered):
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.apply_hooks()
    return DecodeCudaGraphRunner


def test_sglangs_runner_captures_a_jetspec_verify_over_its_mask_buffer_at_its_width(runner_cls, jetspec_registered):
    runner = _runner(jetspec_registered, width=16)
    info = runner_cls.get_spec_info(runner, 4 * 16)  # SGLang's own method, our AFTER hook applied
    assert isinstance(info, JetSpecVerifyInput)
    assert info.custom_mask is runner.buffers.custom_mask  # the attention backend captures its mask kernel
    assert (info.draft_token_num, info.num_tokens_per_req) == (16, 16)  # the runner's width check matches
    assert info.capture_hidden_mode == CaptureHiddenMode.FULL  # the tap rows of every verify token


def test_other_algorithms_and_draft_runners_keep_sglangs_answer(runner_cls, jetspec_registered):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    assert runner_cls.get_spec_info(_runner(jetspec_registered, draft=True), 8) is None
    ngram = runner_cls.get_spec_info(_runner(SpeculativeAlgorithm.from_string("NGRAM")), 8)
    assert type(ngram).__name__ == "NgramVerifyInput"


def _batch(mode, hidden=CaptureHiddenMode.NULL):
    return SimpleNamespace(forward_mode=mode, capture_hidden_mode=hidden, replace_embeds=None)


def test_a_runner_replays_only_batches_of_its_mode_and_hidden_capture(runner_cls, jetspec_registered):
    verify_runner = _runner(jetspec_registered)
    decode_runner = _runner(jetspec_registered, width=1, mode=ForwardMode.DECODE, hidden=CaptureHiddenMode.NULL)
    # SGLang's own check would replay roots on the verify graph; the plain decode graph holds no tap rows
    assert runner_cls.can_run_graph(verify_runner, _batch(ForwardMode.DECODE)) is False
    assert runner_cls.can_run_graph(decode_runner, _batch(ForwardMode.DECODE, CaptureHiddenMode.FULL)) is False
    assert runner_cls.can_run_graph(decode_runner, _batch(ForwardMode.TARGET_VERIFY)) is False
    seen = []
    original = lambda runner, fb: seen.append(fb) or True  # noqa: E731
    verify, decode = _batch(ForwardMode.TARGET_VERIFY, CaptureHiddenMode.FULL), _batch(ForwardMode.DECODE)
    assert verify_graphs.around_can_run_graph(original, verify_runner, verify) is True
    assert verify_graphs.around_can_run_graph(original, decode_runner, decode) is True
    assert seen == [verify, decode]  # then SGLang's own checks (batch size, width)


class FakeGraphRunner:
    def __init__(self, model_runner, attn_backend, speculative_num_draft_tokens=None):
        self.attn_backend, self.width = attn_backend, speculative_num_draft_tokens
        self.algorithm = model_runner.spec_algorithm  # what the runner saw while it captured
        self.capture_bs = [1, 2, 4]


def test_one_runner_and_backend_per_lower_width_a_plain_decode_graph_and_sglangs_own_for_the_top(
    monkeypatch, jetspec_registered
):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    resolved_at_build = []

    @contextmanager
    def resolved(**fields):  # SGLang's resolved leaves while a graph's pieces are built (checked below)
        resolved_at_build.append(fields)
        yield

    monkeypatch.setattr(verify_graphs, "resolved", resolved)
    backends = iter(range(100))
    top_backend, top_runner = object(), object()
    model_runner = SimpleNamespace(
        spec_algorithm=jetspec_registered,
        attn_backend=top_backend,
        decode_cuda_graph_runner=top_runner,
        _get_attention_backend=lambda init_new_workspace: ("backend", next(backends)),
    )
    free = iter([10.0, 9.5, 9.5, 9.25, 9.25, 9.0])
    graphs = VerifyGraphs.capture(model_runner, (4, 8, 16), runner_cls=FakeGraphRunner, free_gb=lambda: next(free))
    assert resolved_at_build == [
        {"speculative_num_draft_tokens": 4},
        {"speculative_num_draft_tokens": 8},
        {"return_hidden_states_mode": "full"},  # the decode graph returns the tap rows of roots that keep drafting
    ]
    assert sorted(graphs.by_width) == [1, 4, 8, 16]
    assert [graphs.by_width[w].graph_runner.width for w in (1, 4, 8)] == [None, 4, 8]
    assert graphs.by_width[16].graph_runner is top_runner  # SGLang's own capture serves the top rung
    # the plain decode graph captured as for a server without speculation, the verify graphs as JETSPEC's
    assert graphs.by_width[1].graph_runner.algorithm == SpeculativeAlgorithm.NONE
    assert graphs.by_width[4].graph_runner.algorithm is jetspec_registered
    assert model_runner.spec_algorithm is jetspec_registered  # restored
    backends_used = [graphs.by_width[w].attn_backend for w in (1, 4, 8)]
    assert len(set(backends_used)) == 3 and top_backend not in backends_used  # a backend's graph state is one runner's
    assert [graphs.by_width[w].memory_gb for w in (4, 8, 1)] == [0.5, 0.25, 0.25]
    assert graphs.select(8) is True
    assert (model_runner.attn_backend, model_runner.decode_cuda_graph_runner) == (
        graphs.by_width[8].attn_backend,
        graphs.by_width[8].graph_runner,
    )
    assert graphs.select(1) is True and model_runner.decode_cuda_graph_runner is graphs.by_width[1].graph_runner
    assert graphs.select(5) is False  # no graph for that width: SGLang's own backend, run eager
    assert (model_runner.attn_backend, model_runner.decode_cuda_graph_runner) == (top_backend, top_runner)


def test_the_leaves_a_graph_is_built_under_are_sglangs_and_come_back():
    """`resolved` on SGLang's published configuration (a subprocess: it changes process-wide state): the
    width and hidden-state mode SGLang's runner reads while it captures, restored afterwards."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from harness.sglang_cpu import HEAD
    from sglang_jetspec.models.fetch import fetch

    code = f"""
import json
from importlib.metadata import entry_points
from sglang.srt.server_args import prepare_server_args
from sglang.srt.runtime_context import get_context, get_spec
from sglang.srt.model_executor.forward_batch_info import get_server_return_hidden_states_mode
(ep,) = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "jetspec"]
ep.load()()
from sglang_jetspec.adapter.verify_graphs import resolved
args = prepare_server_args(["--model-path", {str(fetch("smollm2"))!r}, "--speculative-algorithm", "JETSPEC",
    "--speculative-draft-model-path", {str(HEAD)!r}, "--attention-backend", "triton", "--device", "cuda",
    "--disable-overlap-schedule"])
args.resolve_once()
get_context().set_server_args(args)
read = lambda: [get_spec().speculative_num_draft_tokens, int(get_server_return_hidden_states_mode())]
before = read()
with resolved(speculative_num_draft_tokens=8, return_hidden_states_mode="full"):
    inside = read()
print(json.dumps([before, inside, read()]))
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "JETSPEC_VERIFY_WIDTHS": "4,8,16,32,64"},
        cwd=Path(__file__).resolve().parents[2],
    )
    before, inside, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == after == [64, int(CaptureHiddenMode.NULL)]  # the packaged policy's largest budget
    assert inside == [8, int(CaptureHiddenMode.FULL)]
