"""Training data on an accelerator: the target regenerates responses with transformers' `generate` in
large padded batches, then one padded teacher-forced pass per batch gives the features.

The reference engine (`data.regenerate`, `data.regenerate_with_features`) steps its lanes in Python,
which is what a CPU can afford; on a GPU that per-lane work, not the target, is the cost, and a batch
of hundreds of sequences per `generate` call is what keeps the device busy. Same files as the engine
path (responses.jsonl with the same job ids, teacher-forced feature shards keyed by response index),
so `load_sequences`, the manifest and training read them unchanged. Padded batches round differently
from one-sequence passes: the manifest names the backend, and each data directory holds one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..reference.prompts import encode
from ..reference.target import TargetModel
from .data import (
    RESPONSES,
    RegenerationConfig,
    finished_job_ids,
    jobs_for,
    read_responses,
    response_line,
    teacher_feature_dir,
)


def _pad_id(target: TargetModel) -> int:
    tokenizer = target.tokenizer
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(target.eos_token_ids)


def _padded(seqs: list[list[int]], pad: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """ids and attention mask [len(seqs), longest], padded on the left (for generate) or the right."""
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        cols = slice(width - len(seq), width) if left else slice(0, len(seq))
        ids[row, cols] = torch.tensor(seq)
        mask[row, cols] = 1
    return ids, mask


def _trim_at_eos(tokens: list[int], eos: frozenset[int]) -> list[int]:
    """Generated ids up to and including the first end-of-sequence token (what the engine keeps)."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1]
    return tokens


def _batches(todo: list, size: int) -> list[list]:
    """Batches of at most `size` jobs, one sampling temperature each (one sampling mode per call), similar
    prompt lengths together so little of each batch is padding."""
    batches = []
    for temperature in sorted({job[3].temperature for job in todo}):
        group = sorted(
            (job for job in todo if job[3].temperature == temperature), key=lambda job: (len(job[4]), job[0])
        )
        batches += [group[i : i + size] for i in range(0, len(group), size)]
    return batches


def regenerate_batched(
    target: TargetModel, records: list[dict], out_dir: Path, cfg: RegenerationConfig, log_every_s: float = 30.0
) -> Path:
    """Answer every job of `records` (greedy, plus cfg's sampled share) with `generate`, cfg.batch_size
    prompts per call, left-padded; resumable (finished jobs are skipped)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESPONSES
    done = finished_job_ids(path)
    todo = [
        (index, job_id, record, params, encode(record, target.tokenizer))
        for index, (job_id, record, params) in enumerate(jobs_for(records, cfg))
        if job_id not in done
    ]
    pad, eos = _pad_id(target), target.eos_token_ids
    model = target.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")  # transformers' own left-padding path for generate
    start, last_log, tokens, finished = time.time(), time.time(), 0, 0
    try:
        with open(path, "a") as fh:
            for batch in _batches(todo, cfg.batch_size):
                ids, mask = _padded([job[4] for job in batch], pad, left=True)
                width = ids.shape[1]
                temperature = batch[0][3].temperature
                if temperature > 0:
                    torch.manual_seed(cfg.seed + batch[0][0])  # reproducible per batch (not per prompt)
                    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                else:
                    sampling = {"do_sample": False}
                with torch.no_grad():
                    out = model.generate(
                        input_ids=ids.to(target.device),
                        attention_mask=mask.to(target.device),
                        max_new_tokens=cfg.max_new_tokens,
                        eos_token_id=sorted(eos),
                        pad_token_id=pad,
                        **sampling,
                    )
                for row, (index, job_id, record, params, prompt_ids) in enumerate(batch):
                    output_ids = _trim_at_eos(out[row, width:].tolist(), eos)
                    tokens += len(output_ids)
                    fh.write(json.dumps(response_line(job_id, record, params, prompt_ids, output_ids)) + "\n")
                fh.flush()
                finished += len(batch)
                if time.time() - last_log >= log_every_s:
                    last_log = time.time()
                    print(
                        f"[regenerate] {finished}/{len(todo)} sequences, {tokens} response tokens, "
                        f"{tokens / (last_log - start):.0f} tok/s",
                        flush=True,
                    )
    finally:
        model.set_attn_implementation(previous)
    return path


def featurize_batched(
    target: TargetModel,
    out_dir: Path,
    tap_layers: tuple[int, ...],
    batch_size: int,
    shard_size: int = 512,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Teacher features of every response (the `featurize` layout: features-<taps>/shard-*.safetensors,
    keyed by response index), from right-padded teacher-forced passes of `batch_size` sequences;
    resumable by shard. Right padding never changes a real row: each attends only to itself and earlier ones."""
    feature_dir = teacher_feature_dir(out_dir, tap_layers)
    feature_dir.mkdir(exist_ok=True)
    responses = read_responses(out_dir)
    pad = _pad_id(target)
    for shard_start in range(0, len(responses), shard_size):
        shard_path = feature_dir / f"shard-{shard_start // shard_size:05d}.safetensors"
        if shard_path.exists():
            continue
        chunk = sorted(
            range(shard_start, min(shard_start + shard_size, len(responses))),
            key=lambda i: len(responses[i]["prompt_ids"]) + len(responses[i]["output_ids"]),
        )
        tensors = {}
        for first in range(0, len(chunk), batch_size):
            keys = chunk[first : first + batch_size]
            seqs = [responses[i]["prompt_ids"] + responses[i]["output_ids"] for i in keys]
            ids, mask = _padded(seqs, pad, left=False)
            with torch.no_grad():
                out = target.model.model(
                    input_ids=ids.to(target.device), attention_mask=mask.to(target.device), output_hidden_states=True
                )
            # hidden_states[L + 1] is decoder layer L's output: the taps the engine reads
            taps = torch.cat([out.hidden_states[layer + 1] for layer in tap_layers], dim=-1).to(dtype).cpu()
            final = out.last_hidden_state.to(dtype).cpu()
            for row, (key, seq) in enumerate(zip(keys, seqs)):
                n = len(seq)
                tensors[f"{key}.ids"] = torch.tensor(seq, dtype=torch.int32)
                tensors[f"{key}.prompt_len"] = torch.tensor([len(responses[key]["prompt_ids"])], dtype=torch.int32)
                tensors[f"{key}.taps"] = taps[row, :n].clone()  # own storage: safetensors refuses shared ones
                tensors[f"{key}.final"] = final[row, :n].clone()
        tmp = shard_path.with_suffix(".tmp")
        save_file(tensors, str(tmp))
        tmp.replace(shard_path)
    return feature_dir
