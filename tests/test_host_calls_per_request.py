"""The host side of a step's draft, verify inputs and acceptance costs a few torch calls per request, not
dozens (issue 56): each call is host work a GPU step waits on, and a per-request loop of tensor ops grows
a step's host time with the batch. Counted with a torch function mode on host data (the device-op and
sync counts are tests/test_step_probe.py's and the stand-in server's)."""

from __future__ import annotations

import math
import random
from collections import Counter
from types import SimpleNamespace

import torch
from torch.overrides import TorchFunctionMode

from sglang_jetspec.adapter.step_outputs import accept_step
from sglang_jetspec.adapter.verify_inputs import build_verify_tensors
from sglang_jetspec.core.prompt_lookup import LookupMerge
from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.core.tree import TreeSpec, root_only_trees
from sglang_jetspec.core.tree_drafting import draft_trees

VOCAB, DRAFT_VOCAB, DEPTH = 400, 64, 6
SPEC = TreeSpec(budget=12, max_depth=DEPTH, width=4)


class TorchCalls(TorchFunctionMode):
    """Every torch function call (ops, factories, tensor methods, property reads) while entered."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


class FixedHead:
    """Per-lane fixed draft logits over a reduced vocabulary: the head's pass without the head."""

    max_depth = DEPTH

    def __init__(self, batch: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.draft_vocab = torch.randperm(VOCAB, generator=generator)[:DRAFT_VOCAB]
        self.logits = torch.randn(batch, DEPTH, DRAFT_VOCAB, generator=generator) * 3

    def propose(self, lanes: list, depth: int) -> torch.Tensor:
        return self.logits[: len(lanes), :depth]


def repetitive_text(rng: random.Random, length: int) -> list[int]:
    """Text that repeats phrases, so every request's own lookups find guesses."""
    phrases = [[rng.randrange(VOCAB) for _ in range(rng.randrange(3, 8))] for _ in range(6)]
    text: list[int] = []
    while len(text) < length:
        text += rng.choice(phrases)
    return text[-length:]


def calls_per_phase(batch: int, sampled: bool) -> tuple[Counter, int]:
    rng = random.Random(batch)
    lanes = [
        SimpleNamespace(root_token=c[-1], committed_ids=c) for c in (repetitive_text(rng, 120) for _ in range(batch))
    ]
    head = FixedHead(batch)
    params = [SamplingParams(temperature=0.8) if sampled else SamplingParams() for _ in lanes]
    generators = [torch.Generator().manual_seed(b) for b in range(batch)]
    counts = Counter()
    with TorchCalls() as mode:
        trees, _ = draft_trees(head, lanes, SPEC, lookup=LookupMerge(math.log(0.6)))
        counts["draft"] = mode.calls
        width = max(tree.size for tree in trees)
        build_verify_tensors(trees, [len(lane.committed_ids) for lane in lanes], width)
        counts["verify inputs"] = mode.calls - sum(counts.values())
        logits = torch.randn(batch * width, VOCAB, generator=torch.Generator().manual_seed(1))
        accept_step(trees, logits, width, params, generators)
        counts["accept"] = mode.calls - sum(counts.values())
    return counts, sum(tree.size > 1 for tree in trees)


def test_each_request_adds_a_few_torch_calls_to_the_draft_and_none_to_verify_inputs_or_greedy_acceptance():
    one, _ = calls_per_phase(1, sampled=False)
    many, drafted = calls_per_phase(16, sampled=False)
    assert drafted == 16  # every lane drafted a tree with guesses merged: the counts mean something
    per_request = {phase: (many[phase] - one[phase]) / 15 for phase in one}
    # a tree is three tensors (DraftTree.from_lists); the rest is a fixed number of ops for the batch
    assert per_request["draft"] <= 3, per_request
    assert per_request["verify inputs"] <= 0.5, per_request
    assert per_request["accept"] <= 0.5, per_request


def test_a_sampled_request_adds_only_its_own_random_draws_to_acceptance():
    one, _ = calls_per_phase(1, sampled=True)
    many, _ = calls_per_phase(16, sampled=True)
    # each request draws its uniforms from its own generator (a seed reproduces it whatever its batch)
    assert (many["accept"] - one["accept"]) / 15 <= 2, (one, many)  # its draw and where it lands


def test_a_gated_off_steps_trees_cost_no_torch_call_per_request():
    """Speculation off: every request's tree is its root alone, built for the batch at once (root_only_trees),
    and greedy acceptance of roots stays on the device."""
    calls = {}
    for batch in (1, 16):
        with TorchCalls() as mode:
            trees = root_only_trees(list(range(batch)))
            accept_step(trees, torch.zeros(batch, VOCAB), 1, [SamplingParams()] * batch, [None] * batch)
        calls[batch] = mode.calls
        assert [tree.tokens.tolist() for tree in trees] == [[b] for b in range(batch)]
        assert [(tree.size, tree.max_depth, tree.parents.tolist()) for tree in trees] == [(1, 0, [-1])] * batch
    assert calls[16] == calls[1], calls  # a tree a request built on its own was 6 calls (110 against 20)
