"""Signoff policies: which gate metrics decide a release, against which margins, with how many pairs.

A policy is a TOML file (``gates/policies/*.toml``) read with :mod:`tomllib` into a strict pydantic schema: an
unknown key anywhere, a wrong type (``true`` or ``"8"`` for a number) or a number that is not finite (``nan``, ``inf``)
is an error that names the key and its place (h3/schema.py). The gates only *report*; the policy decides.

Shape (every key documented on the schema fields below)::

    version = 1
    name = "release"
    confidence = 0.95          # two-sided CI level; non-inferiority uses its lower bound
    min_pairs = 8
    floor_file = "floor.json"  # optional; relative to the policy file (or given on the command line)

    [speed]
    min_speedup = 1.0
    latency = "generation_side_latency_s"

    [gates.integrity]
    max_flagged = 0            # flag-based gate: no flagged pair allowed

    [gates.fidelity.metrics.lpips_mean]
    compare = "pair"           # the value compares the two clips (LPIPS, SSIM): tested against a threshold
    direction = "lower_is_better"
    max = {fraction_of_floor = 0.1}

    [gates.vbench.metrics.overall_consistency]
    compare = "sides"          # each clip scored on its own: per-pair delta, non-inferiority against `margin`
    direction = "higher_is_better"
    margin = 0.01

    [[waivers]]
    gate = "ghosting"
    owner = "a.person@example.com"
    reason = "known benign flicker on prompt 7, tracked in issue 42"
    expires = 2026-12-31

Three ways a gate metric is compared (``compare``):

* ``pair``: the per-pair value already measures the pair (LPIPS, SSIM, PSNR, ghost score, audio distance). The
  *mean* over pairs, with its BCa CI, is held against ``max`` (lower is better) or ``min`` (higher is better): the
  CI bound on the bad side must stay inside the threshold. ``pair_limit`` additionally bounds every single pair.
* ``sides``: the gate scored each clip on its own (VBench). It writes the candidate clip's score as ``<metric>``
  and the baseline clip's as ``<metric>.baseline`` (change with ``baseline_metric``). Per-pair oriented deltas are
  tested for non-inferiority: the CI's lower bound must stay above ``-margin``. ``binary = true`` (0/1 per clip,
  VBench's ``dynamic_degree``) adds the exact McNemar test.
* ``delta``: the gate wrote ``candidate - baseline`` itself; tested like ``sides``.
* ``flag``: a per-clip artifact detector (``<metric>`` and ``<metric>.baseline``, lower is better). A pair is
  candidate-flagged when the ``flag`` rule flags the candidate clip and not its baseline twin; more than
  ``max_flagged_pairs`` such pairs FAIL the metric (a NaN or a missing value never hides them: it can only turn a
  PASS into INCONCLUSIVE).

Noise floors: any threshold (``max``, ``min``, ``margin``, ``pair_limit``) may be written as
``{fraction_of_floor = f}``: ``f`` times the metric's new-seed noise floor, read from a floor file (JSON) that the
policy's ``floor_file`` or the command line names. Floor file shape (written by ``h3eval floor`` through
:func:`write_floor`)::

    {
      "version": 1,
      "metrics": {"fidelity.lpips_mean": 0.41, "vbench.overall_consistency": 0.012, ...},
      ...                                   # any other keys (provenance) are allowed and ignored here
    }

where each value is the metric's size between two clips of the *same* recipe and prompt made with *different
seeds*: for a ``pair`` metric its mean over the floor run's pairs, for a per-clip score the mean absolute
difference between seeds. Keys are ``<gate>.<metric>``. A fraction whose floor is missing makes that metric
INCONCLUSIVE, never a pass.
"""

from __future__ import annotations

import datetime as dt
import logging
import tomllib
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from h3.atomic import sha256_file
from h3.schema import validation_issues
from h3eval.thresholds import (FLOOR_VERSION, BaselineFraction, FloorFraction, NoiseFloor, PolicyError,  # noqa: F401
                               Threshold, ThresholdResolution, _Strict, load_floor, resolve_threshold, write_floor)

logger = logging.getLogger(__name__)

POLICY_VERSION = 1
SPEED_GATE = "speed"
"""Name under which the speed check appears in verdicts and waivers."""

