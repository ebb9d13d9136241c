"""Shadow verification: sampled finished requests re-checked against the target without speculation.

Worker side: `shadow.tee` (ShadowTee) and `shadow.spool` (crash-safe JSONL). Checker side:
`jetspec shadow run` (shadow/cli.py). See shadow/README.md.
"""
