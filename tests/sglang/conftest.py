"""Shared, module-scoped SGLang state for the adapter tests: importing SGLang costs seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

HEAD_DIR = Path(__file__).resolve().parents[2] / "sglang_jetspec" / "heads" / "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def jetspec_registered():
    """SGLang's spec registry with the plugin loaded (through the real entry point)."""
    pytest.importorskip("sglang")
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "jetspec"]
    ep.load()()
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.from_string("JETSPEC")


@pytest.fixture(scope="session")
def head_dir() -> Path:
    return HEAD_DIR


@pytest.fixture(scope="session")
def xgrammar_backend(smollm2):
    """SGLang's default grammar backend for SmolLM2, built as its scheduler builds it."""
    pytest.importorskip("sglang")
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

    tok = smollm2.tokenizer
    return XGrammarGrammarBackend(tok, vocab_size=smollm2.info.vocab_size, model_eos_token_ids=[tok.eos_token_id])
