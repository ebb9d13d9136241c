"""SGLang adapter: `--speculative-algorithm JETSPEC` on top of the engine-agnostic core.

Modules that import SGLang do so only when SGLang calls into them (registration, worker); the
tensor logic (verify_inputs, accept, policy) is pure PyTorch / pydantic and runs without SGLang.
"""
