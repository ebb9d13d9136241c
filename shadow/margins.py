"""The greedy tie margin (nats) the shadow checks use by default (shadow/checks.py says why 0.05): its own
module, with no torch, so `jetspec --help` and `jetspec shadow run --help` show it without loading the checks."""

DEFAULT_TIE_MARGIN = 0.05
