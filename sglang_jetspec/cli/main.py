"""The `jetspec` command: one registrar per subcommand module; this file only wires them.

A registrar adds its parser to the subparsers and sets `func(args) -> exit code` as its default.
Packages above this one (the shadow checker) add their subcommands through the `jetspec.commands`
entry-point group, so nothing here imports them.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points

from policies.cli import add_subcommands as register_policy

from . import bench, generate, model, serve, train

COMMAND_GROUP = "jetspec.commands"

# One line per subcommand module, in the order `jetspec --help` lists them.
REGISTRARS = [
    model.register,
    generate.register,
    bench.register,
    bench.register_replay,
    bench.register_gap,
    register_policy,
    train.register,
    train.register_draft_vocab,
    train.register_draft_corpus,
    serve.register,
]


def plugin_registrars() -> list:
    """Registrars that installed packages declare under the `jetspec.commands` entry-point group."""
    return [ep.load() for ep in sorted(entry_points(group=COMMAND_GROUP), key=lambda ep: ep.name)]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jetspec", description="JetSpec tree speculative decoding tools")
    sub = parser.add_subparsers(dest="command", required=True)
    for register in REGISTRARS + plugin_registrars():
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv  # recorded by commands that write provenance (train)
    return args.func(args)
