"""Plain SGLang vs NGRAM vs JETSPEC, each in the real SGLang server on this CPU (issue 16).

    python bench/sglang_cpu_compare.py --prompts humaneval --num-prompts 20 --max-new-tokens 64 \
        --concurrency 4 --json bench/results/sglang_cpu_compare.json --markdown bench/results/sglang_cpu_compare.md

Starts, in turn, a plain, an NGRAM and JETSPEC servers (the shipped head; `jetspec` under the default
policy unless JETSPEC_POLICY is set, `jetspec-hybrid` and `jetspec-hybrid-adaptive` under it with every
cohort's drafter / tree sizing changed) through the test launcher (tests/sglang_cpu/launch.py: SGLang's CPU engine,
intel_amx attention, the PyTorch stand-in for sgl-kernel's CPU ops), sends the same prompts greedy and
reports per configuration: exact matches against plain SGLang and against HF transformers greedy (with
the first divergence), tokens/s one request at a time and at the given concurrency, mean accept length
from `meta_info`, and the server's start time. The attention kernels are the stand-in's PyTorch code,
not sgl-kernel's: the ratios say how the plugin's step structure fares on this CPU, not what a CPU
build of sgl-kernel would give.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "sglang_cpu"))  # the launcher is test-only code; so is this comparison

from launch import launch  # noqa: E402
from sglang_gpu_compare import _post, first_divergence, mean_accept_length  # noqa: E402

HEAD = REPO / "sglang_jetspec" / "heads" / "smollm2-135m-instruct"
# JETSPEC under the default policy, then with every cohort's drafter and tree sizing changed
POLICY_VARIANTS = {"jetspec": {}, "jetspec-hybrid": {"drafter": "hybrid"},
                   "jetspec-hybrid-adaptive": {"drafter": "hybrid", "tree_sizing": "adaptive"}}
CONFIGS = ("plain", "ngram", *POLICY_VARIANTS)


@dataclass
class ConfigResult:
    config: str
    prompts: int
    exact_match_vs_plain: int
    exact_match_vs_hf: int
    first_divergence_vs_hf: dict[int, int]  # prompt index -> token position, for the prompts that differ
    tokens_per_s: float
    tokens_per_s_concurrent: float
    concurrency: int
    exact_match_concurrent_vs_sequential: int
    accept_length: float | None
    server_start_s: float


def server_args(config: str, model: str, dtype: str, concurrency: int, ngram_tokens: int) -> list[str]:
    base = ["--model-path", model, "--device", "cpu", "--dtype", dtype, "--attention-backend", "intel_amx",
            "--disable-cuda-graph", "--max-total-tokens", "16384", "--max-running-requests", str(max(4, concurrency)),
            "--skip-server-warmup", "--disable-radix-cache", "--disable-overlap-schedule", "--sleep-on-idle",
            "--host", "127.0.0.1", "--port", "31123"]
    if config == "ngram":
        return base + ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(ngram_tokens)]
    if config in POLICY_VARIANTS:
        return base + ["--speculative-algorithm", "JETSPEC", "--speculative-draft-model-path", str(HEAD),
                       "--disable-decode-cuda-graph"]
    return base


def policy_env(config: str, log_dir: Path) -> dict[str, str]:
    """JETSPEC_POLICY for a policy variant: the default policy with every cohort's fields overridden."""
    changes = POLICY_VARIANTS.get(config)
    if not changes:
        return {}
    import yaml

    from sglang_jetspec.adapter.policy import policy_path

    data = yaml.safe_load(policy_path().read_text())
    for cohort in data["cohorts"]:
        cohort.update(changes)
    path = log_dir / f"{config}-policy.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return {"JETSPEC_POLICY": str(path)}


def hf_greedy(model: str, prompts: list[list[int]], max_new_tokens: int, dtype: str) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    eos = AutoTokenizer.from_pretrained(model).eos_token_id
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            y = lm.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                            pad_token_id=eos)[0, len(ids):].tolist()
            out.append(y[: y.index(eos) + 1] if eos in y else y)  # SGLang's output_ids end with the EOS too
    return out


def run_config(url: str, prompts: list[list[int]], max_new_tokens: int, concurrency: int) -> tuple[list[dict], float, list[dict], float]:
    def one(ids: list[int]) -> dict:
        return _post(f"{url}/generate", {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}})

    one(prompts[0][:8])  # warm-up: first-call allocations stay out of the timings
    start = time.perf_counter()
    sequential = [one(ids) for ids in prompts]
    seq_s = time.perf_counter() - start
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        concurrent = list(pool.map(one, prompts))
    return sequential, seq_s, concurrent, time.perf_counter() - start


def tokens(replies: list[dict]) -> int:
    return sum(r["meta_info"]["completion_tokens"] for r in replies)


