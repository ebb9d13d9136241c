"""`jetspec draft-corpus`: write a head directory's draft corpus (core/suffix_store.py).

The corpus is what the target itself wrote in regenerated training data (`responses.jsonl` of a
`jetspec train` data directory: outputs only, never prompts, never HumanEval). The hybrid drafter
looks the request's recent tokens up in it and proposes what followed them there. The last tenth of
the responses is held out to report how often a held-out token's continuation is found: the share
of held-out positions whose next token is among the corpus's likeliest guesses at depth 1.

`--append` keeps the sequences the head's corpus already holds and adds the new data directory's
(for a second kind of text, such as the target's chat answers next to its code); the record keeps the
earlier record under `appended_to`, so the corpus's whole provenance stays in the head.
"""

from __future__ import annotations

from pathlib import Path

from ..core.suffix_store import DRAFT_CORPUS_FILE, SuffixStore, corpus_sequences, likeliest_paths, save_draft_corpus
from .head_files import head_vocab_size, run_head_file_command, save_with_provenance, split_outputs

HELDOUT_GUESSES = 4  # depth-1 guesses counted in the held-out hit rate


def heldout_hit_rate(store: SuffixStore, sequences: list[list[int]]) -> float:
    """Share of held-out positions whose next token is one of the store's HELDOUT_GUESSES likeliest first tokens."""
    hits = total = 0
    for seq in sequences:
        for i in range(1, len(seq)):
            counts, occurrences = store.continuations(seq[:i], 1)
            hits += (seq[i],) in likeliest_paths(counts, occurrences, HELDOUT_GUESSES)
            total += 1
    return hits / total if total else 0.0


def write_draft_corpus(head_dir: Path, data_dir: Path, max_tokens: int, append: bool = False) -> dict:
    """Build and save the corpus (the first responses, up to `max_tokens` tokens, after the head's
    current corpus with `append`); returns its record."""
    vocab_size = head_vocab_size(head_dir)
    counted, heldout = split_outputs(data_dir)
    kept = corpus_sequences(head_dir, vocab_size) if append else []
    tokens = sum(len(seq) for seq in kept)
    for seq in counted:
        if tokens + len(seq) > max_tokens:
            break
        kept.append(seq)
        tokens += len(seq)
    store = SuffixStore()
    for seq in kept:
        store.add(seq)
    record = {
        "responses": len(kept),
        "tokens": tokens,
        "vocab_size": vocab_size,
        "heldout_responses": len(heldout),
        "heldout_next_token_hit_rate": round(heldout_hit_rate(store, heldout), 4),
    }
    return save_with_provenance(
        head_dir, "draft_corpus", data_dir, append, record, lambda meta: save_draft_corpus(head_dir, kept, meta)
    )


def run(args) -> int:
    if args.max_tokens < 1:
        raise SystemExit(f"jetspec draft-corpus: --max-tokens {args.max_tokens}: must be >= 1")
    return run_head_file_command(
        args,
        "draft-corpus",
        DRAFT_CORPUS_FILE,
        "draft_corpus",
        lambda head_dir, data_dir: write_draft_corpus(head_dir, data_dir, args.max_tokens, args.append),
    )
