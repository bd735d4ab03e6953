"""The verdict's schema: what ``verdict.json`` holds (versioned pydantic models), its outcomes and exit codes.

:mod:`h3eval.verdict.gather` reads the run into these models' numbers, :mod:`h3eval.verdict.decide` fills in the
outcomes; :func:`h3eval.verdict.compute_verdict` runs both.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

VERDICT_VERSION = 1
VERDICT_SCHEMA = "h3eval.verdict"

Outcome = Literal["PASS", "FAIL", "INCONCLUSIVE"]
EXIT_CODES: dict[str, int] = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 2}
EXIT_USAGE = 3
WORST_SHOWN = 3
"""How many worst pairs a metric verdict links as evidence."""


class VerdictInputError(ValueError):
    """The run directory or the policy cannot be judged at all (exit 3)."""


# -- the verdict schema --------------------------------------------------------------------------------------------
class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PairValue(_Model):
    """One pair's number for one metric."""

    prompt_id: str
    seed: int
    value: float | None
    """The gate's value (``pair``: the pair's value; ``sides``: the candidate clip's score; ``delta``: cand - base)."""
    baseline_value: float | None = None
    """``sides``: the baseline clip's score."""
    delta: float | None = None
    """Oriented: positive = candidate better (``pair``: threshold minus value, i.e. the room left)."""
    file: str
    """The gate result file, relative to the run directory."""
    artifacts: list[str] = Field(default_factory=list)


class WaiverApplied(_Model):
    owner: str
    reason: str
    expires: dt.date
    raw_outcome: Outcome
    """What the outcome was before the waiver."""


class MetricVerdict(_Model):
    gate: str
    metric: str
    candidate: str
    compare: str
    direction: str
    required: bool
    outcome: Outcome
    raw_outcome: Outcome
    reasons: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    threshold: float | None = None
    """Resolved ``max`` / ``min`` (pair) or margin (sides, delta)."""
    threshold_source: str | None = None
    pair_limit: float | None = None
    departed_limit: float | None = None
    """Resolved ``departed.at_least``: a pair at or beyond it drew another sample (left out of the mean)."""
    departed: list[str] = Field(default_factory=list)
    """Clip stems of the departed pairs."""
    n_pairs: int = 0
    n_expected: int = 0
    mean_value: float | None = None
    """``pair``: mean of the values; ``sides`` / ``delta``: mean oriented delta."""
    ci_low: float | None = None
    ci_high: float | None = None
    """CI of ``mean_value`` (BCa, paired, ``confidence`` two-sided)."""
    stats: dict[str, Any] | None = None
    """The full :class:`h3eval.stats.DeltaSummary` (for ``pair``, of the room left below/above the threshold)."""
    p_value: float | None = None
    """The decisive one-sided p-value before Holm."""
    p_holm: float | None = None
    p_worse: float | None = None
    """The regression test's one-sided Wilcoxon p-value that the candidate is worse (policy ``regression``)."""
    p_worse_holm: float | None = None
    regression_shift: float | None = None
    """The regression test's resolved ``min_shift``."""
    pairs: list[PairValue] = Field(default_factory=list)
    worst: list[PairValue] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)
    waiver: WaiverApplied | None = None


class GateVerdict(_Model):
    gate: str
    candidate: str
    required: bool
    outcome: Outcome
    raw_outcome: Outcome
    reasons: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    n_expected: int = 0
    n_results: int = 0
    """Result files read for this candidate (usable or not)."""
    n_usable: int = 0
    flagged: list[str] = Field(default_factory=list)
    """``<prompt>-s<seed>: flag; flag`` of each flagged pair."""
    unusable: list[str] = Field(default_factory=list)
    """``<prompt>-s<seed>: why`` of each expected pair without a usable result."""
    metrics: list[MetricVerdict] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)
    waiver: WaiverApplied | None = None


class SpeedPair(_Model):
    prompt_id: str
    seed: int
    baseline_s: float
    candidate_s: float


class SpeedVerdict(_Model):
    candidate: str
    required: bool
    outcome: Outcome
    raw_outcome: Outcome
    reasons: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    latency: str
    min_speedup: float
    reference: str | None = None
    """The recipe the speedup is against when it is not the baseline (a ladder's rung: its parent)."""
    judged: Literal["min_speedup", "non_inferiority"] = "min_speedup"
    """``min_speedup``: a candidate meant to be faster; ``non_inferiority``: one meant to be no slower (the policy's
    ``no_slower``), held against ``1 - margin``."""
    bound: float | None = None
    """The speedup the CI was held against: ``min_speedup``, or ``1 - margin`` for non-inferiority."""
    n_pairs: int = 0
    excluded_warmup: int = 0
    speedup: float | None = None
    """``mean(baseline latency) / mean(candidate latency)``."""
    ci_low: float | None = None
    ci_high: float | None = None
    geometric_mean_ratio: float | None = None
    median_ratio: float | None = None
    baseline_mean_s: float | None = None
    candidate_mean_s: float | None = None
    faster: int | None = None
    pairs: list[SpeedPair] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)
    waiver: WaiverApplied | None = None


