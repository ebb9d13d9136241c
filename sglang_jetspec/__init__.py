"""JetSpec tree speculative decoding: engine-agnostic core, reference engine and SGLang adapter."""

__version__ = "0.1.0"
