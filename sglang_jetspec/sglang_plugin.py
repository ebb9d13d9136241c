"""Entry point reserved for the SGLang adapter (group `sglang.srt.plugins`).

SGLang imports every plugin of that group in each of its processes before parsing arguments, so
this must stay importable and cheap. The JETSPEC worker is not implemented yet (see README):
until then this registers nothing, and `--speculative-algorithm JETSPEC` is rejected by SGLang
itself as an unknown algorithm.
"""


def load_plugin() -> None:
    return None
