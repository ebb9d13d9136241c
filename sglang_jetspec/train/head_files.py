"""What `jetspec draft-vocab` and `jetspec draft-corpus` share: both build one file of a head directory
from a `jetspec train` data directory's target outputs, hold out the last tenth of them to report on,
and record the file in the head's training record."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

from ..models.fetch import sha256_file
from .data import RESPONSES, read_responses

HELDOUT_SHARE = 0.1


def split_outputs(data_dir: Path) -> tuple[list[list[int]], list[list[int]]]:
    """The data directory's target outputs, split into the counted ones and the held-out last tenth
    (none held out of a single response)."""
    outputs = [r["output_ids"] for r in read_responses(data_dir)]
    cut = max(1, int(len(outputs) * (1 - HELDOUT_SHARE))) if len(outputs) > 1 else len(outputs)
    return outputs[:cut], outputs[cut:]


def head_vocab_size(head_dir: Path) -> int:
    """The head's (and its target's) vocabulary size, from its config.json."""
    return int(json.loads((head_dir / "config.json").read_text())["vocab_size"])


def save_with_provenance(
    head_dir: Path, key: str, data_dir: Path, append: bool, record: dict, save: Callable[[dict], object]
) -> dict:
    """`record` completed with where its data came from (the data directory and its responses' checksum),
    saved with the file (`save(record)`); returned with the head's earlier record under `appended_to`
    when `append` built on it (kept in the head's training record, not in the file)."""
    record = {**record, "data_dir": str(data_dir), "responses_sha256": sha256_file(data_dir / RESPONSES)}
    earlier = current_record(head_dir, key) if append else None
    save(record)
    return {**record, "appended_to": earlier} if append else record


def current_record(head_dir: Path, key: str) -> dict | None:
    """The head record's entry for a file (`draft_vocab`, `draft_corpus`): what `--append` builds on."""
    path = head_dir / "training_record.json"
    return json.loads(path.read_text()).get(key) if path.is_file() else None


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


def run_head_file_command(args, command: str, file_name: str, key: str, write: Callable[[Path, Path], dict]) -> int:
    """Check --head and --data-dir, `write(head_dir, data_dir)` the file, record it in the head and print its record."""
    head_dir, data_dir = Path(args.head), Path(args.data_dir)
    if not (head_dir / "config.json").is_file():
        raise SystemExit(f"jetspec {command}: --head {head_dir}: no config.json; pass a head directory")
    if not (data_dir / RESPONSES).is_file():
        raise SystemExit(
            f"jetspec {command}: --data-dir {data_dir}: no {RESPONSES}; pass a `jetspec train` data directory"
        )
    record = write(head_dir, data_dir)
    note_in_head_record(head_dir, file_name, key, record, shlex.join(["jetspec", *getattr(args, "argv", [])]))
    print(json.dumps(record, indent=2))
    return 0
