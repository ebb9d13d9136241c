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

import json
from pathlib import Path

from ..core.suffix_store import DRAFT_CORPUS_FILE, SuffixStore, corpus_sequences, likeliest_paths, save_draft_corpus
from ..models.fetch import sha256_file
from .data import RESPONSES
from .head_files import current_record, run_head_file_command, split_outputs

DEFAULT_MAX_TOKENS = 1_000_000
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
    config = json.loads((head_dir / "config.json").read_text())
    counted, heldout = split_outputs(data_dir)
    kept = corpus_sequences(head_dir, int(config["vocab_size"])) if append else []
    earlier = current_record(head_dir, "draft_corpus") if append else None
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
        "vocab_size": int(config["vocab_size"]),
        "heldout_responses": len(heldout),
        "heldout_next_token_hit_rate": round(heldout_hit_rate(store, heldout), 4),
        "data_dir": str(data_dir),
        "responses_sha256": sha256_file(data_dir / RESPONSES),
    }
    if append:
        record["appended_to"] = earlier
    save_draft_corpus(head_dir, kept, {k: v for k, v in record.items() if k != "appended_to"})
    return record


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
