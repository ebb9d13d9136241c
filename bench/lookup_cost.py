"""Host milliseconds of a step's hybrid-drafter lookups (the request's own tokens, the draft corpus, the
finished outputs): per request, as the definition in core/suffix_store.py runs them, against one
`batch_lookup_guesses` for the whole batch (core/batched_lookup.py), by batch size, side by side in one
process. The contexts are HumanEval prompts 100-163 each followed by the first half of a sequence of the
shipped head's draft corpus (text the target wrote), the last `--context-tokens` of that; the stores are
the shipped corpus and a store of finished outputs filled with other corpus sequences. Both give the
same guesses in the same order (tests/test_batched_lookup.py), which this script checks again on every
batch it times. Beside them, the hybrid drafter's draft phase without the head
(`tree_drafting.draft_trees` with the head stubbed by fixed logits over the shipped head's draft
vocabulary): the top-K of the logits (device work on a GPU, computed here), its one copy to the host, the
lookups and every lane's tree with its guesses merged (host work on any device), by batch size.

    python -m bench.lookup_cost --markdown bench/results/sglang_cpu/lookup-cost-fp32-epyc.md
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

from bench.sglang_cpu_compare import positive_ints
from bench.tree_build import _median_ms
from sglang_jetspec.core.draft_vocab import load_draft_vocab
from sglang_jetspec.core.prompt_lookup import (
    OWN_MATCH_FACTOR,
    STORE_FACTOR,
    Guesses,
    LookupMerge,
    batch_lookup_guesses,
    combine_guesses,
    guess_logprob,
    path_guesses,
)
from sglang_jetspec.core.suffix_store import (
    SuffixStore,
    context_continuations,
    corpus_sequences,
    likeliest_paths,
    load_draft_corpus,
)
from sglang_jetspec.core.tree import TreeSpec
from sglang_jetspec.core.tree_drafting import draft_trees
from sglang_jetspec.reference.precision import cpu_model

HEAD_DIR = Path(__file__).resolve().parents[1] / "sglang_jetspec" / "heads" / "smollm2-135m-instruct"
VOCAB = 49152  # SmolLM2's
RECENT_SEQUENCES = 200  # corpus sequences standing in for a serving engine's finished outputs


def per_request_guesses(context: list[int], spec: TreeSpec, merge: LookupMerge) -> Guesses:
    """The hybrid drafter's guesses for one request, one source at a time: the definition the batched
    lookups must equal (and what the engines ran per request before them)."""
    limit = spec.budget - 1
    counts, occurrences, n = context_continuations(context, spec.max_depth, merge.min_ngram, merge.max_ngram)
    guesses: Guesses = {}
    if occurrences:
        own = guess_logprob(merge.logprob, OWN_MATCH_FACTOR[min(n, 4)])
        guesses = path_guesses(likeliest_paths(counts, occurrences, limit), own)
    for store in (merge.corpus, merge.recent):
        if store is not None:
            counts, occurrences = store.continuations(context, spec.max_depth)
            stored = guess_logprob(merge.logprob, STORE_FACTOR)
            combine_guesses(guesses, path_guesses(likeliest_paths(counts, occurrences, limit), stored))
    return guesses


def ordered(guesses: Guesses) -> list:
    """Guesses with their insertion order made part of a comparison (trees are built in that order)."""
    return [(path, list(tokens.items())) for path, tokens in guesses.items()]


def _contexts(count: int, context_tokens: int) -> tuple[list[list[int]], LookupMerge]:
    from transformers import AutoTokenizer

    from sglang_jetspec.models.fetch import fetch
    from sglang_jetspec.reference.prompts import encode, humaneval_prompts

    corpus = load_draft_corpus(HEAD_DIR, VOCAB)
    sequences = corpus_sequences(HEAD_DIR, VOCAB)
    recent = SuffixStore(max_tokens=200_000)
    for sequence in sequences[-RECENT_SEQUENCES:]:
        recent.add(sequence)
    tokenizer = AutoTokenizer.from_pretrained(fetch("smollm2"))
    prompts = [encode(p, tokenizer) for p in humaneval_prompts(range(100, 100 + count))]
    # mid-sequence: a sequence's last token is followed only by its separator in the corpus, never matched
    contexts = [(p + sequences[i][: len(sequences[i]) // 2])[-context_tokens:] for i, p in enumerate(prompts)]
    return contexts, LookupMerge(math.log(0.6), corpus=corpus, recent=recent)


class FixedLogitsHead:
    """A drafter whose marginal pass returns fixed logits: the draft phase without the head."""

    def __init__(self, depth_logits: torch.Tensor, draft_vocab: torch.Tensor) -> None:
        self.depth_logits, self.draft_vocab = depth_logits, draft_vocab
        self.max_depth = depth_logits.shape[1]

    def propose(self, lanes: list, depth: int) -> torch.Tensor:
        return self.depth_logits[: len(lanes), :depth]


def measure(contexts: list[list[int]], merge: LookupMerge, spec: TreeSpec, head: FixedLogitsHead, repeats: int) -> dict:
    if [ordered(g) for g in batch_lookup_guesses(contexts, spec, merge)] != [
        ordered(per_request_guesses(c, spec, merge)) for c in contexts
    ]:
        raise SystemExit(f"batch {len(contexts)}: the batched lookups disagree with the per-request definition")
    loop_ms = _median_ms(lambda: [per_request_guesses(c, spec, merge) for c in contexts], repeats)
    batch_ms = _median_ms(lambda: batch_lookup_guesses(contexts, spec, merge), repeats)
    lanes = [SimpleNamespace(root_token=c[-1], committed_ids=c) for c in contexts]
    draft_ms = _median_ms(lambda: draft_trees(head, lanes, spec, lookup=merge), repeats)
    return {"batch": len(contexts), "per_request_ms": loop_ms, "batched_ms": batch_ms, "draft_host_ms": draft_ms}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", default="1,4,16,64")
    p.add_argument("--budget", type=int, default=16, help="tree nodes (the lookups keep budget - 1 paths)")
    p.add_argument("--depth", type=int, default=15, help="tree depth: the longest continuation counted")
    p.add_argument("--context-tokens", type=int, default=400, help="each request's committed tokens")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    batch_sizes = positive_ints(args.batch_sizes)
    if not batch_sizes or max(batch_sizes) > 64:
        p.error("--batch-sizes takes positive integers up to 64 (HumanEval 100-163) separated by commas")
    if args.budget < 2 or args.depth < 1 or args.context_tokens < 1:
        p.error("--budget must be >= 2, --depth and --context-tokens >= 1")
    spec = TreeSpec(budget=args.budget, max_depth=args.depth, width=8)
    contexts, merge = _contexts(max(batch_sizes), args.context_tokens)
    vocab = load_draft_vocab(HEAD_DIR, VOCAB)
    logits = torch.randn(max(batch_sizes), args.depth, len(vocab), generator=torch.Generator().manual_seed(0)) * 3
    head = FixedLogitsHead(logits, vocab)
    torch.set_num_threads(1)
    rows = [measure(contexts[:batch], merge, spec, head, args.repeats) for batch in batch_sizes]
    lines = [
        f"# A step's hybrid-drafter lookups on the host ({cpu_model()})",
        "",
        f"`python -m bench.lookup_cost {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        f"Median ms per step over {args.repeats} repeats; budget {args.budget}, depth {args.depth}, "
        f"{args.context_tokens}-token contexts; draft corpus {merge.corpus.num_tokens} tokens, finished outputs "
        f"{merge.recent.num_tokens}; the two ways' guesses checked equal, order included. Draft phase: "
        f"`draft_trees` with fixed random logits over the {len(vocab)}-token draft vocabulary, 1 thread.",
        "",
        "| batch | lookups per request ms | lookups batched ms | per request / batched | batched / batch 1's "
        "| draft phase without the head ms | draft phase / batch 1's |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['batch']} | {row['per_request_ms']:.3f} | {row['batched_ms']:.3f} | "
            f"{row['per_request_ms'] / row['batched_ms']:.2f}x | {row['batched_ms'] / rows[0]['batched_ms']:.2f}x | "
            f"{row['draft_host_ms']:.3f} | {row['draft_host_ms'] / rows[0]['draft_host_ms']:.2f}x |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
