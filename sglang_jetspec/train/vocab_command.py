"""`jetspec draft-vocab`: write a head directory's reduced draft vocabulary (core/draft_vocab.py).

The tokens are ranked by how often the target itself emitted them in regenerated training data
(`responses.jsonl` of a `jetspec train` data directory: the target's own outputs, never HumanEval),
the target's end-of-sequence tokens always included. The last tenth of the responses is held out
to report how much of unseen target output the vocabulary covers.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ..core.draft_vocab import DRAFT_VOCAB_FILE, coverage, rank_tokens, save_draft_vocab
from ..models.fetch import sha256_file
from .data import RESPONSES, read_responses

DEFAULT_SIZE = 8192
HELDOUT_SHARE = 0.1


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
    outputs = [r["output_ids"] for r in read_responses(data_dir)]
    cut = max(1, int(len(outputs) * (1 - HELDOUT_SHARE))) if len(outputs) > 1 else len(outputs)
    train, heldout = outputs[:cut], outputs[cut:]
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


def note_in_head_record(head_dir: Path, file_name: str, key: str, record: dict, command: str) -> None:
    """A head with a training record (the shipped one) keeps its provenance whole when a file is added
    to it (draft vocabulary, draft corpus): the command and record under `key`, the file's checksum in
    `files_sha256`, and SHA256SUMS rewritten to match."""
    path = head_dir / "training_record.json"
    if not path.is_file():
        return
    training = json.loads(path.read_text())
    training[key] = {"command": command, **record}
    training.setdefault("files_sha256", {})[file_name] = sha256_file(head_dir / file_name)
    path.write_text(json.dumps(training, indent=2) + "\n")
    sums = head_dir / "SHA256SUMS"
    if sums.is_file():
        sums.write_text("".join(f"{digest}  {name}\n" for name, digest in sorted(training["files_sha256"].items())))


def run(args) -> int:
    head_dir, data_dir = Path(args.head), Path(args.data_dir)
    if not (head_dir / "config.json").is_file():
        raise SystemExit(f"jetspec draft-vocab: --head {head_dir}: no config.json; pass a head directory")
    if not (data_dir / RESPONSES).is_file():
        raise SystemExit(f"jetspec draft-vocab: --data-dir {data_dir}: no {RESPONSES}; pass a `jetspec train` data directory")
    record = write_draft_vocab(head_dir, data_dir, args.size)
    note_in_head_record(head_dir, DRAFT_VOCAB_FILE, "draft_vocab", record, shlex.join(["jetspec", *getattr(args, "argv", [])]))
    print(json.dumps(record, indent=2))
    return 0
