"""JetSpec tree speculative decoding: engine-agnostic core, reference engine and SGLang adapter.

Packages, from the bottom up: core/ (draft -> tree -> verify mask -> accept, engine-agnostic), models/,
observability/, spool/, reference/ (the HF engine), adapter/ (SGLang), serving/ (the reference HTTP
server), bench/, train/, cli/ (the `jetspec` command).
"""

__version__ = "0.1.0"
