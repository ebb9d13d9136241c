"""Every GPU script (bench/GPU.md), run from the checkout's root as `python -m bench.gpu.<name>`."""
