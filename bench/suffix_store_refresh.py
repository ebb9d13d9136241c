"""Host milliseconds a serving engine's store of finished outputs costs at the step after a request finished.

The worker adds each finished request's output to its recent-outputs store (core/suffix_store.py,
bounded at RECENT_OUTPUT_TOKENS), and the next lookup indexes it. This times that refresh on a store
filled to `--store-tokens` with the shipped head's draft corpus (text the target wrote), cycled: the
incremental refresh the store runs (the new output's n-grams sorted and merged into the index, eviction
at the bound), against re-indexing the whole store, what every refresh did before. Both give the same
index (checked on every repeat here, and in tests/test_suffix_store.py).

    python -m bench.suffix_store_refresh --store-tokens 25000,100000,200000 \
        --markdown bench/results/sglang_cpu/suffix-store-refresh-xeon.md
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bench.lookup_cost import HEAD_DIR, VOCAB
from bench.sglang_cpu_compare import positive_ints
from sglang_jetspec.core.suffix_store import RECENT_OUTPUT_TOKENS, SuffixStore, corpus_sequences, ngram_index
from sglang_jetspec.reference.precision import cpu_model


def filled_store(sequences: itertools.cycle, tokens: int) -> SuffixStore:
    """A store bounded as the worker's (RECENT_OUTPUT_TOKENS), filled to `tokens` and indexed."""
    store = SuffixStore(max_tokens=RECENT_OUTPUT_TOKENS)
    held = 0
    while held < tokens:
        sequence = next(sequences)
        store.add(sequence)
        held += len(sequence) + 1
    store._refresh()
    return store


def measure(store: SuffixStore, sequences: itertools.cycle, repeats: int) -> dict:
    """Per finished output: the store's refresh, then the whole store re-indexed (checked equal)."""
    incremental, full = [], []
    for _ in range(repeats):
        store.add(next(sequences))
        start = time.perf_counter()
        store._refresh()
        incremental.append(time.perf_counter() - start)
        start = time.perf_counter()
        rebuilt = [ngram_index(store._tokens, n) for n in range(1, store.max_ngram + 1)]
        full.append(time.perf_counter() - start)
        for (keys, after), (want_keys, want_after) in zip(store._index, rebuilt):
            if not (np.array_equal(keys, want_keys) and np.array_equal(after, want_after)):
                raise AssertionError("the incremental index differs from the store re-indexed")
    ms = lambda times: 1000 * statistics.median(times)  # noqa: E731
    return {
        "tokens": len(store._tokens),
        "incremental_ms": ms(incremental),
        "incremental_max_ms": 1000 * max(incremental),
        "full_ms": ms(full),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store-tokens", default="25000,100000,200000", help="tokens held before each measurement")
    p.add_argument("--repeats", type=int, default=40, help="finished outputs added and timed per size")
    p.add_argument("--markdown", type=Path)
    args = p.parse_args(argv)
    sizes = positive_ints(args.store_tokens)
    if not sizes or max(sizes) > RECENT_OUTPUT_TOKENS or args.repeats < 1:
        p.error(f"--store-tokens takes positive integers up to {RECENT_OUTPUT_TOKENS}; --repeats must be >= 1")
    sequences = [s for s in corpus_sequences(HEAD_DIR, VOCAB) if s]
    if not sequences:
        p.error(f"{HEAD_DIR} has no draft corpus to fill the store with")
    lengths = [len(s) for s in sequences]
    rows = []
    for size in sizes:
        cycle = itertools.cycle(sequences)
        rows.append(measure(filled_store(cycle, size), cycle, args.repeats))
    lines = [
        f"# The recent-outputs store's refresh after a finished request ({cpu_model()})",
        "",
        f"`python -m bench.suffix_store_refresh {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        f"Median ms over {args.repeats} finished outputs per size (max in brackets), 4 n-gram lengths, bound "
        f"{RECENT_OUTPUT_TOKENS} tokens; outputs: the shipped draft corpus's {len(sequences)} sequences "
        f"(median {statistics.median(lengths):.0f} tokens), cycled; the two indexes checked equal on every repeat.",
        "",
        "| tokens held | incremental refresh ms | whole store re-indexed ms | re-indexed / incremental |",
        "|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['tokens']} | {row['incremental_ms']:.2f} ({row['incremental_max_ms']:.2f}) "
            f"| {row['full_ms']:.2f} | {row['full_ms'] / row['incremental_ms']:.1f}x |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
