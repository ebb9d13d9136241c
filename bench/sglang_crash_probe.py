"""Which single requests take a real SGLang 0.5.23 server down, plain and JETSPEC side by side, on this CPU.

    python -m bench.sglang_crash_probe --markdown bench/results/sglang_cpu/crash-probe.md

For each probe input a server (the CPU harness, harness/sglang_cpu.py, fp32) gets that one request, then an ordinary
greedy request; the row says what the probe got back and whether the server still answered. A server
that died is started again for the next probe. JETSPEC refuses these inputs at admission
(adapter/request_sampling.crashing_input); the plain column is what SGLang itself does with them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.error
from pathlib import Path

from harness.client import post
from harness.sglang_cpu import jetspec_args, launch, server_args

PROBES = {
    "input_ids [49252] (vocabulary 49152)": {"input_ids": [49252]},
    "input_ids [5, -1]": {"input_ids": [5, -1]},
    "input_ids [2^40]": {"input_ids": [2**40]},
    'text ""': {"text": ""},
    "top_k 1e12 (a JSON float)": {"input_ids": [1, 2, 3], "sampling_params": {"top_k": 1e12}},
    "top_k 10^12 (a JSON integer)": {"input_ids": [1, 2, 3], "sampling_params": {"top_k": 10**12}},
    "top_logprobs_num 100000": {"input_ids": [1, 2, 3], "return_logprob": True, "top_logprobs_num": 100000},
}


def probe(url: str, body: dict) -> tuple[str, bool]:
    """(what the probe got, whether an ordinary request is served afterwards)."""
    try:
        status, reply = post(f"{url}/generate", {"sampling_params": {"max_new_tokens": 4}, **body}, timeout=60)
        got = f"{status} {str(reply.get('error', reply) if isinstance(reply, dict) else reply)[:90]}"
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        got = f"no answer ({type(exc).__name__})"
    try:
        status, _ = post(
            f"{url}/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}, timeout=60
        )
        alive = status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        alive = False
    return got, alive


def run(config: str, model: Path, logs: Path) -> dict[str, tuple[str, bool]]:
    make = jetspec_args if config == "jetspec" else server_args
    server, out = None, {}
    for i, (name, body) in enumerate(PROBES.items()):
        if server is None:
            server = launch(make(model), logs / f"{config}-{i}.log", {"OMP_NUM_THREADS": "2"})
        out[name] = probe(server.url, body)
        print(f"{config:8s} {name:40s} {out[name][0]} -> {'serving' if out[name][1] else 'DOWN'}", flush=True)
        if not out[name][1]:
            server.stop()
            server = None
    if server is not None:
        server.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--configs", default="plain,jetspec", help="comma-separated: plain, jetspec")
    args = parser.parse_args()
    configs = args.configs.split(",")
    from sglang_jetspec.models.fetch import fetch
    from sglang_jetspec.reference.precision import cpu_model

    model = fetch("smollm2")
    logs = Path(tempfile.mkdtemp(prefix="crash-probe-"))
    results = {config: run(config, model, logs) for config in configs}
    lines = [
        f"# One request against a real SGLang 0.5.23 server (CPU harness, fp32; {cpu_model()}, "
        f"{time.strftime('%Y-%m-%d')})",
        "",
        f"`python -m bench.sglang_crash_probe --configs {args.configs} --markdown OUT`",
        "",
        "| probe | " + " | ".join(f"{c}: answer | {c}: serves after" for c in configs) + " |",
        "|---|" + "---|---|" * len(configs),
    ]
    for name in PROBES:
        cells = [
            f"{results[c][name][0].replace('|', '/')} | {'yes' if results[c][name][1] else '**no: server down**'}"
            for c in configs
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
