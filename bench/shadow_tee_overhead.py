"""Cost of the shadow tee on the serving thread, per finished request (microbenchmark).

    python -m bench.shadow_tee_overhead [--prompt-tokens 512] [--output-tokens 256] [--n 2000]

Measures what the engine thread pays in EngineTee.finished (coin flip; for sampled requests also
building the ShadowRecord and queueing it) and, separately, the writer thread's fsync'd write.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.serving.shadow_hook import EngineTee
from sglang_jetspec.spool.record import RecordSampling, ShadowRecord
from sglang_jetspec.spool.tee import ShadowTee
from sglang_jetspec.spool.writer import SpoolWriter


def per_call_us(fn, n: int) -> float:
    samples = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=1, max_new_tokens=args.output_tokens)
    steps = args.output_tokens // 3
    with tempfile.TemporaryDirectory() as spool:
        results = {}
        for rate in (0.0, 1.0):
            tee = ShadowTee(SpoolWriter(spool), sample_rate=rate, capacity=args.n + 10).start()
            hook = EngineTee(tee, "smollm2", "head")

            def finish(i):
                request = SimpleNamespace(
                    request_id=f"{rate}-{i}", prompt_ids=list(range(args.prompt_tokens)), params=params
                )
                output = SimpleNamespace(
                    output_ids=list(range(args.output_tokens)), finish_reason="length", accept_lengths=[3] * steps
                )
                hook.admitted(request, 0.0)
                hook.stepped([request] * 1, 16)
                t = time.perf_counter()
                hook.finished(request, output, 1.0)
                return time.perf_counter() - t

            times = [finish(i) for i in range(args.n)]
            results[rate] = statistics.median(times) * 1e6
            tee.close(60)
        record = ShadowRecord(
            request_id="x",
            model="smollm2",
            prompt_ids=list(range(args.prompt_tokens)),
            output_ids=list(range(args.output_tokens)),
            sampling=RecordSampling.of(params),
            finish_reason="length",
            started_at=0.0,
            finished_at=1.0,
        )
        writer = SpoolWriter(Path(spool) / "w")
        write_us = per_call_us(lambda i: writer.write(record), min(args.n, 500))
        writer.close()
    print(f"prompt {args.prompt_tokens} + output {args.output_tokens} tokens, median of {args.n}:")
    print(f"  engine thread, request not sampled (rate 0): {results[0.0]:.2f} us")
    print(f"  engine thread, request sampled (rate 1): {results[1.0]:.1f} us (build record + queue)")
    print(f"  writer thread, one fsync'd record ({len(record.model_dump_json())} bytes): {write_us:.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
