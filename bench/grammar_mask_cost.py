"""What a constrained request adds to a JETSPEC step: the grammar walk over its draft tree (prune before
the verify, one bitmask row per kept node) and the mask applied to the verify logits, in ms per request
per step, by tree size. SGLang's xgrammar backend and SmolLM2's tokenizer; breadth-first trees of
width 8 after a prefix that ends inside a JSON string, where nearly every token is allowed: the walk
visits and keeps every node, the most it can cost.

    python bench/grammar_mask_cost.py --markdown bench/results/structured/grammar-mask-cost.md
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "unit", "days"],
}
PREFIX = '{"city": "Lis'


def _allowed(grammar, vocab: int) -> list[int]:
    row = grammar.allocate_vocab_mask(vocab_size=vocab, batch_size=1, device="cpu")
    grammar.fill_vocab_mask(row, 0)
    bits = ((row[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten()[:vocab]
    return bits.nonzero().flatten().tolist()


def tree_of(size: int, width: int, allowed: list[int], vocab: int, rng: random.Random):
    """A breadth-first tree of `size` nodes, `width` children per node: half of them tokens allowed at the
    root, half random ones."""
    from sglang_jetspec.core.tree import DraftTree

    tokens, parents, depths = [0], [-1], [0]
    node = 0
    while len(tokens) < size:
        for rank in range(width):
            if len(tokens) == size:
                break
            tokens.append(rng.choice(allowed) if rank < width // 2 else rng.randrange(vocab))
            parents.append(node)
            depths.append(depths[node] + 1)
        node += 1
    n = len(tokens)
    return DraftTree(
        torch.tensor(tokens),
        torch.tensor(parents),
        torch.tensor(depths),
        torch.zeros(n, dtype=torch.long),
        torch.zeros(n),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4,8,16,32,64")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--markdown", type=Path, required=True)
    args = p.parse_args(argv)

    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend
    from transformers import AutoTokenizer

    from sglang_jetspec.adapter.tree_grammar import TreeGrammar
    from sglang_jetspec.models.fetch import fetch
    from sglang_jetspec.reference.precision import cpu_model

    torch.set_num_threads(1)
    model = fetch("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(model)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    backend = XGrammarGrammarBackend(tokenizer, vocab_size=vocab, model_eos_token_ids=[tokenizer.eos_token_id])
    grammar = backend.dispatch_json(json.dumps(SCHEMA))
    for token in tokenizer(PREFIX, add_special_tokens=False)["input_ids"]:
        grammar.accept_token(token)
    allowed = _allowed(grammar, vocab)
    rng = random.Random(0)
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        tree = tree_of(size, 8, allowed, vocab, rng)
        logits = torch.randn(size, vocab)
        walk, apply, kept = [], [], 0
        for _ in range(args.repeats):
            start = time.perf_counter()
            tg = TreeGrammar([grammar], vocab)
            pruned = tg.prune(0, tree)
            mask = tg.mask([pruned], size, "cpu")
            mid = time.perf_counter()
            mask.apply(logits)
            walk.append(mid - start)
            apply.append(time.perf_counter() - mid)
            kept = pruned.size
        rows.append((size, kept, 1000 * sorted(walk)[len(walk) // 2], 1000 * sorted(apply)[len(apply) // 2]))
    lines = [
        f"# Grammar mask cost per constrained request per step ({cpu_model()}, 1 thread)",
        "",
        f"`python -m bench.grammar_mask_cost {' '.join(sys.argv[1:] if argv is None else argv)}`",
        "",
        f"JSON schema `{json.dumps(SCHEMA)}` after `{PREFIX}`; SmolLM2 vocabulary {vocab}; median of {args.repeats}.",
        "",
        "| tree nodes | kept after pruning | walk + prune + rows (ms) | mask applied to the verify logits (ms) |",
        "|---|---|---|---|",
    ]
    lines += [f"| {size} | {kept} | {walk:.2f} | {apply:.3f} |" for size, kept, walk, apply in rows]
    text = "\n".join(lines) + "\n"
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
