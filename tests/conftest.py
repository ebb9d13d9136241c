"""Shared fixtures: the real SmolLM2 target (fetched once into the cache) and small heads for it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REAL_SGLANG = Path(__file__).parent / "sglang_cpu"
# Real-SGLang files that start only servers of their own (no session server): they run last, as a group of
# their own, on whichever worker the unit tests leave free first (see pytest_xdist_make_scheduler). The
# useless-head file joined the TP file there (2026-12-03): it took 5 of the group's 43 minutes on a Zen 3.
REAL_SGLANG_TAIL = tuple(REAL_SGLANG / f"test_real_sglang_{name}.py" for name in ("same_allocation", "tp"))


def pytest_configure(config):
    # The long sweeps marked slow repeat checks that faster tests of the default run already make:
    # `python -m pytest` leaves them out unless a -m expression asks (`python -m pytest -m slow`).
    if not config.option.markexpr:
        config.option.markexpr = "not slow"
    # Two test workers (pytest-xdist, pyproject's addopts) share two cores: one torch thread each, or
    # their thread pools stall each other several-fold.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


def _real_sglang(item) -> bool:
    return REAL_SGLANG in Path(item.path).parents


def pytest_collection_modifyitems(config, items):
    # The real-SGLang tests on the session's servers first: they are the longest stretch; the tail's
    # files last (see pytest_xdist_make_scheduler).
    tail = [item for item in items if Path(item.path) in REAL_SGLANG_TAIL]
    real = [item for item in items if _real_sglang(item) and item not in tail]
    chosen = set(real) | set(tail)
    items[:] = real + [item for item in items if item not in chosen] + tail
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# CI budget, 40 min: on a 2-core AMD EPYC (Zen 3, 2026-12-03) the whole suite took 43.1 minutes with only
# the TP file in the tail, 41.4 with the useless-head file beside it, and 37.5 once test servers ran one
# OpenMP thread each (tests/sglang_cpu/conftest.py): the real-SGLang group 34.4, the unit tests 25.5 then
# the tail 11.2 on the other worker, the CPU 96% busy. TODO(CI budget): not yet timed on an Intel Xeon.
# Splitting the group over both workers from the start was slower (two real-server groups contend for two
# cores the whole run, and shared servers launch twice) and made timing-sensitive tests fail; so only files
# with servers of their own (REAL_SGLANG_TAIL) leave the group, and they run after the unit tests, on the
# worker those free.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """One worker runs the real-SGLang tests on the session's shared servers, in order; the other worker
    takes the unit tests, then the tail's files (REAL_SGLANG_TAIL), one group. (xdist's own xdist_group
    marks rename node ids, which pytest 9 no longer lets a plugin do: they group nothing.)"""
    from xdist.scheduler import LoadScopeScheduling

    def relative(path: Path) -> str:  # node ids are rootdir-relative
        return Path(os.path.relpath(path, config.rootpath)).as_posix()

    prefix, tail = f"{relative(REAL_SGLANG)}/", tuple(f"{relative(path)}::" for path in REAL_SGLANG_TAIL)

    class RealServersTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(tail):
                return "real-sglang-tail"
            return "real-sglang-servers" if nodeid.startswith(prefix) else nodeid

    # groups are handed out in collection order (pytest_collection_modifyitems), not largest first
    config.option.loadscopereorder = False
    return RealServersTogether(config, log)


@pytest.fixture(scope="session")
def smollm2_dir():
    from sglang_jetspec.models.fetch import fetch

    return fetch("smollm2")


@pytest.fixture
def jetspec_report(tmp_path, smollm2_dir):
    """Runs `jetspec COMMAND --target <SmolLM2> FLAGS --json FILE` (exit code 0) and returns the JSON
    report it wrote."""
    import json

    from sglang_jetspec.cli import main

    def run(command: str, *flags: str) -> dict:
        out = tmp_path / f"{command}.json"
        assert main([command, "--target", str(smollm2_dir), *flags, "--json", str(out)]) == 0
        return json.loads(out.read_text())

    return run


@pytest.fixture
def code_prompt_file(tmp_path):
    """A prompts.jsonl of one code prompt that sets a pattern to continue (def add, def sub, ...)."""
    import json

    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"}) + "\n")
    return path


@pytest.fixture(scope="session")
def smollm2(smollm2_dir):
    from sglang_jetspec.reference.target import TargetModel

    return TargetModel(smollm2_dir, dtype=torch.float32)


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory, smollm2_dir):
    """A 6-layer, 64-wide random Llama with SmolLM2's tokenizer: training and data code at test speed.
    A large init makes its next-token distributions peaked, so a head has something to learn."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.builders import TINY_TARGET_MODEL, save_tiny_target

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_TARGET_MODEL, initializer_range=0.5))
    return save_tiny_target(model, tmp_path_factory.mktemp("tiny-llama"), smollm2_dir)


@pytest.fixture(scope="session")
def untrained_drafter(smollm2):
    """A randomly initialised 1-layer head for SmolLM2 (seed 0), wrapped as a drafter."""
    from sglang_jetspec.reference.loading import load_drafter

    return load_drafter(smollm2, "untrained")[0]


@pytest.fixture()
def single_thread():
    """torch on one CPU thread for this test, the process-wide count restored after. On a busy shared
    CPU two torch threads stall each other several-fold."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def repetitive_requests(smollm2, single_thread):
    """Two SmolLM2 prompts that repeat themselves (prompt lookup finds their continuations), 32 greedy
    tokens each, and their autoregressive output ids (on one thread, as the test that uses them runs)."""
    from sglang_jetspec.core.sampling import SamplingParams
    from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine, Request

    prompts = [
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
        "1, 2, 3, 4, 1, 2, 3, 4, 1, 2,",
    ]
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    requests = [Request(smollm2.tokenizer(p)["input_ids"], params, str(i)) for i, p in enumerate(prompts)]
    autoregressive = ReferenceEngine(smollm2, None, EngineConfig(max_batch_size=2)).generate(requests, budget=0)
    return requests, [o.output_ids for o in autoregressive]


@pytest.fixture(scope="session")
def reveal_drafter(smollm2):
    """The shipped head's weights flagged as prefix-reveal trained (dflash_config.draft_reveal), so
    tree-causal rounds run: its conditioned drafts are real (accepts vary) though it never saw revealed
    tokens in training. For losslessness and replay-exactness tests, not for accept-length claims."""
    from dataclasses import replace

    from sglang_jetspec.reference.loading import load_drafter

    drafter, _ = load_drafter(smollm2, None)
    drafter.head.config = replace(drafter.head.config, draft_reveal={"scheme": "prefix", "all_mask_share": 0.5})
    return drafter
