"""Save and load draft heads: config.json + safetensors in the published JetSpec / DFlash layout."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .head import DraftHead
from .head_config import HeadConfig, HeadConfigError, TargetInfo

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Some exports carry these copies of the target's tensors; the head always uses the target's own.
_TARGET_OWNED_PREFIXES = ("embed_tokens.", "lm_head.")


def read_head_file_tensor(path: Path, name: str, error: type[ValueError], rebuild: str) -> torch.Tensor:
    """Tensor `name` of a safetensors file in a head directory (draft vocabulary, draft corpus);
    `error` naming the file and the fix (`rebuild`, a command) when it cannot be read."""
    try:
        with safe_open(str(path), framework="pt") as fh:
            return fh.get_tensor(name)
    except Exception as exc:  # safetensors raises several types for a damaged file
        raise error(f"{path}: unreadable ({exc}); rebuild it with `{rebuild}` or delete it") from exc


def read_head_config(head_dir: str | Path) -> HeadConfig:
    path = Path(head_dir) / "config.json"
    if not path.is_file():
        raise HeadConfigError(f"{path}: no config.json; pass a head directory (config.json + model.safetensors)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise HeadConfigError(f"{path}: not valid JSON ({exc})") from exc
    return HeadConfig.from_json_dict(raw)


def save_head(head: DraftHead, head_dir: str | Path) -> Path:
    out = Path(head_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(head.config.to_json_dict(), indent=2, sort_keys=True) + "\n")
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    return out


def _read_weights(head_dir: Path) -> dict[str, torch.Tensor]:
    if (head_dir / WEIGHTS_FILE).is_file():
        return load_file(str(head_dir / WEIGHTS_FILE))
    if (head_dir / INDEX_FILE).is_file():
        shards = sorted(set(json.loads((head_dir / INDEX_FILE).read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(head_dir / shard)))
        return state
    raise HeadConfigError(f"{head_dir}: no {WEIGHTS_FILE} or {INDEX_FILE}")


def load_head(
    head_dir: str | Path,
    target: TargetInfo | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> DraftHead:
    """Load a head; with `target`, refuse one whose hidden size, vocabulary or taps do not fit it."""
    head_dir = Path(head_dir)
    cfg = read_head_config(head_dir)
    if target is not None:
        cfg.check_fits(target)
    state = {}
    for key, value in _read_weights(head_dir).items():
        key = key.removeprefix("model.")
        if not key.startswith(_TARGET_OWNED_PREFIXES):
            state[key] = value
    head = DraftHead(cfg)
    expected = head.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise HeadConfigError(
            f"{head_dir}: weights do not match config.json (missing {missing[:5]}, unexpected {unexpected[:5]})"
        )
    for key, value in state.items():
        if value.shape != expected[key].shape:
            raise HeadConfigError(
                f"{head_dir}: weight {key} has shape {tuple(value.shape)}, "
                f"config.json implies {tuple(expected[key].shape)}"
            )
    head.load_state_dict(state)
    return head.to(device=device, dtype=dtype).eval()


def init_head(cfg: HeadConfig, seed: int = 0, std: float = 0.02) -> DraftHead:
    """A freshly initialised (untrained) head, reproducible from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    head = DraftHead(cfg)
    with torch.no_grad():
        for name, param in head.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return head.eval()
