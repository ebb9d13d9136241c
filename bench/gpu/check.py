"""Correctness half of bench/gpu/reference.sh: greedy JETSPEC output against autoregressive output of the same engine.

At fp32 every budget must be token-identical to autoregressive decoding. At bf16 a tree-verify pass
and a decode step may round differently, so the check reports the mismatch rate and, at each first
divergence, the target's top-1 minus top-2 log-prob margin there (small margins = rounding ties,
large ones = a bug). Runs anywhere the reference engine runs (CPU: a smoke test of the script):

    python -m bench.gpu.check --device cuda --dtype bf16 --attention triton --prompt-range 0:50 \
        --budgets 16,64,256 --json out.json --markdown out.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from sglang_jetspec.cli.args import (
    add_target_arguments,
    positive_int,
)
from sglang_jetspec.cli.bench import budget_list, prompt_range
from sglang_jetspec.core.sampling import SamplingParams
from sglang_jetspec.evaluation.setup import select_prompts
from sglang_jetspec.reference.divergence import first_difference as first_divergence
from sglang_jetspec.reference.engine import EngineConfig, ReferenceEngine, Request
from sglang_jetspec.reference.loading import load_drafter, load_target
from sglang_jetspec.reference.prompts import encode


@torch.no_grad()
def top2_margin(target, ids: list[int]) -> float:
    """Target log-prob of its top token minus its second, after `ids` (plain forward, no cache)."""
    logits = target.model(torch.tensor([ids], device=target.device)).logits[0, -1].float()
    top = torch.log_softmax(logits, -1).topk(2).values
    return float(top[0] - top[1])


def check(args) -> dict:
    target = load_target(args.target, args.dtype, args.device, args.attention)
    drafter, head = load_drafter(target, args.head)
    prompts, indices = select_prompts(args.prompts, args.prompt_range)
    requests = [
        Request(encode(p, target.tokenizer), SamplingParams(max_new_tokens=args.max_new_tokens), str(i))
        for i, p in zip(indices, prompts)
    ]
    config = EngineConfig(max_batch_size=args.batch_size)
    ar = ReferenceEngine(target, None, config).generate(requests, 0)
    cells = []
    for budget in args.budgets:
        spec = ReferenceEngine(target, drafter, config).generate(requests, budget)
        mismatches = []
        for request, a, s in zip(requests, ar, spec):
            at = first_divergence(a.output_ids, s.output_ids)
            if at is not None:
                margin = top2_margin(target, request.prompt_ids + a.output_ids[:at])
                mismatches.append({"request": request.request_id, "position": at, "margin": margin})
        accept = [n for o in spec for n in o.accept_lengths]
        cells.append(
            {
                "budget": budget,
                "requests": len(requests),
                "mismatches": mismatches,
                "mismatch_rate": len(mismatches) / len(requests),
                "mean_accept_length": sum(accept) / len(accept),
            }
        )
        print(
            f"{args.dtype} {args.attention} budget {budget}: {len(mismatches)}/{len(requests)} outputs differ "
            f"from autoregressive; margins {[round(m['margin'], 4) for m in mismatches]}",
            flush=True,
        )
    device = torch.cuda.get_device_name(target.device) if target.device.type == "cuda" else args.device
    return {
        "device": device,
        "dtype": args.dtype,
        "attention": args.attention,
        "head": head,
        "prompts": args.prompts,
        "prompt_range": f"{indices.start}:{indices.stop}",
        "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size,
        "cells": cells,
    }


def markdown(report: dict) -> str:
    rows = [
        f"| {report['device']} | {report['dtype']} | {report['attention']} | {c['budget']} | {c['requests']} | "
        f"{len(c['mismatches'])} ({100 * c['mismatch_rate']:.0f}%) | "
        f"{max((m['margin'] for m in c['mismatches']), default=0):.4f} | {c['mean_accept_length']:.2f} |"
        for c in report["cells"]
    ]
    return (
        "\n".join(
            [
                "| device | dtype | attention | budget | requests | outputs differing "
                "| largest margin at divergence (nats) | accept length |",
                "|---|---|---|---|---|---|---|---|",
                *rows,
            ]
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_target_arguments(parser)
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--prompt-range", type=prompt_range, default=slice(0, 8))
    parser.add_argument("--budgets", type=budget_list, default=[16, 64, 256])
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--max-new-tokens", type=positive_int, default=64)
    parser.add_argument("--strict", action="store_true", help="exit 1 when any output differs (use at fp32)")
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    report = check(args)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown(report))
    differing = sum(len(c["mismatches"]) for c in report["cells"])
    return 1 if args.strict and differing else 0


if __name__ == "__main__":
    sys.exit(main())
