"""`jetspec draft-corpus`: write a head directory's draft corpus (core/suffix_store.py).

The corpus is what the target itself wrote in regenerated training data (`responses.jsonl` of a
`jetspec train` data directory: outputs only, never prompts, never HumanEval). The hybrid drafter
looks the request's recent tokens up in it and proposes what followed them there. The last tenth of
the responses is held out to report how often a held-out token's continuation is found: the share
of held-out positions whose next token is among the corpus's likeliest guesses at depth 1.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ..core.suffix_store import DRAFT_CORPUS_FILE, SuffixStore, likeliest_paths, save_draft_corpus
from ..models.fetch import sha256_file
from .data import RESPONSES, read_responses
from .vocab_command import HELDOUT_SHARE, note_in_head_record

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


def write_draft_corpus(head_dir: Path, data_dir: Path, max_tokens: int) -> dict:
    """Build and save the corpus (the first responses, up to `max_tokens` tokens); returns its record."""
    config = json.loads((head_dir / "config.json").read_text())
    outputs = [r["output_ids"] for r in read_responses(data_dir)]
    cut = max(1, int(len(outputs) * (1 - HELDOUT_SHARE))) if len(outputs) > 1 else len(outputs)
    kept, tokens = [], 0
    for seq in outputs[:cut]:
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
        "heldout_responses": len(outputs) - cut,
        "heldout_next_token_hit_rate": round(heldout_hit_rate(store, outputs[cut:]), 4),
        "data_dir": str(data_dir),
        "responses_sha256": sha256_file(data_dir / RESPONSES),
    }
    save_draft_corpus(head_dir, kept, record)
    return record


def run(args) -> int:
    head_dir, data_dir = Path(args.head), Path(args.data_dir)
    if not (head_dir / "config.json").is_file():
        raise SystemExit(f"jetspec draft-corpus: --head {head_dir}: no config.json; pass a head directory")
    if not (data_dir / RESPONSES).is_file():
        raise SystemExit(f"jetspec draft-corpus: --data-dir {data_dir}: no {RESPONSES}; pass a `jetspec train` data directory")
    if args.max_tokens < 1:
        raise SystemExit(f"jetspec draft-corpus: --max-tokens {args.max_tokens}: must be >= 1")
    record = write_draft_corpus(head_dir, data_dir, args.max_tokens)
    note_in_head_record(head_dir, DRAFT_CORPUS_FILE, "draft_corpus", record, shlex.join(["jetspec", *getattr(args, "argv", [])]))
    print(json.dumps(record, indent=2))
    return 0