def markdown(results: list[ConfigResult], meta: dict) -> str:
    lines = [f"# Real SGLang on CPU: plain vs NGRAM vs JETSPEC ({meta['cpu']}, {meta['dtype']})", "",
             f"`{meta['command']}`", "",
             f"{meta['prompts']} prompts ({meta['source']}), greedy, max_new_tokens {meta['max_new_tokens']}, "
             f"SGLang {meta['sglang']}, torch {meta['torch']}, {meta['threads']} threads; attention and KV kernels are "
             "the test stand-in's PyTorch code (tests/sglang_cpu/stub), not sgl-kernel's.", "",
             f"| config | exact vs plain | exact vs HF | tok/s seq (x plain) | tok/s conc {meta['concurrency']} (x plain) "
             "| accept length | server start s |", "|---|---|---|---|---|---|---|"]
    plain = next((r for r in results if r.config == "plain"), None)
    for r in results:
        def ratio(v, p):
            return f" ({v / p:.2f}x)" if plain and p else ""
        accept = "-" if r.accept_length is None else f"{r.accept_length:.2f}"
        lines.append(f"| {r.config} | {r.exact_match_vs_plain}/{r.prompts} | {r.exact_match_vs_hf}/{r.prompts} | "
                     f"{r.tokens_per_s:.1f}{ratio(r.tokens_per_s, plain.tokens_per_s if plain else 0)} | "
                     f"{r.tokens_per_s_concurrent:.1f}{ratio(r.tokens_per_s_concurrent, plain.tokens_per_s_concurrent if plain else 0)} | "
                     f"{accept} | {r.server_start_s:.0f} |")
    if any("hybrid" in r.config for r in results):
        lines += ["", "The concurrent pass sends the sequential pass's prompts again: hybrid configs look continuations "
                  "up in the outputs their server just finished, so their concurrent column measures repeated requests, "
                  "not new ones; compare them on the sequential column."]
    diverged = [(r.config, i, at) for r in results for i, at in r.first_divergence_vs_hf.items()]
    if diverged:
        lines += ["", "First divergence from HF greedy (config, prompt, token position): "
                  + ", ".join(f"{c} #{i} @{at}" for c, i, at in diverged)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", default="humaneval", help="humaneval, or a JSONL file of `prompt` / `messages` lines")
    p.add_argument("--num-prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--model", help="target checkpoint directory (default: jetspec model fetch smollm2)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"subset of {','.join(CONFIGS)}, in this order")
    p.add_argument("--ngram-draft-tokens", type=int, default=8)
    p.add_argument("--threads", type=int, default=2, help="OMP threads of each server")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--markdown", type=Path, required=True)
    p.add_argument("--log-dir", type=Path, default=Path("bench/out/sglang-cpu-logs"))
    args = p.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        p.error(f"--configs: unknown {unknown}; choose from {','.join(CONFIGS)}")

    import sglang
    import torch
    from transformers import AutoTokenizer

    from sglang_jetspec.models.fetch import fetch
    from sglang_jetspec.reference.precision import cpu_model
    from sglang_jetspec.reference.prompts import load_prompt_ids

    model = args.model or str(fetch("smollm2"))
    prompts = load_prompt_ids(args.prompts, AutoTokenizer.from_pretrained(model), args.num_prompts)
    torch.set_num_threads(args.threads)
    hf = hf_greedy(model, prompts, args.max_new_tokens, args.dtype)
    outputs: dict[str, list[list[int]]] = {}
    results = []
    for config in configs:
        server = launch(server_args(config, model, args.dtype, args.concurrency, args.ngram_draft_tokens),
                        args.log_dir / f"{config}.log", {"OMP_NUM_THREADS": str(args.threads), **policy_env(config, args.log_dir)})
        try:
            sequential, seq_s, concurrent, conc_s = run_config(server.url, prompts, args.max_new_tokens, args.concurrency)
        finally:
            server.stop()
        outputs[config] = [list(r["output_ids"]) for r in sequential]
        vs_hf = {i: first_divergence(ref, out) for i, (ref, out) in enumerate(zip(hf, outputs[config]))}
        results.append(ConfigResult(
            config=config, prompts=len(prompts),
            exact_match_vs_plain=sum(a == b for a, b in zip(outputs[config], outputs.get("plain", [])))
            if "plain" in outputs else 0,
            exact_match_vs_hf=sum(at is None for at in vs_hf.values()),
            first_divergence_vs_hf={i: at for i, at in vs_hf.items() if at is not None},
            tokens_per_s=tokens(sequential) / seq_s, tokens_per_s_concurrent=tokens(concurrent) / conc_s,
            concurrency=args.concurrency,
            exact_match_concurrent_vs_sequential=sum(list(c["output_ids"]) == s for c, s in zip(concurrent, outputs[config])),
            accept_length=mean_accept_length(sequential), server_start_s=server.start_s))
        r = results[-1]
        print(f"[{config}] exact vs plain {r.exact_match_vs_plain}/{r.prompts}, vs HF {r.exact_match_vs_hf}/{r.prompts}, "
              f"{r.tokens_per_s:.1f} tok/s seq, {r.tokens_per_s_concurrent:.1f} tok/s at {args.concurrency}, "
              f"accept {r.accept_length}, start {r.server_start_s:.0f}s", flush=True)
    meta = {"command": "python bench/sglang_cpu_compare.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "cpu": cpu_model(), "dtype": args.dtype, "prompts": len(prompts), "source": args.prompts,
            "max_new_tokens": args.max_new_tokens, "concurrency": args.concurrency, "threads": args.threads,
            "sglang": sglang.__version__, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=2) + "\n")
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(markdown(results, meta))
    print(args.markdown.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
