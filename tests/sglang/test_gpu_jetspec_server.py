"""On a GPU: a real `--speculative-algorithm JETSPEC` server against a plain one (skipped without CUDA).

Uses bench/gpu/sglang_compare.py's Server helper on SmolLM2 with the shipped head: greedy outputs of
a few HumanEval prompts must match the plain server's, with drafts actually accepted."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("sglang_compare", ROOT / "bench" / "gpu" / "sglang_compare.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_jetspec_server_greedy_matches_plain_and_accepts_drafts(smollm2_dir, head_dir, tmp_path):
    from sglang_jetspec.reference.prompts import humaneval_prompts

    bench = _bench()
    prompts = humaneval_prompts(range(8))
    base = ["--model-path", str(smollm2_dir), "--dtype", "float32", *bench.COMMON, *bench.SYNC]
    outputs = {}
    for name, extra in {
        "plain": [],
        "jetspec": ["--speculative-algorithm", "JETSPEC", "--speculative-draft-model-path", str(head_dir)],
    }.items():
        server = bench.Server(name, base + extra, 31500, tmp_path)
        try:
            server.wait_ready()
            outputs[name] = [server.generate(p, 64, logprobs=name == "plain") for p in prompts]
        finally:
            server.stop()
    rows = bench.identity_rows(
        [bench.output_ids(r) for r in outputs["plain"]],
        [bench.output_ids(r) for r in outputs["jetspec"]],
        [bench.top_logprob_maps(r) for r in outputs["plain"]],
    )
    assert all(r.exact for r in rows), [r for r in rows if not r.exact]  # fp32: no numerics excuse
    accept = [r["meta_info"]["spec_accept_length"] for r in outputs["jetspec"]]
    assert max(accept) > 1.0, accept
