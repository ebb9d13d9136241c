"""What the GPU stand-in's names do, from a process of its own (it must not meet the CPU stand-in's
``sgl_kernel`` of the same name in the test process): prints one JSON object."""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "stub"))

import sgl_kernel  # noqa: E402
from sgl_kernel import kvcacheio, quantization, scalar_type, utils  # noqa: E402


def _raises(op) -> str:
    try:
        op()
    except NotImplementedError as exc:
        return str(exc)
    return "no error"


def main() -> None:
    sentinel = object()
    names = {
        "sgl_kernel": sorted(sgl_kernel.__all__),
        "sgl_kernel.kvcacheio": sorted(kvcacheio.__all__),
        "sgl_kernel.quantization": sorted(quantization.__all__),
        "sgl_kernel.scalar_type": ["ScalarType", "scalar_types"],
        "sgl_kernel.utils": ["is_arch_support_pdl"],
    }
    print(
        json.dumps(
            {
                "names": names,
                "rmsnorm_error": _raises(sgl_kernel.rmsnorm),
                "transfer_error": _raises(kvcacheio.transfer_kv_per_layer),
                "weak_ref_is_identity": sgl_kernel.weak_ref_tensor(sentinel) is sentinel,
                "pdl": utils.is_arch_support_pdl(),
                "same_tag": scalar_type.scalar_types.uint4b8 is scalar_type.scalar_types.uint4b8,
                "distinct_tags": scalar_type.scalar_types.uint4b8 != scalar_type.scalar_types.uint8b128,
                "standin_file": sgl_kernel.__file__,
            }
        )
    )


if __name__ == "__main__":
    main()
