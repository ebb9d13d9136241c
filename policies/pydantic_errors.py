"""Turn pydantic validation errors into operator-facing `Problem`s (what is wrong, and the fix)."""

from __future__ import annotations

import difflib
import typing

from pydantic import BaseModel, ValidationError

from policies.problems import Loc, Problem, format_loc


def _nested_model(annotation: object) -> type[BaseModel] | None:
    """The BaseModel inside an annotation such as `Gate`, `list[Cohort]` or `Probe | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def _model_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int):
            continue  # list index: the element model is already selected
        if model is None or part not in model.model_fields:
            return None
        model = _nested_model(model.model_fields[part].annotation)
    return model


def _unknown_key_fix(root: type[BaseModel], loc: Loc) -> str:
    model = _model_at(root, loc[:-1])
    allowed = sorted(model.model_fields) if model is not None else []
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
    if close:
        return f"did you mean '{close[0]}'? (allowed keys: {', '.join(allowed)})"
    return f"remove it (allowed keys: {', '.join(allowed)})"


def _describe(root: type[BaseModel], error: dict) -> tuple[str, str]:
    kind = error["type"]
    loc = tuple(error["loc"])
    where = format_loc(loc)
    given = error.get("input")
    ctx = error.get("ctx", {})
    if kind == "missing":
        return f"{where} is missing", f"add the key '{loc[-1]}' (see policies/README.md)"
    if kind == "extra_forbidden":
        parent = format_loc(loc[:-1])
        return f"unknown key '{loc[-1]}' in {parent}", _unknown_key_fix(root, loc)
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"{where} must be a whole number, got {given!r}", "write an integer such as 16"
    if kind in ("float_type", "float_parsing"):
        return f"{where} must be a number, got {given!r}", "write a number such as 0.05"
    if kind == "string_type":
        return f"{where} must be text, got {given!r}", "write a name such as bs1"
    if kind == "string_pattern_mismatch":
        return (
            f"{where} = {given!r} has characters not allowed in a metric label",
            "use letters, digits, '-', '_' or '.' only",
        )
    if kind == "list_type":
        return f"{where} must be a list, got {given!r}", "write a list such as [0, 16, 64]"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"{where} must be a mapping of keys, got {given!r}", "indent its keys under it"
    if kind == "too_short":
        return f"{where} is empty", f"list at least {ctx.get('min_length', 1)} item(s)"
    bounds = {
        "greater_than_equal": (">=", "ge"),
        "greater_than": (">", "gt"),
        "less_than_equal": ("<=", "le"),
        "less_than": ("<", "lt"),
    }
    if kind in bounds:
        op, key = bounds[kind]
        return f"{where} = {given!r} is out of range", f"use a value {op} {ctx.get(key)}"
    if kind == "literal_error":
        return f"{where} = {given!r} is not allowed", f"use one of {ctx.get('expected')}"
    return f"{where}: {error['msg']}", "see policies/README.md for the expected value"


def problems_from_validation_error(root: type[BaseModel], exc: ValidationError) -> list[Problem]:
    problems = []
    for error in exc.errors():
        message, fix = _describe(root, error)
        problems.append(Problem(tuple(error["loc"]), message, fix))
    return problems
