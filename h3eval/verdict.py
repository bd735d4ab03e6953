"""The verdict: a run directory and a policy in, PASS / FAIL / INCONCLUSIVE out, with the reasons and the evidence.

Per candidate, per gate of the policy, and per metric of the gate, the verdict reads the per-pair gate results
(``<run>/gates/<gate>/<candidate>/<prompt_id>-s<seed>.json``, :class:`gates.base.GateResult`), computes the paired
statistics of :mod:`h3eval.stats`, and decides with the policy's thresholds. Speed is computed from the clip
records (per-request latency, paired by (prompt, seed), warm-up requests excluded).

Outcomes and how they combine:

* A metric is PASS when the CI bound on its bad side clears the threshold or margin *and* its p-value (one-sided
  t-test against the threshold or margin, Holm-adjusted across the required metrics of the same candidate, all
  gates together) is at most ``(1 - confidence) / 2``; FAIL when its point estimate is beyond the threshold or
  margin (or a single pair is beyond ``pair_limit``); INCONCLUSIVE otherwise, with the minimum detectable effect
  and the pairs needed. It is INCONCLUSIVE, never PASS, when the gate has no results, pairs are missing or fewer than
  ``min_pairs``, a value is NaN, the direction the gate wrote contradicts the policy, or a floor-relative
  threshold has no floor.
* A gate is FAIL if a required metric (or its flag check) is FAIL, else INCONCLUSIVE if one is INCONCLUSIVE, else
  PASS. A candidate combines its required gates and the speed check the same way; the run combines candidates.
* An active waiver turns the FAIL / INCONCLUSIVE it covers into PASS and says so; an expired one is ignored, with a
  warning.

Exit codes (:data:`EXIT_CODES`): 0 PASS, 1 FAIL, 2 INCONCLUSIVE, 3 a usage or input error.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gates.base import GateResult, known_gates
from h3.atomic import atomic_write_json, sha256_file
from h3.record import ClipRecord
from h3eval import stats as S
from h3eval.policy import (
    SPEED_GATE,
    GatePolicy,
    LoadedPolicy,
    MetricPolicy,
    NoiseFloor,
    PolicyError,
    Waiver,
    load_floor,
    registry_problems,
    resolve_floor_path,
    resolve_threshold,
    today_utc,
)
from h3eval.store import RunManifest, RunStore, StoreError, clip_stem

logger = logging.getLogger(__name__)

VERDICT_VERSION = 1
VERDICT_SCHEMA = "h3eval.verdict"

Outcome = Literal["PASS", "FAIL", "INCONCLUSIVE"]
EXIT_CODES: dict[str, int] = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 2}
EXIT_USAGE = 3
WORST_SHOWN = 3
"""How many worst pairs a metric verdict links as evidence."""


class VerdictInputError(ValueError):
    """The run directory or the policy cannot be judged at all (exit 3)."""


def combine(outcomes: list[str]) -> Outcome:
    """FAIL beats INCONCLUSIVE beats PASS; nothing to combine is INCONCLUSIVE (never a silent PASS)."""
    if not outcomes:
        return "INCONCLUSIVE"
    if "FAIL" in outcomes:
        return "FAIL"
    if "INCONCLUSIVE" in outcomes:
        return "INCONCLUSIVE"
    return "PASS"


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
    reasons: list[str] = Field(default_factory=list)
    gates: list[GateVerdict] = Field(default_factory=list)
    speed: SpeedVerdict | None = None


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
    candidates: list[CandidateVerdict] = Field(default_factory=list)
    settings: Settings
    inputs: InputHashes
    versions: dict[str, str] = Field(default_factory=dict)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


# -- reading the run -----------------------------------------------------------------------------------------------
class _LoadedResult:
    __slots__ = ("prompt_id", "seed", "rel", "result", "problem")

    def __init__(self, prompt_id: str, seed: int, rel: str, result: GateResult | None, problem: str | None):
        self.prompt_id, self.seed, self.rel, self.result, self.problem = prompt_id, seed, rel, result, problem


def _rel(run: Path, path: Path) -> str:
    return path.relative_to(run).as_posix()


def _load_results(
    run: Path, gate: str, candidate: str, baseline: str, expected: list[tuple[str, int]], hashes: dict[str, str]
) -> tuple[dict[tuple[str, int], _LoadedResult], list[str], int]:
    """Result of each expected pair (absent key = no file), stray-file warnings, and files found."""
    directory = run / "gates" / gate / candidate
    out: dict[tuple[str, int], _LoadedResult] = {}
    warnings: list[str] = []
    expected_set = {clip_stem(p, s): (p, s) for p, s in expected}
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    for path in files:
        rel = _rel(run, path)
        stem = path.stem
        if stem not in expected_set:
            warnings.append(f"{rel} is not a pair of this run's manifest; ignored")
            continue
        prompt_id, seed = expected_set[stem]
        hashes[rel] = sha256_file(path)
        try:
            # json.loads accepts NaN; GateResult keeps it so that the verdict can name it (never dropped).
            result = GateResult.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except (ValidationError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            first = str(exc).splitlines()[0]
            out[(prompt_id, seed)] = _LoadedResult(
                prompt_id, seed, rel, None, f"{rel} is not a valid gate result: {first}"
            )
            continue
        problem = None
        if result.gate != gate:
            problem = f"{rel} says gate {result.gate!r}, not {gate!r}"
        elif (result.pair.candidate, result.pair.baseline, result.pair.prompt_id, result.pair.seed) != (
            candidate, baseline, prompt_id, seed
        ):
            problem = f"{rel} is for pair {result.pair.model_dump()}, not ({baseline} vs {candidate}, {stem})"
        elif result.status == "error":
            problem = f"gate error: {result.error or 'no reason given'}"
        elif result.status == "not_applicable":
            problem = f"not applicable: {result.error or result.info.get('reason', 'no reason given')}"
        out[(prompt_id, seed)] = _LoadedResult(prompt_id, seed, rel, result, problem)
    return out, warnings, len(files)


def _waiver_for(
    waivers: list[Waiver], gate: str, metric: str | None, candidate: str, today: dt.date, warnings: list[str]
) -> Waiver | None:
    for w in waivers:
        if not w.covers(gate, metric, candidate) or (metric is None) != (w.metric is None):
            continue
        if w.active(today):
            return w
        warnings.append(f"waiver by {w.owner} ({w.reason}) expired on {w.expires.isoformat()}; not applied")
    return None


def _apply_waiver(outcome: Outcome, waiver: Waiver | None) -> tuple[Outcome, WaiverApplied | None]:
    if waiver is None or outcome == "PASS":
        return outcome, None
    return "PASS", WaiverApplied(owner=waiver.owner, reason=waiver.reason, expires=waiver.expires, raw_outcome=outcome)


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


# -- metrics -------------------------------------------------------------------------------------------------------
class _MetricWork:
    """A metric verdict under construction: numbers gathered, stats computed, decision pending Holm."""

    def __init__(self, mv: MetricVerdict, mp: MetricPolicy, summary: S.DeltaSummary | None, values: np.ndarray | None):
        self.mv, self.mp, self.summary, self.values = mv, mp, summary, values
        self.power = S.DEFAULT_POWER


def _gather_metric(
    gate: str,
    metric: str,
    mp: MetricPolicy,
    candidate: str,
    gp: GatePolicy,
    policy_min_pairs: int,
    expected: list[tuple[str, int]],
    results: dict[tuple[str, int], _LoadedResult],
    floor: NoiseFloor | None,
    settings: Settings,
) -> _MetricWork:
    mv = MetricVerdict(
        gate=gate, metric=metric, candidate=candidate, compare=mp.compare, direction=mp.direction,
        required=mp.required, outcome="INCONCLUSIVE", raw_outcome="INCONCLUSIVE", n_expected=len(expected),
    )
    key = f"{gate}.{metric}"
    threshold_spec = (mp.max if mp.max is not None else mp.min) if mp.compare == "pair" else mp.margin
    if threshold_spec is not None:
        res = resolve_threshold(threshold_spec, key, floor)
        mv.threshold, mv.threshold_source = res.value, res.source
        if res.value is None:
            mv.reasons.append(f"threshold unknown: {res.source}")
    if mp.pair_limit is not None:
        res = resolve_threshold(mp.pair_limit, key, floor)
        mv.pair_limit = res.value
        if res.value is None:
            mv.reasons.append(f"pair_limit unknown: {res.source}")

    pairs: list[PairValue] = []
    missing: list[str] = []
    nan_files: list[str] = []
    conflicts: list[str] = []
    seen_metric = False
    other_names: set[str] = set()
    for prompt_id, seed in expected:
        stem = clip_stem(prompt_id, seed)
        lr = results.get((prompt_id, seed))
        if lr is None:
            missing.append(f"{stem}: no result file")
            continue
        if lr.problem is not None or lr.result is None:
            missing.append(f"{stem}: {lr.problem}")
            continue
        result = lr.result
        other_names.update(result.metrics)
        m = result.metrics.get(metric)
        value: float | None = None
        base_value: float | None = None
        if m is not None:
            seen_metric = True
            if m.higher_is_better != mp.higher_is_better:
                conflicts.append(lr.rel)
            value = m.value
        if mp.compare == "sides":
            bm = result.metrics.get(mp.baseline_key(metric))
            if bm is not None:
                if bm.higher_is_better != mp.higher_is_better:
                    conflicts.append(lr.rel)
                base_value = bm.value
        # A pair the gate short-circuited as bit-identical: its delta is 0 by definition; a pair metric takes the
        # value the policy declares for identical clips (never guessed).
        if result.identical and value is None:
            if mp.compare == "pair" and mp.identical_value is not None:
                value = mp.identical_value
                seen_metric = True
            elif mp.compare in ("sides", "delta"):
                seen_metric = True
                pairs.append(PairValue(prompt_id=prompt_id, seed=seed, value=None, delta=0.0, file=lr.rel,
                                       artifacts=result.artifacts))
                continue
        if value is None or (mp.compare == "sides" and base_value is None):
            why = "value is null" if m is not None else "metric absent"
            if mp.compare == "sides" and base_value is None and value is not None:
                why = f"baseline score {mp.baseline_key(metric)!r} absent or null"
            missing.append(f"{stem}: {why} ({lr.rel})")
            continue
        if not math.isfinite(value) or (base_value is not None and not math.isfinite(base_value)):
            nan_files.append(lr.rel)
            continue
        pairs.append(PairValue(prompt_id=prompt_id, seed=seed, value=value, baseline_value=base_value, file=lr.rel,
                               artifacts=result.artifacts))

    mv.pairs = pairs
    mv.n_pairs = len(pairs)
    min_pairs = mp.min_pairs or gp.min_pairs or policy_min_pairs
    if not seen_metric:
        have = ", ".join(sorted(other_names)) or "none (no usable result)"
        mv.reasons.append(
            f"no result of gate {gate!r} for {candidate!r} has metric {metric!r} (metrics present: {have})"
        )
    if nan_files:
        mv.reasons.append(f"NaN or infinite value in {len(nan_files)} result(s): {', '.join(nan_files[:5])}")
    if conflicts:
        mv.reasons.append(
            f"the gate declares the opposite direction to the policy ({mp.direction}) in {len(set(conflicts))} "
            f"result(s), e.g. {conflicts[0]}: metadata contradiction, not judged"
        )
    if len(missing) > gp.max_missing:
        shown = "; ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        mv.reasons.append(
            f"{metric} missing on {len(missing)} of {len(expected)} expected pairs "
            f"(max_missing {gp.max_missing}): {shown}"
        )
    elif missing:
        mv.warnings.append(f"{len(missing)} pair(s) without a value (within max_missing): {'; '.join(missing[:5])}")
    if len(pairs) < min_pairs:
        mv.reasons.append(f"only {len(pairs)} usable pair(s); the policy needs at least {min_pairs}")
    if mv.reasons:
        return _MetricWork(mv, mp, None, None)

    values = np.array([p.value if p.value is not None else np.nan for p in pairs])
    try:
        if mp.compare == "pair":
            deltas = _pair_room(values, mp, mv.threshold)
        elif mp.compare == "sides":
            cand = values
            base = np.array([p.baseline_value if p.baseline_value is not None else np.nan for p in pairs])
            identical = np.isnan(cand)
            if mp.binary:
                S.check_binary(cand[~identical], f"{key} (candidate)")
                S.check_binary(base[~identical], f"{key} (baseline)")
            deltas = np.where(identical, 0.0, (cand - base) * (1 if mp.higher_is_better else -1))
        else:
            raw = np.where(np.isnan(values), 0.0, values)
            deltas = S.orient(raw, mp.higher_is_better)
            if mp.binary and not np.isin(deltas, (-1.0, 0.0, 1.0)).all():
                raise S.StatsInputError(f"{key}: a 0/1 metric's deltas must be -1, 0 or 1")
        for p, d in zip(pairs, deltas):
            p.delta = float(d)
        margin = 0.0 if mp.compare == "pair" else float(mv.threshold)  # type: ignore[arg-type]
        summary = S.summarize_deltas(
            deltas, margin, binary=mp.binary, confidence=settings.confidence, power=settings.power,
            n_resamples=settings.n_resamples, seed=settings.seed,
        )
    except S.StatsInputError as exc:
        mv.reasons.append(str(exc))
        return _MetricWork(mv, mp, None, None)
    mv.stats = _summary_dict(summary, mp, mv.threshold)
    return _MetricWork(mv, mp, summary, values)


def _pair_room(values: np.ndarray, mp: MetricPolicy, threshold: float | None) -> np.ndarray:
    """Room left to the threshold per pair, oriented (positive = inside). Without a threshold: oriented values."""
    reference = threshold if threshold is not None else 0.0
    return (values - reference) if mp.higher_is_better else (reference - values)


def _summary_dict(summary: S.DeltaSummary, mp: MetricPolicy, threshold: float | None) -> dict[str, Any]:
    data = asdict(summary)
    if mp.compare == "pair" and threshold is not None:
        # For a pair metric the "delta" is the room left to the threshold: its signs say within / beyond.
        word = "min" if mp.higher_is_better else "max"
        data["signs"]["describe"] = (f"within {word} {threshold:.4g} on {summary.signs.better + summary.signs.tied}, "
                                     f"beyond on {summary.signs.worse} of {summary.n}")
    else:
        data["signs"]["describe"] = summary.signs.describe()
    return data


def _decide_metric(work: _MetricWork, alpha: float) -> None:
    """Set the raw outcome of a metric whose statistics are computed (Holm p already set)."""
    mv, mp, s = work.mv, work.mp, work.summary
    assert s is not None and work.values is not None
    decisive_p = mv.p_holm if mv.p_holm is not None else mv.p_value
    p_ok = decisive_p is None or decisive_p <= alpha
    holm_note = f"Holm-adjusted p {_fmt(mv.p_holm)}" if mv.p_holm is not None else f"p {_fmt(mv.p_value)}"
    outcomes: list[str] = []
    signs = s.signs.describe()
    if mp.compare == "pair":
        bad = "above" if not mp.higher_is_better else "below"
        mean_v = float(np.mean(work.values))
        # CI of the mean value from the CI of the room: value = threshold -/+ room.
        t = mv.threshold
        if t is not None:
            if mp.higher_is_better:
                mv.ci_low, mv.ci_high = t + s.ci.low, t + s.ci.high
            else:
                mv.ci_low, mv.ci_high = t - s.ci.high, t - s.ci.low
        else:
            ci = S.mean_ci(work.values, confidence=s.ci.confidence, n_resamples=max(999, s.ci.n_resamples))
            mv.ci_low, mv.ci_high = ci.low, ci.high
        mv.mean_value = mean_v
        if t is not None:
            word = "max" if not mp.higher_is_better else "min"
            bound = mv.ci_high if not mp.higher_is_better else mv.ci_low
            over = s.signs.worse
            if s.mean <= 0:
                outcomes.append("FAIL")
                mv.reasons.append(
                    f"mean {_fmt(mean_v)} is {bad} {word} {_fmt(t)} ({over} of {s.n} pairs {bad} it); "
                    f"{int(s.ci.confidence * 100)}% CI [{_fmt(mv.ci_low)}, {_fmt(mv.ci_high)}]"
                )
            elif s.ci.low > 0 and p_ok:
                outcomes.append("PASS")
                mv.reasons.append(
                    f"mean {_fmt(mean_v)}, CI bound {_fmt(bound)} within {word} {_fmt(t)} ({holm_note})"
                )
            else:
                outcomes.append("INCONCLUSIVE")
                gap = s.mean
                needed = S.pairs_needed(s.sd, gap, alpha=alpha, power=work.power) if gap > 0 else None
                if s.ci.low > 0:  # the CI clears it; the multiplicity-adjusted test does not
                    mv.reasons.append(f"mean {_fmt(mean_v)} and its CI bound {_fmt(bound)} are within {word} "
                                      f"{_fmt(t)}, but the {holm_note} exceeds {_fmt(alpha)}")
                else:
                    mv.reasons.append(f"mean {_fmt(mean_v)} is within {word} {_fmt(t)} but the CI bound "
                                      f"{_fmt(bound)} is not ({holm_note})")
                mv.warnings.append(
                    f"sample size: {s.n} pairs resolve a shift of {_fmt(s.mde)} at power {work.power}; the gap "
                    f"to the threshold is {_fmt(gap)}" + (f"; about {needed} pairs would resolve it" if needed else "")
                )
        if mv.pair_limit is not None:
            limit = mv.pair_limit
            beyond = [p for p in mv.pairs if (p.value < limit if mp.higher_is_better else p.value > limit)]
            if beyond:
                outcomes.append("FAIL")
                shown = ", ".join(f"{clip_stem(p.prompt_id, p.seed)}={_fmt(p.value)}" for p in beyond[:5])
                mv.reasons.append(f"{len(beyond)} of {s.n} pair(s) {bad} pair_limit {_fmt(mv.pair_limit)}: {shown}")
            else:
                outcomes.append("PASS")
        order = sorted(mv.pairs, key=lambda p: p.value if mp.higher_is_better else -p.value)  # type: ignore[operator]
    else:
        margin = float(mv.threshold)  # type: ignore[arg-type]
        mv.mean_value, mv.ci_low, mv.ci_high = s.mean, s.ci.low, s.ci.high
        detail = f"{signs}; Wilcoxon p {_fmt(s.wilcoxon.pvalue)}"
        if s.mcnemar is not None:
            detail += (f"; McNemar exact p {_fmt(s.mcnemar.pvalue)} ({s.mcnemar.regressed} regressed, "
                       f"{s.mcnemar.improved} improved)")
        ci_text = f"{int(s.ci.confidence * 100)}% CI [{_fmt(s.ci.low)}, {_fmt(s.ci.high)}]"
        if s.mean <= -margin:
            outcomes.append("FAIL")
            mv.reasons.append(
                f"mean delta {_fmt(s.mean)} is worse than the margin -{_fmt(margin)} ({ci_text}; {detail})"
            )
        elif s.noninferiority.holds and p_ok:
            outcomes.append("PASS")
            mv.reasons.append(
                f"non-inferior: lower bound {_fmt(s.ci.low)} > -{_fmt(margin)} ({ci_text}; {holm_note}; "
                f"TOST p {_fmt(s.noninferiority.tost_p)}; {detail})"
            )
            if s.wilcoxon.pvalue <= 2 * alpha and s.signs.worse > s.signs.better:
                mv.warnings.append(f"consistently worse ({detail}) though within the margin")
        else:
            outcomes.append("INCONCLUSIVE")
            if s.noninferiority.holds:  # the CI clears the margin; the multiplicity-adjusted test does not
                mv.reasons.append(
                    f"lower bound {_fmt(s.ci.low)} clears -{_fmt(margin)} but the {holm_note} exceeds {_fmt(alpha)} "
                    f"({ci_text}; {detail})"
                )
            else:
                mv.reasons.append(
                    f"mean delta {_fmt(s.mean)} is within the margin -{_fmt(margin)} but the lower bound "
                    f"{_fmt(s.ci.low)} is not ({ci_text}; {holm_note}; {detail})"
                )
        if s.underpowered:
            mv.warnings.append(
                f"sample size: {s.n} pairs resolve only shifts of {_fmt(s.mde)} or more at power {work.power} "
                f"(sd {_fmt(s.sd)}), larger than the margin {_fmt(margin)}"
                + (f"; about {s.pairs_needed} pairs would resolve it" if s.pairs_needed else "")
            )
        order = sorted(mv.pairs, key=lambda p: p.delta if p.delta is not None else 0.0)
    mv.worst = order[:WORST_SHOWN]
    mv.evidence = list(dict.fromkeys([p.file for p in mv.worst] + [a for p in mv.worst for a in p.artifacts]))
    mv.raw_outcome = combine(outcomes)


# -- run-level test of per-pair p-values (issue 19) ------------------------------------------------------------------
def _run_test(gv: GateVerdict, gp: GatePolicy, usable: dict[tuple[str, int], _LoadedResult],
              expected: list[tuple[str, int]], min_pairs: int) -> Outcome:
    """FAIL when Benjamini-Hochberg over the pairs' p-values finds a discovery; INCONCLUSIVE when a p-value is absent
    or not in [0, 1] (never read as a pass), pairs are missing or too few; else PASS."""
    rt = gp.run_test
    assert rt is not None
    values, keys, bad = [], [], []
    for (prompt_id, seed), lr in sorted(usable.items()):
        m = lr.result.metrics.get(rt.metric) if lr.result is not None else None
        v = None if m is None else m.value
        if v is None or not math.isfinite(v) or not 0.0 <= v <= 1.0:
            bad.append(f"{clip_stem(prompt_id, seed)}: {rt.metric} = {v} ({lr.rel})")
            continue
        values.append(v)
        keys.append(lr)
    test = S.ghost_run_test(values, rt.fdr)
    named = [f"{clip_stem(keys[i].prompt_id, keys[i].seed)} (p {values[i]:.3g})" for i in test.discoveries]
    text = f"{rt.metric}: Benjamini-Hochberg at FDR {rt.fdr} over {test.n} pairs, Simes p {test.run_p_value:.3g}"
    if test.fail:
        gv.flagged = named
        gv.evidence.extend(keys[i].rel for i in test.discoveries)
        gv.reasons.append(f"{text}: {len(named)} pair(s) are discoveries: " + ", ".join(named[:5]))
        return "FAIL"
    problems = bad[:5]
    if len(expected) - len(usable) > gp.max_missing:
        problems.append(f"{len(expected) - len(usable)} of {len(expected)} expected pairs have no usable result")
    if len(values) < min_pairs:
        problems.append(f"only {len(values)} pair(s) with a p-value; the policy needs at least {min_pairs}")
    if problems or bad:
        gv.reasons.append(f"{text}: no discovery, but " + "; ".join(problems))
        return "INCONCLUSIVE"
    gv.reasons.append(f"{text}: no discovery")
    return "PASS"


# -- speed ---------------------------------------------------------------------------------------------------------
def _load_record(store: RunStore, recipe: str, prompt_id: str, seed: int) -> tuple[ClipRecord | None, str | None]:
    path = store.record_path(recipe, prompt_id, seed)
    if not path.exists():
        return None, f"{recipe}/{clip_stem(prompt_id, seed)}: no clip record"
    try:
        return ClipRecord.model_validate_json(path.read_text(encoding="utf-8")), None
    except (ValidationError, UnicodeDecodeError) as exc:
        return None, f"{_rel(store.root, path)} is not a valid clip record: {str(exc).splitlines()[0]}"


def speed_verdict(
    store: RunStore, manifest: RunManifest, candidate: str, loaded: LoadedPolicy, settings: Settings,
    expected: list[tuple[str, int]],
) -> SpeedVerdict:
    """Speedup of ``candidate`` over the baseline from paired clip records (warm-up requests excluded)."""
    sp = loaded.policy.speed
    assert sp is not None and manifest.baseline is not None
    sv = SpeedVerdict(candidate=candidate, required=sp.required, outcome="INCONCLUSIVE", raw_outcome="INCONCLUSIVE",
                      latency=sp.latency, min_speedup=sp.min_speedup)
    problems: list[str] = []
    for prompt_id, seed in expected:
        base, err_b = _load_record(store, manifest.baseline, prompt_id, seed)
        cand, err_c = _load_record(store, candidate, prompt_id, seed)
        if err_b or err_c:
            problems.extend(e for e in (err_b, err_c) if e)
            continue
        assert base is not None and cand is not None
        if base.extra.get("warmup") is True or cand.extra.get("warmup") is True:
            sv.excluded_warmup += 1
            continue
        b = getattr(base.timings, sp.latency)
        c = getattr(cand.timings, sp.latency)
        if not (math.isfinite(b) and math.isfinite(c) and b > 0 and c > 0):
            problems.append(f"{clip_stem(prompt_id, seed)}: latency not a positive number ({b}, {c})")
            continue
        sv.pairs.append(SpeedPair(prompt_id=prompt_id, seed=seed, baseline_s=b, candidate_s=c))
        sv.evidence.append(_rel(store.root, store.record_path(candidate, prompt_id, seed)))
    sv.n_pairs = len(sv.pairs)
    min_pairs = sp.min_pairs or loaded.policy.min_pairs
    reasons: list[str] = []
    if problems:
        reasons.append(f"{len(problems)} pair(s) without usable timings: " + "; ".join(problems[:5]))
    if sv.n_pairs < min_pairs:
        reasons.append(f"only {sv.n_pairs} timed pair(s) (warm-up excluded: {sv.excluded_warmup}); the policy "
                       f"needs at least {min_pairs}")
    if reasons:
        sv.reasons = reasons
        return sv
    res = S.speedup([p.baseline_s for p in sv.pairs], [p.candidate_s for p in sv.pairs],
                    confidence=settings.confidence, n_resamples=settings.n_resamples, seed=settings.seed)
    sv.speedup, sv.ci_low, sv.ci_high = res.ci.estimate, res.ci.low, res.ci.high
    sv.geometric_mean_ratio, sv.median_ratio = res.geometric_mean_ratio, res.median_ratio
    sv.baseline_mean_s, sv.candidate_mean_s, sv.faster = res.baseline_mean_s, res.candidate_mean_s, res.faster
    text = (f"speedup {res.ci.estimate:.3f}x ({int(settings.confidence * 100)}% CI [{res.ci.low:.3f}, "
            f"{res.ci.high:.3f}]; {sp.latency} {res.baseline_mean_s:.3g} s -> {res.candidate_mean_s:.3g} s; faster on "
            f"{res.faster} of {res.n})")
    if res.ci.estimate < sp.min_speedup:
        sv.raw_outcome = "FAIL"
        sv.reasons.append(f"{text} is below the minimum {sp.min_speedup}x")
    elif res.ci.low >= sp.min_speedup:
        sv.raw_outcome = "PASS"
        sv.reasons.append(f"{text}; lower bound at least {sp.min_speedup}x")
    else:
        sv.raw_outcome = "INCONCLUSIVE"
        sv.reasons.append(f"{text}: the estimate clears {sp.min_speedup}x but the lower bound does not")
    return sv


# -- the whole verdict ---------------------------------------------------------------------------------------------
def _registered_gate_classes() -> dict[str, type]:
    """Registered gate classes by name, without instantiating them (a gate's constructor may load weights)."""
    import gates.base as gates_base

    names = known_gates()  # imports the built-in gate modules, which register themselves
    lookup = getattr(gates_base, "gate_class", None)
    if lookup is not None:
        return {name: lookup(name) for name in names}
    # gates.base has no public class lookup yet; its registry maps a name to the class itself.
    return {name: gates_base._REGISTRY[name] for name in names}


def _input_hashes(store: RunStore, manifest: RunManifest, loaded: LoadedPolicy, floor: NoiseFloor | None,
                  gate_hashes: dict[str, str]) -> InputHashes:
    clips: dict[str, ClipHashes] = {}
    for recipe in [manifest.baseline, *manifest.candidates]:
        if recipe is None:
            continue
        directory = store.root / "clips" / recipe
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
            if path.name.endswith(".error.json"):
                continue
            try:
                rec = ClipRecord.model_validate_json(path.read_text(encoding="utf-8"))
            except (ValidationError, UnicodeDecodeError):
                continue  # reported by the speed check where it matters; hashes list only readable records
            clips[f"{recipe}/{path.stem}"] = ClipHashes(
                mp4_sha256=rec.mp4_sha256, frames_sha256=rec.frames_sha256, pcm_sha256=rec.pcm_sha256
            )
    return InputHashes(
        run_manifest=FileHash(path="run.json", sha256=sha256_file(store.manifest_path)),
        recipes=dict(manifest.recipe_sha256),
        prompts=FileHash(path=manifest.prompts.path, sha256=manifest.prompts.sha256) if manifest.prompts else None,
        clips=clips,
        gate_results=dict(sorted(gate_hashes.items())),
        policy=FileHash(path=str(loaded.path), sha256=loaded.sha256),
        floor=FileHash(path=str(floor.path), sha256=floor.sha256) if floor else None,
    )


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("h3eval", "numpy", "scipy", "pydantic"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def compute_verdict(
    run_dir: str | Path,
    loaded: LoadedPolicy,
    *,
    floor_path: str | Path | None = None,
    today: dt.date | None = None,
) -> Verdict:
    """Judge ``run_dir`` under ``loaded``. Raises :class:`VerdictInputError` / :class:`PolicyError` (exit 3)."""
    store = RunStore(run_dir)
    try:
        manifest = store.read_manifest()
    except StoreError as exc:
        raise VerdictInputError(str(exc)) from None
    if manifest.baseline is None or manifest.prompts is None or not manifest.candidates or not manifest.seeds:
        raise VerdictInputError(
            f"{store.manifest_path}: a verdict needs a paired run (baseline, candidates, prompts and seeds); "
            f"this one has baseline={manifest.baseline!r}, candidates={manifest.candidates}, "
            f"prompts={'yes' if manifest.prompts else 'none'}, seeds={manifest.seeds}"
        )
    policy = loaded.policy
    classes = _registered_gate_classes()
    problems = registry_problems(policy, classes)
    if problems:
        raise PolicyError(f"{loaded.path}: policy does not match the registered gates:\n  " + "\n  ".join(problems))
    fpath = resolve_floor_path(loaded, floor_path)
    floor = load_floor(fpath) if fpath is not None else None

    settings = Settings(
        confidence=policy.confidence, alpha_one_sided=(1 - policy.confidence) / 2, power=policy.power,
        n_resamples=policy.n_resamples, seed=policy.seed, holm=policy.holm, today=today or today_utc(),
    )
    expected = [(p, s) for p in manifest.prompts.ids for s in manifest.seeds]
    gate_hashes: dict[str, str] = {}
    warnings: list[str] = []
    gates_root = store.root / "gates"
    present = sorted(p.name for p in gates_root.iterdir() if p.is_dir()) if gates_root.is_dir() else []
    unchecked = [g for g in present if g not in policy.gates]
    if unchecked:
        warnings.append(f"gate results present but not checked by policy {policy.name!r}: {', '.join(unchecked)}")

    candidates: list[CandidateVerdict] = []
    for candidate in manifest.candidates:
        gate_verdicts: list[GateVerdict] = []
        gate_level: dict[str, list[str]] = {}
        """Outcomes of the gate-level checks (results present, flags, missing pairs) per gate."""
        works: list[_MetricWork] = []
        for gate, gp in policy.gates.items():
            gv = GateVerdict(gate=gate, candidate=candidate, required=gp.required, outcome="INCONCLUSIVE",
                             raw_outcome="INCONCLUSIVE", n_expected=len(expected),
                             evidence=[f"gates/{gate}/{candidate}/"])
            gate_verdicts.append(gv)
            gate_level[gate] = []
            if gate not in classes and gate not in present:
                gv.reasons.append(
                    f"unknown gate {gate!r}: not registered (known: {', '.join(sorted(classes)) or 'none'}) and no "
                    f"results under gates/{gate}/ in this run"
                )
                gate_level[gate].append("INCONCLUSIVE")
                continue
            results, stray, n_files = _load_results(
                store.root, gate, candidate, manifest.baseline, expected, gate_hashes
            )
            gv.warnings.extend(stray)
            gv.n_results = n_files
            if not results:
                gv.reasons.append(f"gate {gate!r} has no results for candidate {candidate!r} in this run "
                                  f"(expected gates/{gate}/{candidate}/<prompt>-s<seed>.json)")
                gate_level[gate].append("INCONCLUSIVE")
                continue
            usable = {k: r for k, r in results.items() if r.problem is None}
            gv.n_usable = len(usable)
            for p, s in expected:
                lr = results.get((p, s))
                if lr is None:
                    gv.unusable.append(f"{clip_stem(p, s)}: no result file")
                elif lr.problem:
                    gv.unusable.append(f"{clip_stem(p, s)}: {lr.problem}")
            if gp.max_flagged is not None:
                flagged = [r for r in usable.values() if r.result is not None and r.result.flagged]
                gv.flagged = [f"{clip_stem(r.prompt_id, r.seed)}: {'; '.join(r.result.flags) or 'flagged'}"
                              for r in flagged if r.result is not None]
                gv.evidence.extend(r.rel for r in flagged)
                gv.evidence.extend(a for r in flagged if r.result is not None for a in r.result.artifacts)
                min_pairs = gp.min_pairs or policy.min_pairs
                if len(flagged) > gp.max_flagged:
                    gv.reasons.append(f"flagged on {len(flagged)} of {len(usable)} pairs (max_flagged "
                                      f"{gp.max_flagged}): " + " | ".join(gv.flagged[:5]))
                    gate_level[gate].append("FAIL")
                if len(expected) - len(usable) > gp.max_missing:
                    gv.reasons.append(f"{len(expected) - len(usable)} of {len(expected)} expected pairs have no "
                                      f"usable result (max_missing {gp.max_missing}): " + "; ".join(gv.unusable[:5]))
                    gate_level[gate].append("INCONCLUSIVE")
                elif len(usable) < min_pairs:
                    gv.reasons.append(f"only {len(usable)} usable pair(s); the policy needs at least {min_pairs}")
                    gate_level[gate].append("INCONCLUSIVE")
                else:
                    gate_level[gate].append("PASS")
            if gp.run_test is not None:
                gate_level[gate].append(_run_test(gv, gp, usable, expected, gp.min_pairs or policy.min_pairs))
            for metric, mp in gp.metrics.items():
                work = _gather_metric(gate, metric, mp, candidate, gp, policy.min_pairs, expected, results, floor,
                                      settings)
                work.power = policy.power
                works.append(work)
                gv.metrics.append(work.mv)

        # Holm across the decisive p-values of the candidate's required metrics (advisory ones: their own family).
        for family in (True, False):
            fam = [w for w in works if w.summary is not None and w.mp.required == family and w.mv.threshold is not None]
            pvals = [w.summary.noninferiority.p_value for w in fam]  # type: ignore[union-attr]
            adjusted = S.holm(pvals) if policy.holm else pvals
            for w, p, q in zip(fam, pvals, adjusted):
                w.mv.p_value, w.mv.p_holm = p, (q if policy.holm else None)
        for w in works:
            if w.summary is not None:
                _decide_metric(w, settings.alpha_one_sided)
            else:
                w.mv.raw_outcome = "INCONCLUSIVE"
            waiver = _waiver_for(policy.waivers, w.mv.gate, w.mv.metric, candidate, settings.today, w.mv.warnings)
            w.mv.outcome, w.mv.waiver = _apply_waiver(w.mv.raw_outcome, waiver)

        for gv in gate_verdicts:
            gp = policy.gates[gv.gate]
            parts = list(gate_level[gv.gate])
            parts.extend(m.outcome for m in gv.metrics if m.required)
            if gv.metrics and not any(m.required for m in gv.metrics) and gp.max_flagged is None:
                gv.warnings.append("every metric of this gate is advisory: the gate decides nothing")
                parts.append("PASS")
            # combine([]) is INCONCLUSIVE: a gate that checked nothing never passes silently.
            gv.raw_outcome = combine(parts)
            for m in gv.metrics:
                if m.outcome != "PASS":
                    gv.reasons.append(f"{m.metric}{'' if m.required else ' (advisory)'}: {m.outcome}: "
                                      + "; ".join(m.reasons))
            waiver = _waiver_for(policy.waivers, gv.gate, None, candidate, settings.today, gv.warnings)
            gv.outcome, gv.waiver = _apply_waiver(gv.raw_outcome, waiver)

        speed: SpeedVerdict | None = None
        if policy.speed is not None:
            speed = speed_verdict(store, manifest, candidate, loaded, settings, expected)
            waiver = _waiver_for(policy.waivers, SPEED_GATE, None, candidate, settings.today, speed.warnings)
            speed.outcome, speed.waiver = _apply_waiver(speed.raw_outcome, waiver)

        decisive = [g.outcome for g in gate_verdicts if g.required]
        if speed is not None and speed.required:
            decisive.append(speed.outcome)
        outcome = combine(decisive)
        reasons = [f"{g.gate}: {g.outcome}" + (f" ({g.reasons[0]})" if g.reasons else "")
                   for g in gate_verdicts if g.required and g.outcome != "PASS"]
        if speed is not None and speed.required and speed.outcome != "PASS":
            reasons.append(f"speed: {speed.outcome} ({speed.reasons[0] if speed.reasons else ''})")
        candidates.append(CandidateVerdict(candidate=candidate, outcome=outcome, reasons=reasons,
                                           gates=gate_verdicts, speed=speed))

    overall = combine([c.outcome for c in candidates])
    reasons = [f"{c.candidate}: {c.outcome}" for c in candidates]
    return Verdict(
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        run_dir=str(store.root),
        baseline=manifest.baseline,
        policy_name=policy.name,
        outcome=overall,
        exit_code=EXIT_CODES[overall],
        reasons=reasons,
        warnings=warnings,
        candidates=candidates,
        settings=settings,
        inputs=_input_hashes(store, manifest, loaded, floor, gate_hashes),
        versions=_versions(),
    )


def write_verdict(verdict: Verdict, run_dir: str | Path) -> Path:
    path = Path(run_dir) / "verdict.json"
    atomic_write_json(path, verdict.dump())
    return path


def read_verdict(path: str | Path) -> Verdict:
    path = Path(path)
    try:
        return Verdict.model_validate_json(path.read_text(encoding="utf-8"))
    except (ValidationError, OSError) as exc:
        raise VerdictInputError(f"{path} is not a readable verdict: {str(exc).splitlines()[0]}") from None


def summary_lines(verdict: Verdict) -> list[str]:
    """Short human-readable lines: overall, then each candidate and gate (for the CLI)."""
    lines = [f"{verdict.outcome}  policy {verdict.policy_name!r}, baseline {verdict.baseline!r}"]
    for c in verdict.candidates:
        lines.append(f"  {c.candidate}: {c.outcome}")
        for g in c.gates:
            tag = "" if g.required else " (advisory)"
            waived = f" [waived by {g.waiver.owner} until {g.waiver.expires}]" if g.waiver else ""
            lines.append(f"    {g.gate}{tag}: {g.outcome}{waived}")
            for reason in g.reasons:
                lines.append(f"      - {reason}")
        if c.speed is not None:
            lines.append(f"    speed: {c.speed.outcome}")
            for reason in c.speed.reasons:
                lines.append(f"      - {reason}")
    for w in verdict.warnings:
        lines.append(f"  warning: {w}")
    return lines