Direction = Literal["higher_is_better", "lower_is_better"]


class RegressionTest(_Strict):
    """FAIL a ``sides`` / ``delta`` metric on which the candidate is *consistently* worse, even inside the margin
    (seed 002: imaging quality "dropped on 14 of 16 clips"). The one-sided Wilcoxon signed-rank test of "the candidate
    is worse" is Holm-adjusted across the candidate's metrics that carry this test; the metric FAILs when that p-value
    is at most ``alpha`` and the mean shift is at least ``min_shift``. Under a benign candidate (deltas symmetric about
    0, e.g. fresh seeds of the baseline) this FAILs a run with probability at most ``alpha``."""

    alpha: float = Field(gt=0, lt=0.5)
    min_shift: Threshold
    """The smallest mean worsening (in the metric's units, or a fraction of its floor) that counts."""


class FlagRule(_Strict):
    """When a clip's detector statistic flags it (a ``compare = "flag"`` metric; the statistic is lower-is-better,
    so a high value is the defect). Exactly one of the three: ``above`` (the clip's value > it), ``at_least``
    (>= it), or ``above_baseline`` (the candidate clip's value > its baseline twin's: a count such as frozen frames,
    which clean clips sometimes show too)."""

    above: float | None = None
    at_least: float | None = None
    above_baseline: bool = False

    @model_validator(mode="after")
    def _one(self) -> "FlagRule":
        if (self.above is not None) + (self.at_least is not None) + self.above_baseline != 1:
            raise ValueError("a flag rule takes exactly one of `above`, `at_least` or `above_baseline = true`")
        return self

    def flags(self, value: float, baseline: float) -> tuple[bool, bool]:
        """(the candidate clip is flagged, the baseline clip is flagged); ``above_baseline`` flags one side only."""
        if self.above_baseline:
            return value > baseline, baseline > value
        if self.above is not None:
            return value > self.above, baseline > self.above
        return value >= self.at_least, baseline >= self.at_least  # type: ignore[operator]

    def describe(self) -> str:
        if self.above_baseline:
            return "above its baseline twin's"
        return f"> {self.above:g}" if self.above is not None else f">= {self.at_least:g}"


class DepartedRule(_Strict):
    """``pair``, lower is better: pairs that drew another sample (issue 50). A near recipe on a small model tips a
    rare seed into another outcome of the same prompt (INT8 over the trained tiny: one seed of 32 at 0.82 of a new
    seed's LPIPS, the others at 0.01); one such pair moves a 16-pair mean past any bound that still FAILs the
    recipes that must FAIL near. A pair at or beyond ``at_least`` is *departed*: left out of the mean (and its CI)
    that ``max`` is held against, and listed; a run with more than ``max_share`` of its pairs departed FAILs the
    metric (a recipe that draws other samples is no near change). ``pair_limit`` still sees every pair, and the
    departed clips remain judged wherever else the policy reads them (a ladder's top, resample, against the
    baseline)."""

    at_least: Threshold
    """The value (or fraction of the floor) at which a pair counts as departed."""
    max_share: float = Field(ge=0, lt=1)
    """The largest share of a run's pairs that may depart (0.125: 2 of 16)."""

    def allowed(self, n: int) -> int:
        """Departed pairs a run of ``n`` pairs may have."""
        return int(self.max_share * n + 1e-9)


