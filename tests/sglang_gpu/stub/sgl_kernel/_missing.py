"""One factory for the stand-in's names that must exist at import but never run (see __init__)."""

from __future__ import annotations


class MissingOp:
    """Importable, never callable: calling it names the op and the switch that should have avoided it."""

    def __init__(self, qualname: str) -> None:
        self.qualname = qualname
        self.__name__ = qualname.rsplit(".", 1)[-1]

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{self.qualname} is not provided by the test-only GPU stand-in for sgl-kernel: the run "
            "must use SGLANG_FORCE_FUSED_OP_BACKEND=torch, --sampling-backend pytorch and "
            "--attention-backend triton, whose paths never call it"
        )

    def __repr__(self) -> str:
        return f"<stand-in {self.qualname}>"


def missing(qualname: str) -> MissingOp:
    return MissingOp(qualname)
