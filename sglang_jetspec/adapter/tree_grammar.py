"""Constrained decoding (json_schema / regex / ebnf / structural_tag) on draft trees, with the grammar
objects SGLang built for each request.

A node's verify row must be masked to the tokens the request's grammar allows after the node's own
path, as a plain decode at that position would mask it. The walk is SGLang's `traverse_tree` (what its
EAGLE and NGRAM verifies use) on Python ints rather than per-node tensor reads: on the request's
matcher, accept the node's token, fill the node's bitmask row, descend, roll back; the matcher ends
where it started. One walk per request
serves twice (and the head's first depth is masked to what the grammar allows next, so no root child
is wasted):
- before the verify, a node whose token its parent's row forbids can never be accepted: it is pruned
  with its subtree, so the verify never pays for it (a tree with drawn children keeps every node: its
  acceptance reads the draw order, and a forbidden node is rejected there with probability 1);
- after the verify, the kept nodes' rows mask the logits before acceptance, greedy and sampled alike.
Where the grammar forces the next characters (a key of the schema, the rest of an enum value: what
SGLang's jump-forward would insert), their tokens join the draft as a chain (`forced_tokens`); the
walk prunes any the grammar does not take, so a forced chain never costs acceptance anything.
After acceptance SGLang's result processor advances the matcher over the committed tokens and cuts
them at the grammar's end, exactly as for its own speculative workers.
A batch without a constrained request builds nothing here.
"""

from __future__ import annotations

import torch
from sglang.srt.constrained.base_grammar_backend import GrammarMask

from sglang_jetspec.core.tree import DraftTree, kept_nodes


def allowed_by_parent(rows: torch.Tensor, tree: DraftTree) -> list[bool]:
    """Whether each node's token is set in its parent's bitmask row (rows: [N, ceil(V/32)] int32); the
    root is always allowed. A node below a forbidden or finished one reads an unwritten row (all set):
    kept_nodes drops it with its ancestor."""
    tokens, parents = tree.tokens[1:], tree.parents[1:]
    words = rows[parents, tokens // 32]
    bits = (words >> (tokens % 32).to(words.dtype)) & 1
    return [True] + bits.bool().tolist()


def unpacked(row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V] bool from one packed bitmask row (bit t % 32 of word t // 32)."""
    bits = (row.unsqueeze(-1) >> torch.arange(32, dtype=row.dtype)) & 1
    return bits.flatten()[:vocab_size].bool()


class TreeGrammar:
    """One verify step's grammar work for a batch holding constrained requests (lanes in batch order)."""

    def __init__(self, grammars: list, vocab_size: int) -> None:
        self.grammars = grammars  # each request's grammar object, None for free text
        self.vocab_size = vocab_size
        self._walked: dict[int, tuple[DraftTree, torch.Tensor]] = {}  # lane -> (tree, its rows)

    @classmethod
    def of_batch(cls, batch) -> TreeGrammar | None:
        if not batch.has_grammar:
            return None
        return cls([req.grammar for req in batch.reqs], batch.sampling_info.vocab_size)

    def root_allowed(self, lane: int) -> torch.Tensor | None:
        """[V] bool: the tokens lane's grammar allows next, for masking the head's first depth (None
        for free text and for a grammar that has ended)."""
        grammar = self.grammars[lane]
        if grammar is None or grammar.is_terminated():
            return None
        row = grammar.allocate_vocab_mask(vocab_size=self.vocab_size, batch_size=1, device="cpu")
        grammar.fill_vocab_mask(row, 0)
        return unpacked(row[0], self.vocab_size)

    def forced_tokens(self, lane: int, tokenizer) -> list[int]:
        """The tokens of the text lane's grammar forces next (its jump-forward string, as the tokenizer
        spells it on its own); [] for free text, a finished grammar, or nothing forced."""
        grammar = self.grammars[lane]
        if grammar is None or tokenizer is None or grammar.is_terminated():
            return []
        helper = grammar.try_jump_forward(tokenizer)
        if helper is None:
            return []
        text, _ = grammar.jump_forward_str_state(helper)
        # the last token stops where the forced text stops; the target spells across that boundary
        # (`city"` then `:` comes out as `city` `":`), so only the tokens before it are sure
        return tokenizer.encode(text, add_special_tokens=False)[:-1] if text else []

    def _walk(self, lane: int, tree: DraftTree) -> torch.Tensor:
        """Every reachable node's row (unreached rows stay all set). A child is entered only when its
        token is set in its node's row; a finished grammar fills nothing and is not descended."""
        grammar, vocab = self.grammars[lane], self.vocab_size
        rows = grammar.allocate_vocab_mask(vocab_size=vocab, batch_size=tree.size, device="cpu")
        words = rows.numpy()  # rows' own memory: the bit tests read what fill_vocab_mask wrote
        tokens, kids = tree.tokens.tolist(), tree.children()

        def visit(node: int) -> None:
            if grammar.is_terminated():
                return
            grammar.fill_vocab_mask(rows, node)
            for child in kids[node]:
                token = tokens[child]
                if token < vocab and (int(words[node, token >> 5]) >> (token & 31)) & 1:
                    grammar.accept_token(token)
                    visit(child)
                    grammar.rollback(1)

        visit(0)
        self._walked[lane] = (tree, rows)
        return rows

    def prune(self, lane: int, tree: DraftTree) -> DraftTree:
        """Lane's tree without the nodes its grammar forbids."""
        if self.grammars[lane] is None or tree.size == 1:
            return tree
        rows = self._walk(lane, tree)
        if tree.drawn is not None:
            return tree
        pruned, index = kept_nodes(tree, allowed_by_parent(rows, tree))
        self._walked[lane] = (pruned, rows[index])
        return pruned

    def _rows(self, lane: int, tree: DraftTree) -> torch.Tensor:
        """Lane's rows for `tree`: from its walk when `tree` is a prefix of the walked tree (tree sizing
        keeps prefixes), else from a walk now."""
        walked = self._walked.get(lane)
        if walked is not None:
            seen, rows = walked
            n = tree.size
            if n <= seen.size and seen.tokens[:n].equal(tree.tokens) and seen.parents[:n].equal(tree.parents):
                return rows[:n]
        return self._walk(lane, tree)

    def mask(self, trees: list[DraftTree], num_nodes: int, device) -> GrammarMask | None:
        """The bitmask of the verify rows ([bs * num_nodes, ceil(V/32)], lane-major; free-text lanes and
        padding rows all set), ready to apply to the logits."""
        lanes = [b for b, grammar in enumerate(self.grammars) if grammar is not None]
        if not lanes:
            return None
        some = self.grammars[lanes[0]]
        bitmask = some.allocate_vocab_mask(vocab_size=self.vocab_size, batch_size=len(trees) * num_nodes, device="cpu")
        for b in lanes:
            rows = self._rows(b, trees[b])
            bitmask[b * num_nodes : b * num_nodes + trees[b].size] = rows
        return GrammarMask(some, bitmask.to(device, non_blocking=True))