class MetricPolicy(_Strict):
    """How one gate metric decides."""

    compare: Literal["pair", "sides", "delta", "flag"] = "pair"
    """``pair``: value measures the pair; ``sides``: each clip scored alone; ``delta``: gate wrote cand - base;
    ``flag``: a per-clip artifact detector, each pair flagged by :class:`FlagRule` when the candidate clip is and its
    baseline twin is not, the run FAILed when more than ``max_flagged_pairs`` pairs are."""
    flag: FlagRule | None = None
    """``flag``: when a clip is flagged."""
    max_flagged_pairs: int = Field(default=0, ge=0)
    """``flag``: the most candidate-flagged pairs a run may have (0: any flagged pair FAILs the candidate)."""
    flag_alpha: float | None = Field(default=None, gt=0, lt=0.5)
    """``flag``: a FAIL also needs the candidate flagged more often than its baseline twins beyond chance: the exact
    one-sided McNemar p of the discordant pairs (candidate-only against baseline-only) at most this. For a detector
    the model's own clean clips trip now and then, read against the baseline's rate in the same run, not pair by
    pair. None: the count alone decides."""
    direction: Direction
    """Declared direction; must agree with the ``higher_is_better`` the gate writes, else INCONCLUSIVE."""
    max: Threshold | None = None
    """``pair``, lower is better: the mean's upper CI bound must be at most this."""
    min: Threshold | None = None
    """``pair``, higher is better: the mean's lower CI bound must be at least this."""
    pair_limit: Threshold | None = None
    """``pair``: no single pair may be worse than this (FAIL names the pairs)."""
    departed: DepartedRule | None = None
    """``pair``, lower is better, with ``max``: pairs that drew another sample, left out of the mean and counted
    (:class:`DepartedRule`)."""
    margin: Threshold | None = None
    """``sides`` / ``delta``: non-inferiority margin delta >= 0 in the metric's units (lower CI bound > -delta)."""
    binary: bool = False
    """0/1 per clip (``sides`` / ``delta``): adds the exact McNemar test; values other than 0/1 are an error."""
    baseline_metric: str | None = None
    """``sides``: the name of the baseline clip's score in the gate result (default ``<metric>.baseline``)."""
    identical_value: float | None = None
    """``pair``: the value of a bit-identical pair, used when the gate short-circuited one without a value."""
    required: bool = True
    """False: advisory, reported but not deciding."""
    min_pairs: int | None = Field(default=None, ge=2)
    """Overrides the gate's / policy's ``min_pairs`` for this metric."""
    regression: RegressionTest | None = None
    """``sides`` / ``delta``: also FAIL a consistent worsening inside the margin (:class:`RegressionTest`)."""
    fail_beyond: Literal["mean", "ci"] = "mean"
    """``sides`` / ``delta``: when non-inferiority FAILs. ``mean``: the mean delta is at or beyond the margin (its
    point estimate). ``ci``: the whole CI is beyond it (inferiority shown at the CI's confidence), symmetric with the
    PASS rule (the whole CI inside); a CI that spans the margin is INCONCLUSIVE. ``ci`` lets a margin sit on the
    mean's own scale (a benign 16-pair mean moves by about a third of the per-pair floor) without a benign run's
    noise failing it."""
    description: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> "MetricPolicy":
        if self.compare == "flag" or self.flag is not None:
            return self._flag_consistent()
        if self.max_flagged_pairs or self.flag_alpha is not None:
            raise ValueError("`max_flagged_pairs` and `flag_alpha` are for compare = 'flag'")
        if self.regression is not None and self.compare == "pair":
            raise ValueError("`regression` is for compare = 'sides' or 'delta'")
        fractions = [t for t in (self.max, self.min, self.pair_limit) if isinstance(t, BaselineFraction)]
        shift = self.regression.min_shift if self.regression is not None else None
        if fractions or (self.compare != "sides" and isinstance(self.margin, BaselineFraction)) or (
                self.compare != "sides" and isinstance(shift, BaselineFraction)):
            raise ValueError("`fraction_of_baseline` is for the `margin` or regression `min_shift` of a compare = "
                             "'sides' metric (the baseline's scores are its other side)")
        if self.fail_beyond != "mean" and self.compare == "pair":
            raise ValueError("`fail_beyond` is for compare = 'sides' or 'delta'")
        if self.compare == "pair":
            if self.margin is not None or self.binary or self.baseline_metric is not None:
                raise ValueError("`margin`, `binary` and `baseline_metric` are for compare = 'sides' or 'delta'")
            if self.direction == "lower_is_better" and self.min is not None:
                raise ValueError("a lower-is-better metric takes `max`, not `min`")
            if self.direction == "higher_is_better" and self.max is not None:
                raise ValueError("a higher-is-better metric takes `min`, not `max`")
            if self.max is None and self.min is None and self.pair_limit is None:
                raise ValueError("a 'pair' metric needs `max` (lower is better) or `min` (higher), or `pair_limit`")
            if self.departed is not None and (self.direction != "lower_is_better" or self.max is None):
                raise ValueError("`departed` is for a lower-is-better 'pair' metric with `max`")
            if self.departed is not None and isinstance(self.departed.at_least, BaselineFraction):
                raise ValueError("`departed.at_least` takes a value or `fraction_of_floor`")
        else:
            if self.max is not None or self.min is not None or self.pair_limit is not None or self.departed:
                raise ValueError(f"compare = {self.compare!r} takes `margin`, not `max` / `min` / `pair_limit` / "
                                 "`departed`")
            if self.margin is None:
                raise ValueError(f"compare = {self.compare!r} needs a non-inferiority `margin`")
            if isinstance(self.margin, float) and self.margin < 0:
                raise ValueError("`margin` must be >= 0 (it is how much worse the candidate may be)")
            if self.identical_value is not None:
                raise ValueError("`identical_value` is for compare = 'pair' (a bit-identical pair has delta 0)")
        if self.compare != "sides" and self.baseline_metric is not None:
            raise ValueError("`baseline_metric` is only for compare = 'sides'")
        return self

    def _flag_consistent(self) -> "MetricPolicy":
        if self.compare != "flag" or self.flag is None:
            raise ValueError("compare = 'flag' and a `flag` rule go together")
        if self.direction != "lower_is_better":
            raise ValueError("a flag metric is lower_is_better (a high detector statistic is the defect)")
        others = {"max": self.max, "min": self.min, "pair_limit": self.pair_limit, "departed": self.departed,
                  "margin": self.margin,
                  "regression": self.regression, "identical_value": self.identical_value}
        # `fail_beyond` is left alone (h3eval.sequential sets it on every non-pair metric of an interim look): a
        # flag metric's count of flagged pairs only grows with more pairs, so it has no CI to wait for.
        given = [k for k, v in others.items() if v is not None] + (["binary"] if self.binary else [])
        if given:
            raise ValueError(f"compare = 'flag' takes `flag`, `max_flagged_pairs` and `flag_alpha`, not "
                             f"{', '.join(given)}")
        return self

    @property
    def higher_is_better(self) -> bool:
        return self.direction == "higher_is_better"

    def baseline_key(self, metric: str) -> str:
        return self.baseline_metric or f"{metric}.baseline"


