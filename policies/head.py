"""What tree budget a draft head can actually use, read from its checkpoint's config.json.

A head with block size B drafts depths 1..B-1, and the tree builder gives every node at most
`tree_width` children (top-K per depth). A full tree of that shape has 1 + K + ... + K^(B-1) nodes
(root included); a larger budget buys nothing, so a policy asking for more is a mistake. Likewise
tree-causal draft rounds need a head trained with revealed tokens (`draft_reveal` in its config).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# Top-K children per node when the checkpoint does not say; the tree builder's default width.
DEFAULT_TREE_WIDTH = 8

# Where the known checkpoint layouts keep their draft settings (native DFlash/JetSpec, speculators).
_CONFIG_BLOCKS = ("jetspec_config", "dflash_config", "speculators_config")


@dataclass(frozen=True)
class HeadCapacity:
    source: str
    block_size: int
    tree_width: int
    reads_tree_tokens: bool = False  # trained with revealed tokens (draft_reveal): tree-causal rounds apply

    @property
    def max_nodes(self) -> int:
        return self.nodes_at(self.tree_width)

    def nodes_at(self, width: int) -> int:
        """Nodes of the full tree with `width` children per node, root included."""
        return sum(width**d for d in range(self.block_size))


def _lookup(config: dict, key: str) -> object | None:
    if key in config:
        return config[key]
    for block in _CONFIG_BLOCKS:
        if isinstance(config.get(block), dict) and key in config[block]:
            return config[block][key]
    return None


def read_head_capacity(head_dir: str | Path) -> HeadCapacity:
    path = Path(head_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: not found -- pass the directory of a draft head checkpoint") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg}) -- fix the file") from None
    block_size = _lookup(config, "block_size")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 2:
        raise ValueError(
            f"{path}: block_size is {block_size!r} -- the head config needs an integer "
            "block_size >= 2 (top level or in jetspec_config/dflash_config)"
        )
    width = _lookup(config, "tree_width")
    if width is None:
        width = DEFAULT_TREE_WIDTH
    if not isinstance(width, int) or isinstance(width, bool) or width < 1:
        raise ValueError(f"{path}: tree_width is {width!r} -- use a positive integer")
    return HeadCapacity(
        source=str(head_dir),
        block_size=block_size,
        tree_width=width,
        reads_tree_tokens=_lookup(config, "draft_reveal") is not None,
    )
