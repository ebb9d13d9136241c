"""The per-window report (JSON file `window-NNNN.json`; its JSON schema: `WindowReport.model_json_schema()`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TestRow(_Model):
    name: str = Field(description="ks | chi2")
    statistic: float
    p_value: float
    p_holm: float = Field(description="Holm-adjusted across the window's tests")
    rejected: bool


class SequentialRow(_Model):
    tokens: int = Field(description="sampled tokens seen by the monitor since its state was created")
    log_evidence: float
    threshold: float = Field(description="log(1/alpha): crossing it raises the alarm (Ville)")
    p_value: float = Field(description="anytime-valid: 1 / largest evidence so far")
    crossed_at: int | None


class MismatchRow(_Model):
    request_id: str
    position: int
    emitted: int
    expected: int = Field(description="target argmax (most likely token for impossible ones)")
    margin: float | None = Field(description="log p(argmax) - log p(emitted), nats; null = impossible token")
    kind: str = Field(description="tie | error | impossible")


class RegenerationRow(_Model):
    request_id: str
    first_difference: int | None
    original_ids: list[int]
    regenerated_ids: list[int]
    original_text: str | None = None
    regenerated_text: str | None = None


class Counts(_Model):
    greedy: int = 0
    sampled: int = 0


class WindowReport(_Model):
    window: int
    reference: str
    alpha: float
    tie_margin: float
    generated_at: float
    first_record_at: float | None
    last_record_at: float | None
    requests: Counts
    tokens: Counts
    mismatches: dict[str, int] = Field(description="kind -> count: tie, error, impossible")
    first_divergence: dict[str, int] = Field(description="request id -> first non-tie mismatch position")
    mismatch_rows: list[MismatchRow]
    tests: list[TestRow]
    sequential: SequentialRow
    pit_histogram: list[int] = Field(description="sampled PIT counts in 20 equal bins of [0, 1]")
    pit_values: list[float] = Field(description="the window's PIT values (for the QQ plot and re-analysis)")
    acceptance_by_depth: list[float] = Field(
        description="share of speculative steps accepting >= d drafted tokens, d = 1.."
    )
    regeneration: list[RegenerationRow] = []
    incomplete_reference: int = Field(0, description="sampled requests scored on a top-N truncated distribution")
    failed: dict[str, str] = Field(default_factory=dict, description="request id -> why it could not be checked")
    alarm: bool
    alarm_reasons: list[str]
