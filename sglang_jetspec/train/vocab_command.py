"""`jetspec draft-vocab`: write a head directory's reduced draft vocabulary (core/draft_vocab.py).

The tokens are ranked by how often the target itself emitted them in regenerated training data
(`responses.jsonl` of a `jetspec train` data directory: the target's own outputs, never HumanEval),
the target's end-of-sequence tokens always included. The last tenth of the responses is held out
to report how much of unseen target output the vocabulary covers.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..core.draft_vocab import DRAFT_VOCAB_FILE, coverage, rank_tokens, save_draft_vocab
from ..models.fetch import sha256_file
from .data import RESPONSES
from .head_files import run_head_file_command, split_outputs

DEFAULT_SIZE = 8192


def end_token_ids(target_dir: Path | None) -> list[int]:
    """The target's eos ids (config.json / generation_config.json of its checkpoint), when known."""
    ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        path = target_dir / name if target_dir else None
        if path and path.is_file():
            eos = json.loads(path.read_text()).get("eos_token_id")
            ids += eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else []
    return ids


def write_draft_vocab(head_dir: Path, data_dir: Path, size: int) -> dict:
    """Build and save the vocabulary; returns its record (size, coverage, data provenance)."""
    config = json.loads((head_dir / "config.json").read_text())
    manifest_path = data_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    target_dir = Path(manifest["target"]) if manifest.get("target") else None
    train, heldout = split_outputs(data_dir)
    ids = rank_tokens(train, size, int(config["vocab_size"]), end_token_ids(target_dir))
    record = {
        "size": size,
        "vocab_size": int(config["vocab_size"]),
        "counted_responses": len(train),
        "counted_tokens": sum(map(len, train)),
        "heldout_responses": len(heldout),
        "heldout_coverage": round(coverage(ids, heldout), 5),
        "data_dir": str(data_dir),
        "responses_sha256": sha256_file(data_dir / RESPONSES),
    }
    save_draft_vocab(head_dir, ids, record)
    return record


def run(args) -> int:
    return run_head_file_command(args, "draft-vocab", DRAFT_VOCAB_FILE, "draft_vocab",
                                 lambda head_dir, data_dir: write_draft_vocab(head_dir, data_dir, args.size))
