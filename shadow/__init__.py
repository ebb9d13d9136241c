"""Shadow verification: sampled finished requests re-checked against the target without speculation.

Worker side (below this package, in the engines' own package): sglang_jetspec/spool/ (record, writer,
tee). Checker side, here: the spool reader, the checks and `jetspec shadow run` (shadow/cli.py,
registered through the `jetspec.commands` entry point). See shadow/README.md.
"""
