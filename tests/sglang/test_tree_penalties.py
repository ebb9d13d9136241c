"""Tree-verify penalties (adapter/tree_penalties.py) against SGLang's own penalizers run the way a
plain decode runs them: for every node, the orchestrator fed the output tokens and then the node's
path one token at a time, its additive row summed, then the scaling. Bit-identical, or the test
fails; SGLang's relaxed per-step penalties (today's speculative path) must fail the same check."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.sampling import penaltylib  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams as SGLangParams  # noqa: E402

from sglang_jetspec.adapter.tree_penalties import (
    RequestPenalties,
    apply_logit_bias,
    apply_tree_penalties,  # noqa: E402
    request_penalties,
)
from sglang_jetspec.core.tree import DraftTree  # noqa: E402

VOCAB, EOS = 24, 2
PENALIZERS = {
    penaltylib.BatchedFrequencyPenalizer,
    penaltylib.BatchedMinNewTokensPenalizer,
    penaltylib.BatchedPresencePenalizer,
    penaltylib.BatchedRepetitionPenalizer,
}


class _Batch:  # what the penalizers read of a ScheduleBatch (held by weak reference)
    def __init__(self, reqs):
        self.reqs, self.device = reqs, "cpu"


def _req(**sampling):
    return SimpleNamespace(
        sampling_params=SGLangParams(max_new_tokens=64, **sampling),
        eos_token_ids={EOS},
        tokenizer=SimpleNamespace(additional_stop_token_ids=None, eos_token_id=EOS),
    )


def _plain_row(logits_row: torch.Tensor, req, tokens_before: list[int]) -> torch.Tensor:
    """A plain SGLang decode's penalised row after `tokens_before` output tokens: the orchestrator
    fed one token per step (prepare_for_decode), then ScheduleBatch's copy_for_forward sums the
    additive penalizers into a zero row and the sampler adds it and applies the scaling."""
    batch = _Batch([req])
    orchestrator = penaltylib.BatchedPenalizerOrchestrator(VOCAB, batch, PENALIZERS)
    for token in tokens_before:
        orchestrator.cumulate_output_tokens(torch.tensor([token]))
    row = logits_row.clone().unsqueeze(0)
    if orchestrator.is_required:
        additive = torch.zeros(1, VOCAB)
        orchestrator.accumulate_additive_penalties(additive)
        row.add_(additive)
        scaling = orchestrator.accumulate_scaling_penalties()
        if scaling is not None:  # sampling/penaltylib/repetition_penalty.apply_scaling_penalties
            row[:] = torch.where(row < 0, row * scaling, row / scaling)
    return row[0]


def _tree() -> DraftTree:
    """Root, two children, grandchildren repeating tokens of the output and of their own path."""
    tokens = [5, 7, 9, 7, 5, 11, 7, 2, 9]
    parents = [-1, 0, 0, 1, 1, 2, 3, 3, 6]
    depths = [0, 1, 1, 2, 2, 2, 3, 3, 4]
    zeros = torch.zeros(len(tokens), dtype=torch.long)
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths), zeros, zeros.float())


def _path(tree: DraftTree, node: int) -> list[int]:
    parents, tokens, path = tree.parents.tolist(), tree.tokens.tolist(), []
    while node > 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


CASES = [
    dict(frequency_penalty=0.7),
    dict(frequency_penalty=-1.0),
    dict(presence_penalty=1.1),
    dict(repetition_penalty=1.3),
    dict(repetition_penalty=0.8),
    dict(frequency_penalty=0.3, presence_penalty=0.45, repetition_penalty=1.2),
    dict(min_new_tokens=6),
    dict(min_new_tokens=6, frequency_penalty=0.5, stop_token_ids=[13]),
]


@pytest.mark.parametrize("sampling", CASES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_every_node_gets_the_penalties_of_a_plain_decode_at_its_position(sampling):
    torch.manual_seed(0)
    output = [5, 3, 7, 7, 4]  # committed output; its last token is the tree's root
    tree = _tree()
    req = _req(**sampling)
    n, pad = tree.size, 3
    logits = torch.randn(2 * (n + pad), VOCAB) * 4
    untouched = logits.clone()
    pens = [RequestPenalties(), request_penalties(req)]  # request 0 has none: its rows stay as they are
    apply_tree_penalties(logits, pens, [[1, 2, 3], output], [_tree(), tree], n + pad)
    assert torch.equal(logits[: n + pad], untouched[: n + pad])
    rows = logits[n + pad :]
    for node in range(n):
        want = _plain_row(untouched[n + pad + node], req, output + _path(tree, node))
        assert torch.equal(rows[node], want), (node, (rows[node] - want).abs().max())
    if sampling.get("min_new_tokens"):  # the root decodes position 5 (blocked), depth 1 position 6 (free)
        assert rows[0, EOS] == float("-inf") and torch.isfinite(rows[1, EOS])
        if 13 in sampling.get("stop_token_ids", []):
            assert rows[0, 13] == float("-inf") and torch.isfinite(rows[2, 13])


def test_sglang_relaxed_penalties_fail_the_same_check():
    """The negative control: the per-step state repeated over every node (what SGLang's EAGLE/NGRAM do)
    is not what a plain decode applies below the root."""
    req = _req(frequency_penalty=0.7, presence_penalty=0.45)
    tree, output = _tree(), [5, 3, 7, 7, 4]
    logits = torch.randn(tree.size, VOCAB)
    relaxed = torch.stack([_plain_row(row, req, output) for row in logits])  # the root's state on every row
    exact = logits.clone()
    apply_tree_penalties(exact, [request_penalties(req)], [output], [tree], tree.size)
    assert torch.equal(exact[0], relaxed[0])  # the root is the same
    differs = [node for node in range(1, tree.size) if not torch.equal(exact[node], relaxed[node])]
    assert differs == list(range(1, tree.size)), "every node below the root has path tokens to count"


def test_request_penalties_reads_sglangs_stop_set_and_inactive_defaults():
    req = _req(min_new_tokens=4, stop_token_ids=[13, 17])
    req.tokenizer.additional_stop_token_ids = {19}
    pen = request_penalties(req)
    assert pen.stop_ids == (EOS, 13, 17, 19) and pen.min_new_tokens == 4 and pen.active
    assert not request_penalties(_req()).active and not RequestPenalties().active
    assert not request_penalties(SimpleNamespace(sampling_params=SGLangParams(min_new_tokens=3), tokenizer=None)).active


def test_logit_bias_lands_on_every_node_row():
    logits = torch.zeros(2 * 3, 5)
    apply_logit_bias(logits, torch.tensor([[0, 0, 0, 0, -1.0], [0, 2.0, 0, 0, 0]]), num_nodes=3)
    assert (
        logits[:3, 4].tolist() == [-1.0] * 3
        and logits[3:, 1].tolist() == [2.0] * 3
        and logits[3:, 4].tolist() == [0.0] * 3
    )
    apply_logit_bias(logits, None, num_nodes=3)
    assert logits.abs().sum() == 9.0
