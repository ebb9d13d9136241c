"""The shadow record: what a worker tees about one finished request (one JSON line in the spool).

Engine-agnostic on purpose: the reference server and the SGLang worker build the same record, and
the checker needs nothing else to re-score the request on a non-speculative target.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..core.sampling import SamplingParams

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RecordSampling(_Model):
    """The request's own sampling configuration (SGLang names); temperature 0 = greedy."""

    temperature: float = Field(ge=0)
    top_p: float = Field(gt=0, le=1)
    top_k: int = Field(ge=-1)
    min_p: float = Field(ge=0, lt=1)
    seed: int | None = None
    max_new_tokens: int = Field(ge=1)
    ignore_eos: bool = False

    @classmethod
    def of(cls, params: SamplingParams) -> RecordSampling:
        """The record of `params` (every field here is a SamplingParams field of the same name)."""
        return cls(**{name: getattr(params, name) for name in cls.model_fields})

    def params(self) -> SamplingParams:
        """The core's SamplingParams, so the checker applies exactly the transforms decoding applied."""
        return SamplingParams(**self.model_dump())

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class SpecStats(_Model):
    """Speculation as it ran for this request, one entry per verify step (prefill excluded)."""

    budgets: list[int] = Field(default_factory=list, description="tree budget of each step, 0 = off")
    accept_lengths: list[int] = Field(default_factory=list, description="tokens committed per step, bonus included")


class RecordConstraint(_Model):
    """The grammar a constrained request was decoded under, as SGLang's xgrammar backend compiled it:
    what the checker needs to rebuild the allowed tokens at every output position (shadow/constraints.py)."""

    kind: Literal["json", "regex", "ebnf", "structural_tag"] = Field(description="SGLang's grammar dispatch type")
    value: str = Field(
        description="the grammar's key string: a JSON schema ('$$ANY$$' = any JSON), regex, EBNF or structural tag"
    )
    any_whitespace: bool = Field(True, description="JSON whitespace: not --constrained-json-disable-any-whitespace")
    max_whitespace_cnt: int | None = Field(None, description="--constrained-json-max-whitespace-cnt")
    stop_token_ids: list[int] = Field(description="the stop tokens the compiled grammar ends with")


class ShadowRecord(_Model):
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str
    model: str = Field(description="target identity, e.g. checkpoint path or served model name")
    head: str = Field(default="", description="draft head identity ('' = no head)")
    prompt_ids: list[int] = Field(min_length=1)
    output_ids: list[int]
    sampling: RecordSampling
    finish_reason: str = Field(description="eos | length | stop (stop-string requests may hold extra tokens)")
    spec: SpecStats = SpecStats()
    constraint: RecordConstraint | None = Field(None, description="the request's grammar (None = free text)")
    started_at: float = Field(description="Unix seconds the request was admitted")
    finished_at: float = Field(description="Unix seconds it finished")