class CandidateVerdict(_Model):
    candidate: str
    outcome: Outcome
    judge: str | None = None
    """The signoff kind whose judge was used (``exact``, ``near``, ``resample``), or None for a policy without judges
    or a recipe that declares no kind."""
    judge_reason: str | None = None
    """Which judge and why: the recipe's declaration and the policy's reason for judging that kind so."""
    reasons: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    gates: list[GateVerdict] = Field(default_factory=list)
    speed: SpeedVerdict | None = None
    judged_against: str | None = None
    """The recipe the candidate was compared with (None: the run's baseline; a ladder's rung: its parent)."""
    judge_source: Literal["declared", "lineage", "ladder top"] | None = None
    """``declared``: the recipe's [signoff] kind against the baseline; ``lineage``: the levers that differ from its
    parent (:mod:`h3eval.verdict.lineage`); ``ladder top``: the levers that differ from the baseline, for the top of a
    ladder."""
    lever_differences: list[dict[str, Any]] = Field(default_factory=list)
    """The levers that differ from the recipe it was compared with (lever, kind, why), when judged by lineage."""
    against_baseline: "CandidateVerdict | None" = None
    """The top of a ladder judged against the baseline as well; the candidate's outcome combines both."""
    own_outcome: Outcome | None = None
    """The outcome against its parent alone, when ``against_baseline`` is set."""
    detectable: list[dict[str, Any]] = Field(default_factory=list)
    """Per required metric with statistics: the smallest regression this run could detect at its size (``mde``: the
    true mean shift a one-sided paired t-test at the policy's alpha finds with the policy's ``power``, given the pairs'
    spread), beside the margin or threshold it is held against (``resolves``: mde <= margin)."""
    floor: FileHash | None = None
    """The noise-floor file its floor-relative thresholds were read against: against its parent, the parent's own
    new-seed floor (``<run>/floors/<parent>/floor.json``) when the run has it; else the run's (the baseline's)."""
    executed_flags: list[str] = Field(default_factory=list)
    """Configured versus executed (:func:`h3eval.executed.run_executed_flags`): what ran as the recipe asked yet is a
    known recipe bug (a cache's hit count, a LoRA's effective scale more than 2x off, a partial ``lora.include``,
    sparse attention on the audio stream, quantization on few linears), each with the clips it was raised on. They
    do not decide the outcome; they say why it should be read with care."""


class LadderRung(_Model):
    """One rung of a ladder (seed 000's stage table): the candidate against the rung below it."""

    candidate: str
    below: str
    judge: str | None = None
    levers: list[str] = Field(default_factory=list)
    outcome: Outcome
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    quality: str = ""
    """The judge's gates and their outcomes (``fidelity PASS, ghosting FAIL``)."""


class FileHash(_Model):
    path: str
    sha256: str


class ClipHashes(_Model):
    mp4_sha256: str
    frames_sha256: str
    pcm_sha256: str


class InputHashes(_Model):
    """The hash of every input the verdict read, so a verdict names exactly what it judged."""

    run_manifest: FileHash
    recipes: dict[str, str] = Field(default_factory=dict)
    """Recipe name -> sha256 of the resolved recipe (from run.json)."""
    prompts: FileHash | None = None
    clips: dict[str, ClipHashes] = Field(default_factory=dict)
    """``<recipe>/<prompt>-s<seed>`` -> hashes from its clip record."""
    gate_results: dict[str, str] = Field(default_factory=dict)
    """Result file (relative to the run) -> sha256."""
    policy: FileHash
    floor: FileHash | None = None


class Settings(_Model):
    confidence: float
    alpha_one_sided: float
    power: float
    n_resamples: int
    seed: int
    holm: bool
    today: dt.date
    """The date waivers were checked against (UTC)."""


class Verdict(_Model):
    """The signoff of one run under one policy. Versioned; ``verdict.json`` holds it."""

    schema_name: Literal["h3eval.verdict"] = Field(default=VERDICT_SCHEMA, alias="schema")
    version: int = VERDICT_VERSION
    """Schema version of this file."""
    created_at: str
    run_dir: str
    baseline: str
    policy_name: str
    outcome: Outcome
    exit_code: int
    reasons: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    notices: list[str] = Field(default_factory=list)
    """What the run's weights make of the verdict (``"random weights: speed and memory are real, quality is not"``
    for the ``h3-random`` presets): shown first wherever the verdict is."""
    candidates: list[CandidateVerdict] = Field(default_factory=list)
    ladder: list[LadderRung] = Field(default_factory=list)
    """Each candidate with a parent in the run, against the rung below it, baseline first (empty: no ladder)."""
    settings: Settings
    inputs: InputHashes
    versions: dict[str, str] = Field(default_factory=dict)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)
