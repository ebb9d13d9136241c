"""Which code SGLang's fused ops run on a CUDA machine: prints {op: true | error} as JSON.

    [SGLANG_FORCE_FUSED_OP_BACKEND=torch] python tests/sglang_gpu/fused_dispatch_probe.py

With ``torch.cuda`` reporting a GPU (cuda_import_probe's pretence, on CPU tensors), RMSNorm,
SiluAndMul and a rotary embedding get a ``forward_cuda`` that raises; each op is then called and its
result compared with its ``forward_native``. ``true``: the call took the native path and matched it
bit for bit; otherwise the error (``forward_cuda reached`` when the CUDA path, i.e. sgl-kernel, would
have run). The GPU run sets SGLANG_FORCE_FUSED_OP_BACKEND=torch so that every op answers true.
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "stub")]

import cuda_import_probe  # noqa: E402

cuda_import_probe._pretend_cuda()

import torch  # noqa: E402
from sglang.srt.layers.activation import SiluAndMul  # noqa: E402
from sglang.srt.layers.layernorm import RMSNorm  # noqa: E402
from sglang.srt.layers.rotary_embedding import get_rope  # noqa: E402


def _trap_cuda(op) -> None:
    def forward_cuda(self, *args, **kwargs):
        raise RuntimeError("forward_cuda reached")

    type(op).forward_cuda = forward_cuda


def _same(got, want) -> bool:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    return len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def main() -> None:
    torch.manual_seed(0)
    norm = RMSNorm(64, eps=1e-5)
    act = SiluAndMul()
    rope = get_rope(16, rotary_dim=16, max_position=128, base=10000.0, is_neox_style=True, dtype=torch.float32)
    x, gate_up, positions = torch.randn(3, 64), torch.randn(3, 128), torch.tensor([0, 5, 9])
    q, k = torch.randn(3, 32), torch.randn(3, 16)
    cases = {
        "RMSNorm": (norm, lambda op: op(x), lambda op: op.forward_native(x)),
        "SiluAndMul": (act, lambda op: op(gate_up), lambda op: op.forward_native(gate_up)),
        "RotaryEmbedding": (
            rope,
            lambda op: op(positions, q.clone(), k.clone()),
            lambda op: op.forward_native(positions, q.clone(), k.clone()),
        ),
    }
    result = {}
    for name, (op, call, native) in cases.items():
        _trap_cuda(op)
        try:
            result[name] = _same(call(op), native(op))
        except RuntimeError as exc:
            result[name] = str(exc)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
