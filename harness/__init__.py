"""What bench/ scripts and tests share to drive real servers (never imported by the plugin's packages):

- `sglang_cpu`: the CPU harness, i.e. the real SGLang server on this CPU with the sgl-kernel stand-in,
  its launcher (`python -m harness.sglang_cpu ...`) and its server arguments;
- `client`: a small JSON-over-HTTP client (urllib) and a /metrics reader;
- `compare`: what a comparison of servers reads from their replies and counters (accept length, the
  JETSPEC worker's phases);
- `serve`: `jetspec serve` as a subprocess and closed-loop clients driving it.

The stand-in itself (tests/sglang_cpu/stub) stays under tests/ and test-only: the launcher puts it on
the PYTHONPATH of the server it starts, and nowhere else.
"""
