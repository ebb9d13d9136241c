"""Time one head-training step on a GPU: the padded batch of a step (Trainer.train_step) against one
pass per sequence, on synthetic sequences of SmolLM2's shape, or on a data directory's real ones.

    python3 -m bench.gpu.train_step_timing [FEATURE_DIR]

Run it twice side by side (and with OMP_NUM_THREADS set) to see what two trainers on one machine cost
each other: bench/results/gpu/train-2026-11-26-h100.md.
"""

import random
import sys
import time
from pathlib import Path

import torch

from sglang_jetspec.core.head_config import HeadConfig
from sglang_jetspec.train.data import Sequence, load_sequences
from sglang_jetspec.train.trainer import TrainConfig, Trainer

HIDDEN, TAPS, VOCAB = 576, 4, 49152  # SmolLM2-135M and the shipped head's four taps


def synthetic_sequences(count: int = 200) -> list[Sequence]:
    gen = torch.Generator().manual_seed(0)
    seqs = []
    for i in range(count):
        n = random.Random(i).randint(150, 400)
        seqs.append(
            Sequence(
                torch.randint(0, VOCAB - 100, (n,), generator=gen),
                n - 128,
                torch.randn(n, TAPS * HIDDEN, generator=gen).bfloat16(),
                torch.randn(n, HIDDEN, generator=gen).bfloat16(),
            )
        )
    return seqs


def mean_ms(step, device: torch.device, runs: int = 5) -> float:
    for _ in range(2):
        step()
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(runs):
        step()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / runs * 1000


def main() -> None:
    device = torch.device("cuda")
    seqs = load_sequences(Path(sys.argv[1])) if len(sys.argv) > 1 else synthetic_sequences()
    cfg = HeadConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        intermediate_size=1536,
        vocab_size=VOCAB,
        block_size=16,
        target_layer_ids=(1, 10, 18, 27),
        mask_token_id=16,
    )
    embed, lm_head = torch.nn.Embedding(VOCAB, HIDDEN).to(device), torch.nn.Linear(HIDDEN, VOCAB, bias=False).to(device)
    trainer = Trainer(
        cfg,
        TrainConfig(seqs_per_step=16, blocks_per_seq=32, position_decay=5.0),
        embed,
        lm_head,
        seqs,
        Path("/tmp/step-timing"),
        device,
    )

    def one_pass_per_sequence() -> None:
        trainer.optimizer.zero_grad()
        for seq in trainer.rng.sample(trainer.train, trainer.cfg.seqs_per_step):
            anchors = trainer._anchors(seq, trainer.rng, trainer.cfg.blocks_per_seq)
            (trainer.batch_loss([seq], [anchors])[0][0] / trainer.cfg.seqs_per_step).backward()
        trainer.optimizer.step()

    print(f"{len(seqs)} sequences, {torch.get_num_threads()} CPU threads, {torch.cuda.get_device_name(device)}")
    print(f"padded batch step: {mean_ms(trainer.train_step, device):.1f} ms")
    print(f"one pass per sequence: {mean_ms(one_pass_per_sequence, device):.1f} ms")


if __name__ == "__main__":
    main()
