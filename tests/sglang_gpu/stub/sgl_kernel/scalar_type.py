"""Quantisation type tags: SGLang builds lookup tables of them at import (GPTQ/AWQ/Marlin), and an
unquantised target never reads one. Each tag is a distinct named object, so equality and hashing work
as the tables need."""

from __future__ import annotations


class ScalarType:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<stand-in scalar type {self.name}>"


class _ScalarTypes:
    """`scalar_types.<name>`: the same tag object for the same name."""

    def __init__(self) -> None:
        self._tags: dict[str, ScalarType] = {}

    def __getattr__(self, name: str) -> ScalarType:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._tags.setdefault(name, ScalarType(name))


scalar_types = _ScalarTypes()
