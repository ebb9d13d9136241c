"""`jetspec draft-vocab`: write a head directory's reduced draft vocabulary (core/draft_vocab.py).

The tokens are ranked by how often the target itself emitted them in regenerated training data
(`responses.jsonl` of a `jetspec train` data directory: the target's own outputs, never HumanEval),
the target's end-of-sequence tokens always included. The last tenth of the responses is held out
to report how much of unseen target output the vocabulary covers. `--append` keeps the head's current
vocabulary and adds the data directory's most frequent other tokens up to `--size` (for a second kind
of text, such as chat next to code); the earlier record is kept under `appended_to`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..core.draft_vocab import DRAFT_VOCAB_FILE, coverage, load_draft_vocab, rank_tokens, save_draft_vocab
from .head_files import head_vocab_size, run_head_file_command, save_with_provenance, split_outputs

# Small enough to cut the draft step's lm_head read, large enough to lose no accept length (the
# measurements: docs/training.md, "Draft vocabulary and draft corpus").


def end_token_ids(target_dir: Path | None) -> list[int]:
    """The target's eos ids (config.json / generation_config.json of its checkpoint), when known."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = target_dir / name if target_dir else None
        if path and path.is_file():
            eos = json.loads(path.read_text()).get("eos_token_id")
            ids += eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else []
    return ids


def write_draft_vocab(head_dir: Path, data_dir: Path, size: int, append: bool = False) -> dict:
    """Build and save the vocabulary (after the head's current one with `append`); returns its record
    (size, coverage, data provenance)."""
    vocab_size = head_vocab_size(head_dir)
    manifest_path = data_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    target_dir = Path(manifest["target"]) if manifest.get("target") else None
    train, heldout = split_outputs(data_dir)
    kept = load_draft_vocab(head_dir, vocab_size) if append else None
    kept = kept.tolist() if kept is not None else []
    if size < len(kept):
        raise SystemExit(
            f"jetspec draft-vocab: --size {size} with --append: "
            f"the head's vocabulary already holds {len(kept)} tokens; "
            f"pass --size above {len(kept)}"
        )
    ids = rank_tokens(train, size, vocab_size, [*kept, *end_token_ids(target_dir)])
    record = {
        "size": size,
        "vocab_size": vocab_size,
        "counted_responses": len(train),
        "counted_tokens": sum(map(len, train)),
        "heldout_responses": len(heldout),
        "heldout_coverage": round(coverage(ids, heldout), 5),
    }
    return save_with_provenance(
        head_dir, "draft_vocab", data_dir, append, record, lambda meta: save_draft_vocab(head_dir, ids, meta)
    )


def run(args) -> int:
    return run_head_file_command(
        args,
        "draft-vocab",
        DRAFT_VOCAB_FILE,
        "draft_vocab",
        lambda head_dir, data_dir: write_draft_vocab(head_dir, data_dir, args.size, args.append),
    )
