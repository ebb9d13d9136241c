"""Reference engine: the JetSpec core driving a Hugging Face transformers target (CPU or CUDA).

It is the correctness oracle for every other engine and the embedded default without a GPU.
"""
