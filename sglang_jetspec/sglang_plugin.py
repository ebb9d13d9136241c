"""SGLang plugin entry point (group `sglang.srt.plugins`, see pyproject.toml).

SGLang calls `load_plugin` in each of its processes before parsing arguments. Importing this
module imports nothing; the call registers `--speculative-algorithm JETSPEC` (sglang_jetspec/adapter)
once per process.
"""


def load_plugin() -> None:
    from sglang_jetspec.adapter.registration import register

    register()