class RunTestPolicy(_Strict):
    """Run-level test of a per-pair p-value the gate writes (issue 19): Benjamini-Hochberg at ``fdr`` over the pairs
    (h3eval.stats.ghost_run_test); the gate FAILs when any pair is a discovery, so a run whose pairs are all benign
    FAILs with probability at most ``fdr``."""

    metric: str
    """The gate's per-pair p-value metric (e.g. the ghosting gate's ``ghost_p_value``)."""
    fdr: float = Field(gt=0, lt=1)
    """False-discovery rate of the pairs named; the run-level false-FAIL rate under the benign null."""


class GatePolicy(_Strict):
    """The policy of one gate."""

    required: bool = True
    """False: advisory; its outcome is reported but does not decide the candidate."""
    min_pairs: int | None = Field(default=None, ge=1)
    """Fewest usable pairs for a decision (default: the policy's ``min_pairs``); fewer gives INCONCLUSIVE."""
    max_missing: int = Field(default=0, ge=0)
    """Expected pairs (from run.json) that may lack a usable result; more gives INCONCLUSIVE."""
    max_flagged: int | None = Field(default=None, ge=0)
    """Flag-based check: more flagged pairs than this is a FAIL (None: flags are reported only)."""
    metrics: dict[str, MetricPolicy] = Field(default_factory=dict)
    """Metric name (as the gate writes it) -> how it decides."""
    run_test: RunTestPolicy | None = None
    """Decide the run from the pairs' p-values (:class:`RunTestPolicy`) instead of failing on any flagged pair."""
    when_applicable: bool = False
    """True: a gate that found every pair ``not_applicable`` (e.g. prompt faithfulness on a suite without ground
    truth) decides nothing and says so; when any pair is applicable, the gate decides as usual."""
    description: str = ""

    @model_validator(mode="after")
    def _decides_something(self) -> "GatePolicy":
        if not self.metrics and self.max_flagged is None and self.run_test is None:
            raise ValueError("a gate policy needs `metrics`, `max_flagged` or `run_test`, else it can decide nothing")
        return self


