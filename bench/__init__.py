"""Benchmark scripts, run from the checkout's root as modules (`python -m bench.sglang_cpu_compare --help`);
not installed. What they share with the tests is in `harness/`."""
