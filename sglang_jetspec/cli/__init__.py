"""The `jetspec` command line: main.py wires one module per subcommand; args.py holds the shared flags."""

from .main import main

__all__ = ["main"]