class NoSlower(_Strict):
    """Candidates meant to be no slower than the baseline rather than faster (an off-identity candidate, an exact
    lever): judged for non-inferiority, the speedup's CI against ``1 - margin`` instead of ``min_speedup``."""

    margin: float = Field(gt=0, lt=1)
    """The slowdown tolerated: the bound is ``1 - margin`` (0.1: at most 10 % slower)."""
    candidates: list[str] = Field(min_length=1)
    """Candidate names, or shell-style patterns (``*-identity``: what ``h3eval ab --off-identity`` adds)."""

    def covers(self, candidate: str) -> bool:
        from fnmatch import fnmatchcase

        return any(fnmatchcase(candidate, pattern) for pattern in self.candidates)


class SpeedPolicy(_Strict):
    """The speed check: paired per-request latency, warm-up excluded.

    Symmetric: the speedup's CI wholly at or above the bound is a PASS, wholly below it a FAIL, and a CI that spans
    the bound is INCONCLUSIVE in both directions (a noisy estimate below the bound is not a FAIL, as one above it is
    not a PASS)."""

    min_speedup: float = Field(gt=0)
    """The bound for a candidate meant to be faster: ``mean(baseline) / mean(candidate)``."""
    no_slower: NoSlower | None = None
    """Candidates judged for non-inferiority instead (bound ``1 - margin``)."""
    latency: Literal["generation_side_latency_s", "request_to_file_latency_s"] = "generation_side_latency_s"
    """Which latency definition: seed 000's generation side, or seed 002's request to file."""
    min_pairs: int | None = Field(default=None, ge=2)
    required: bool = True


class Waiver(_Strict):
    """A signed, dated exception: a FAIL or INCONCLUSIVE it covers counts as a pass until it expires."""

    gate: str
    """Gate name, or ``speed``."""
    metric: str | None = None
    """One metric of the gate (None: the whole gate)."""
    candidate: str | None = None
    """One candidate recipe (None: every candidate)."""
    owner: str = Field(min_length=1)
    """Who signed the waiver."""
    reason: str = Field(min_length=1)
    expires: dt.date
    """Last day the waiver applies (UTC); from the next day on it no longer does."""

    @field_validator("owner", "reason")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    def active(self, today: dt.date) -> bool:
        return today <= self.expires

    def covers(self, gate: str, metric: str | None, candidate: str) -> bool:
        if self.gate != gate or (self.candidate is not None and self.candidate != candidate):
            return False
        return self.metric is None or self.metric == metric


SignoffKind = Literal["exact", "near", "resample"]
SIGNOFF_KINDS: tuple[str, ...] = ("exact", "near", "resample")


class JudgePolicy(_Strict):
    """How the candidates of one signoff kind (their recipe's ``[signoff] kind``) are judged: these gates on top of
    the policy's shared ``gates`` (integrity, speed...)."""

    description: str = ""
    why: str = ""
    """Why recipes of this kind are judged this way (written into the verdict and the report)."""
    gates: dict[str, GatePolicy] = Field(default_factory=dict)
    speed_required: bool | None = None
    """Overrides ``[speed] required`` for this kind (None: as the [speed] table says). An exact recipe is often a
    memory lever (offload: seed 002's block streaming) or the wiring check (identity), not a speedup."""
    warn_below_pairs: int = Field(default=16, ge=2)
    """Fewer expected pairs than this gives the candidate a power warning (seed 002: the 4-clip check pointed the
    wrong way, the 16-clip paired test reversed it)."""

    @model_validator(mode="after")
    def _decides_something(self) -> "JudgePolicy":
        if not self.gates:
            raise ValueError("a judge needs `gates`, else it decides nothing")
        return self


