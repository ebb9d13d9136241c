"""adapter/tree_grammar.py with SGLang's own xgrammar backend and SmolLM2's tokenizer: every kept node's
mask row is bitwise the mask a fresh matcher gives after the committed tokens and the node's own path;
forbidden nodes go with their subtrees; the request's matcher ends where it started."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("sglang")

from sglang_jetspec.adapter.tree_grammar import TreeGrammar, allowed_by_parent  # noqa: E402
from sglang_jetspec.core.tree import DraftTree  # noqa: E402

SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
)


@pytest.fixture(scope="module")
def backend(xgrammar_backend):
    return xgrammar_backend


def _reference_row(backend, committed: list[int], path: list[int]) -> torch.Tensor:
    """The mask a plain decode uses after `committed` + `path`, from a fresh matcher."""
    grammar = backend.dispatch_json(SCHEMA)
    for token in committed + path:
        grammar.accept_token(token)
    row = grammar.allocate_vocab_mask(vocab_size=backend.vocab_size, batch_size=1, device="cpu")
    grammar.fill_vocab_mask(row, 0)
    return row[0]


def _allowed(row: torch.Tensor, vocab: int) -> list[int]:
    bits = ((row.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:vocab]
    return bits.nonzero().flatten().tolist()


def _mixed_tree(backend, committed: list[int], depth: int = 3) -> DraftTree:
    """Breadth-first: every allowed node gets two allowed children and one forbidden one, and the first
    forbidden node also gets an allowed-looking child (which must go with its parent)."""
    tokens, parents, depths, paths = [committed[-1]], [-1], [0], [[]]
    level = [0]
    for d in range(1, depth + 1):
        nxt = []
        for node in level:
            allowed = _allowed(_reference_row(backend, committed, paths[node]), backend.vocab_size)
            forbidden = next(t for t in range(backend.vocab_size) if t not in set(allowed))
            for token, ok in ((allowed[0], True), (forbidden, False), (allowed[-1], True)):
                tokens.append(token), parents.append(node), depths.append(d), paths.append(paths[node] + [token])
                if ok:
                    nxt.append(len(tokens) - 1)
        if d == 1:  # a child of the forbidden depth-1 node
            bad = parents.index(0) + 1
            tokens.append(tokens[1]), parents.append(bad), depths.append(2), paths.append(paths[bad] + [tokens[1]])
        level = nxt
    n = len(tokens)
    order = sorted(range(n), key=lambda i: depths[i])  # parents precede children
    renumber = {old: new for new, old in enumerate(order)}
    return DraftTree(
        torch.tensor([tokens[i] for i in order]),
        torch.tensor([-1 if parents[i] < 0 else renumber[parents[i]] for i in order]),
        torch.tensor([depths[i] for i in order]),
        torch.zeros(n, dtype=torch.long),
        torch.zeros(n),
    )


def test_kept_rows_equal_a_fresh_matchers_after_each_path_and_forbidden_nodes_go(backend, smollm2):
    committed = smollm2.tokenizer('{"name": "', add_special_tokens=False)["input_ids"]
    grammar = backend.dispatch_json(SCHEMA)
    for token in committed:
        grammar.accept_token(token)
    tree = _mixed_tree(backend, committed)
    before = list(grammar.accepted_tokens)

    tg = TreeGrammar([grammar], backend.vocab_size)
    pruned = tg.prune(0, tree)
    assert grammar.accepted_tokens == before and not grammar.is_terminated()  # the walk rolled back
    paths = pruned.token_paths()
    all_paths = set(tree.token_paths())
    # every kept node is allowed after its parent's path; every dropped path had a forbidden token on it
    for path in paths[1:]:
        assert int(path[-1]) in _allowed(_reference_row(backend, committed, list(path[:-1])), backend.vocab_size)
    dropped = all_paths - set(paths)
    assert len(dropped) >= 4 and pruned.size + len(dropped) == tree.size
    for path in dropped:
        assert any(
            path[i] not in _allowed(_reference_row(backend, committed, list(path[:i])), backend.vocab_size)
            for i in range(len(path))
        )

    assert tg.root_allowed(0).nonzero().flatten().tolist() == _allowed(
        _reference_row(backend, committed, []), backend.vocab_size
    )
    mask = tg.mask([pruned], pruned.size + 2, "cpu")  # two padding rows
    rows = mask.vocab_mask
    for node, path in enumerate(paths):
        assert rows[node].equal(_reference_row(backend, committed, list(path))), path
    assert (rows[pruned.size :] == -1).all()
    assert grammar.accepted_tokens == before


def test_masks_are_lane_major_free_text_lanes_unmasked_and_a_cut_tree_reuses_its_walk(backend, smollm2, monkeypatch):
    committed = smollm2.tokenizer('{"name": "Al", "age": ', add_special_tokens=False)["input_ids"]
    grammar = backend.dispatch_json(SCHEMA)
    for token in committed:
        grammar.accept_token(token)
    tree = _mixed_tree(backend, committed, depth=2)
    free = DraftTree(
        torch.tensor([5, 6]),
        torch.tensor([-1, 0]),
        torch.tensor([0, 1]),
        torch.zeros(2, dtype=torch.long),
        torch.zeros(2),
    )
    tg = TreeGrammar([None, grammar], backend.vocab_size)
    assert tg.prune(0, free) is free
    pruned = tg.prune(1, tree)
    walks = []
    monkeypatch.setattr(TreeGrammar, "_walk", lambda self, lane, t: walks.append(lane))
    cut = DraftTree(pruned.tokens[:3], pruned.parents[:3], pruned.depths[:3], pruned.ranks[:3], pruned.cum_logprobs[:3])
    rows = tg.mask([free, cut], 4, "cpu").vocab_mask
    assert not walks  # tree sizing keeps a prefix: the rows of the walk serve it
    assert rows.shape[0] == 8 and (rows[:4] == -1).all() and (rows[7] == -1).all()
    paths = cut.token_paths()
    for node in range(3):
        assert rows[4 + node].equal(_reference_row(backend, committed, list(paths[node])))


def test_allowed_by_parent_reads_the_parents_row_bit():
    rows = torch.zeros(3, 2, dtype=torch.int32)
    rows[0, 1] = -(1 << 31)  # node 0 allows token 63 only (the sign bit of word 1)
    rows[1, 0] = 1 << 5  # node 1 allows token 5
    tree = DraftTree(
        torch.tensor([0, 63, 5]),
        torch.tensor([-1, 0, 1]),
        torch.tensor([0, 1, 2]),
        torch.zeros(3, dtype=torch.long),
        torch.zeros(3),
    )
    assert allowed_by_parent(rows, tree) == [True, True, True]
    tree.tokens[2] = 6
    assert allowed_by_parent(rows, tree) == [True, True, False]


def test_forced_tokens_spell_what_the_grammar_forces_and_the_matcher_takes_them(backend, smollm2):
    """After `{"na` the schema forces the rest of the key (`me"`): its tokens but the last (the target
    may spell across the end of the forced text) are what the grammar takes next, one by one, and the
    matcher ends where it started. Free text and a grammar with a free choice next force nothing."""
    tokenizer = smollm2.tokenizer
    grammar = backend.dispatch_json(SCHEMA)
    for token in tokenizer('{"na', add_special_tokens=False)["input_ids"]:
        grammar.accept_token(token)
    before = list(grammar.accepted_tokens)
    tg = TreeGrammar([None, grammar], backend.vocab_size)
    forced = tg.forced_tokens(1, tokenizer)
    text, _ = grammar.jump_forward_str_state(grammar.try_jump_forward(tokenizer))
    assert text.startswith('me"') and forced == tokenizer.encode(text, add_special_tokens=False)[:-1]
    assert forced and grammar.accepted_tokens == before
    for token in forced:  # every forced token is one the grammar takes at its place
        grammar.accept_token(token)
    grammar.rollback(len(forced))
    assert tg.forced_tokens(0, tokenizer) == [] and tg.forced_tokens(1, None) == []

    free_choice = backend.dispatch_json(SCHEMA)
    for token in tokenizer('{"name": "', add_special_tokens=False)["input_ids"]:
        free_choice.accept_token(token)  # inside a string value: anything may come
    assert TreeGrammar([free_choice], backend.vocab_size).forced_tokens(0, tokenizer) == []
