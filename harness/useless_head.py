"""A head that cannot pay: the shipped head's files with every weight replaced by noise of the same scale, so
its drafts are random tokens. The same-allocation control's real-server test and bench.control_plane's
`--useless-head` run it: speculation with it must end up native."""

from __future__ import annotations

import shutil
from pathlib import Path


def make_useless_head(head: Path, out: Path, seed: int = 0) -> Path:
    """Copy `head` to `out` (replaced if present) with noise weights; returns `out`."""
    import torch
    from safetensors.torch import load_file, save_file

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(head, out)
    weights = load_file(out / "model.safetensors")
    generator = torch.Generator().manual_seed(seed)
    noise = {
        name: (torch.randn(t.shape, generator=generator) * t.float().std().clamp(min=1e-3)).to(t.dtype)
        for name, t in weights.items()
    }
    save_file(noise, out / "model.safetensors")
    return out