class Policy(_Strict):
    """A signoff policy."""

    version: int = POLICY_VERSION
    """Schema version of the policy file."""
    name: str
    description: str = ""
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    """Two-sided CI level; tests are one-sided at ``(1 - confidence) / 2``."""
    power: float = Field(default=0.8, gt=0, lt=1)
    """Power at which the minimum detectable effect is stated."""
    n_resamples: int = Field(default=9999, ge=999, le=1_000_000)
    """Bootstrap resamples; at most a million (each is a mean over the pairs: more only costs memory and time)."""
    seed: int = Field(default=20261129, ge=0, lt=2**63)
    """Seed of the bootstrap, so a verdict is reproducible bit for bit."""
    min_pairs: int = Field(default=8, ge=2)
    holm: bool = True
    """Holm-adjust the decisive p-values across the metrics of one candidate."""
    floor_file: str | None = None
    """Noise-floor JSON, relative to the policy file; the command line's ``--floor`` overrides it."""
    gates: dict[str, GatePolicy] = Field(default_factory=dict)
    """Gates every candidate is judged by."""
    judges: dict[SignoffKind, JudgePolicy] = Field(default_factory=dict)
    """Per signoff kind, the gates added for candidates of that kind (``[judges.resample.gates.reference_free]``...).
    When there are judges, a candidate whose recipe declares no kind, or a kind without a judge, is INCONCLUSIVE."""
    speed: SpeedPolicy | None = None
    waivers: list[Waiver] = Field(default_factory=list)

    def gates_for(self, kind: str | None) -> dict[str, GatePolicy]:
        """The shared gates plus the judge's of ``kind`` (only the shared ones when there is no such judge)."""
        judge = self.judges.get(kind) if kind is not None else None  # type: ignore[call-overload]
        return {**self.gates, **(judge.gates if judge else {})}

    def floor_gates(self, kinds) -> list[str]:
        """The gates whose thresholds for candidates of these signoff ``kinds`` are stated against the new-seed floor
        (a ``fraction_of_floor`` in any metric's max, min, pair limit, margin or regression shift): the gates a floor
        must measure for their verdict, in the policy's order."""
        out: list[str] = []
        for kind in kinds:
            for name, gate in self.gates_for(kind).items():
                thresholds = [t for m in gate.metrics.values()
                              for t in (m.max, m.min, m.pair_limit, m.margin,
                                        m.regression.min_shift if m.regression else None)]
                if name not in out and any(isinstance(t, FloorFraction) for t in thresholds):
                    out.append(name)
        return out

    def all_gates(self) -> dict[str, GatePolicy]:
        """Every gate any candidate may be judged by (a gate of several judges: the first judge's policy)."""
        out = dict(self.gates)
        for judge in self.judges.values():
            for name, gp in judge.gates.items():
                out.setdefault(name, gp)
        return out

    @field_validator("version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value != POLICY_VERSION:
            raise ValueError(f"unsupported policy version {value}; this h3eval reads version {POLICY_VERSION}")
        return value

    @model_validator(mode="after")
    def _checks(self) -> "Policy":
        if SPEED_GATE in self.gates or any(SPEED_GATE in j.gates for j in self.judges.values()):
            raise ValueError(f"`{SPEED_GATE}` is reserved for the [speed] table, not a gate")
        if not self.gates and not self.judges and self.speed is None:
            raise ValueError("the policy names no gate and no [speed] check: it would decide nothing")
        for kind, judge in self.judges.items():
            shared = sorted(set(judge.gates) & set(self.gates))
            if shared:
                raise ValueError(f"judges.{kind} repeats shared gate(s) {shared}: a gate is either shared or a judge's")
        every = self.all_gates()
        for i, w in enumerate(self.waivers):
            if w.gate == SPEED_GATE and (self.speed is None or w.metric is not None):
                raise ValueError(f"waivers[{i}]: a speed waiver needs a [speed] table and takes no `metric`")
            if w.gate != SPEED_GATE and w.gate not in every:
                raise ValueError(f"waivers[{i}] names gate {w.gate!r}, which the policy does not check")
            if w.metric is not None and w.gate != SPEED_GATE and not any(
                    w.metric in gp.metrics for gp in [self.gates.get(w.gate)] + [j.gates.get(w.gate)
                                                                             for j in self.judges.values()] if gp):
                raise ValueError(f"waivers[{i}] names metric {w.metric!r}, not among gate {w.gate}'s metrics")
        return self


class LoadedPolicy(BaseModel):
    model_config = ConfigDict(frozen=True)
    policy: Policy
    path: Path
    sha256: str


def _format_validation_error(path: Path, exc: ValidationError, data: Any = None) -> str:
    lines = []
    for key, kind, why in validation_issues(exc, data):
        if kind == "unknown":
            why = f"unknown key {key.rsplit('.', 1)[-1]!r}"
        elif kind == "missing":
            why = "missing (required)"
        lines.append(f"  {key or '(top level)'}: {why}")
    return f"{path}: invalid policy:\n" + "\n".join(lines)


def parse_policy(data: Mapping[str, Any], source: str | Path = "<policy>") -> Policy:
    try:
        return Policy.model_validate(dict(data))
    except ValidationError as exc:
        raise PolicyError(_format_validation_error(Path(source), exc, dict(data))) from None


def load_policy(path: str | Path, *, check_gates: bool = True) -> LoadedPolicy:
    """Read and validate a policy file; errors name the file and the offending key. With ``check_gates`` (the
    default) every gate the policy names must be a registered gate and every metric one its gate declares, with the
    same direction (:func:`registry_problems`): a misspelled gate table is an error here, naming the known gates and
    metrics, not an INCONCLUSIVE at run time (issue 51)."""
    path = Path(path)
    if path.is_dir():
        raise PolicyError(f"policy file {path} is a directory, not a TOML file")
    if not path.is_file():
        raise PolicyError(f"policy file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{path}: not valid TOML: {exc}") from None
    policy = parse_policy(data, path)
    if check_gates:
        from gates.base import gate_class, known_gates

        problems = registry_problems(policy, {name: gate_class(name) for name in known_gates()}, unknown_gates=True)
        if problems:
            raise PolicyError(f"{path}: the policy names what no gate declares:\n  " + "\n  ".join(problems))
    return LoadedPolicy(policy=policy, path=path, sha256=sha256_file(path))


def registry_problems(policy: Policy, gates: Mapping[str, Any], unknown_gates: bool = False) -> list[str]:
    """Mismatches between the policy and the gates' own declarations.

    ``gates`` maps a registered gate name to its class. Every gate class declares ``metrics``: a mapping of metric
    name -> :class:`gates.base.MetricSpec` (or a plain ``higher_is_better`` bool). Each policy metric must be declared
    by its gate, with the same direction; the baseline side of a ``sides`` metric is not declared separately. A gate
    not in ``gates`` is a problem naming the known ones with ``unknown_gates`` (:func:`load_policy`), else left to the
    verdict (no results: INCONCLUSIVE).
    """
    problems: list[str] = []
    tables = [("gates", policy.gates)] + [(f"judges.{k}.gates", j.gates) for k, j in policy.judges.items()]
    for where, gate_name, gate_policy in [(w, g, gp) for w, t in tables for g, gp in t.items()]:
        cls = gates.get(gate_name)
        if cls is None and unknown_gates:
            problems.append(f"{where}.{gate_name}: unknown gate {gate_name!r} (known gates: "
                            f"{', '.join(sorted(gates)) or 'none'})")
            continue
        if cls is None or not gate_policy.metrics:
            continue
        declared = getattr(cls, "metrics", None) or {}
        directions = dict(declared) if isinstance(declared, Mapping) else {name: None for name in declared}
        for metric, mp in gate_policy.metrics.items():
            if metric not in directions:
                problems.append(
                    f"{where}.{gate_name}.metrics.{metric}: gate {gate_name!r} has no metric {metric!r} "
                    f"(it declares: {', '.join(sorted(directions)) or 'none'})"
                )
                continue
            hib = directions[metric]
            hib = getattr(hib, "higher_is_better", hib)
            if isinstance(hib, bool) and hib != mp.higher_is_better:
                problems.append(
                    f"{where}.{gate_name}.metrics.{metric}: policy says {mp.direction} but the gate declares "
                    f"{'higher' if hib else 'lower'}_is_better"
                )
    return problems


# -- noise floor: h3eval.thresholds; the path a policy names -----------------------------------------------
def resolve_floor_path(loaded: LoadedPolicy, override: str | Path | None) -> Path | None:
    if override is not None:
        return Path(override)
    if loaded.policy.floor_file is None:
        return None
    return (loaded.path.parent / loaded.policy.floor_file).resolve()


def today_utc() -> dt.date:
    return dt.datetime.now(dt.timezone.utc).date()
