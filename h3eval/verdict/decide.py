"""Deciding a verdict: outcomes from the gathered evidence and the policy (paired statistics of
:mod:`h3eval.stats`, thresholds, margins, Holm, waivers), and how outcomes combine.

Outcomes and how they combine (see :mod:`h3eval.verdict`): FAIL beats INCONCLUSIVE beats PASS; a metric, gate or
candidate that checked nothing is INCONCLUSIVE, never a silent PASS; an active waiver turns the FAIL /
INCONCLUSIVE it covers into PASS and says so.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import asdict
from typing import Any

import numpy as np

from h3eval import stats as S
from h3eval.policy import GatePolicy, MetricPolicy, Policy, SpeedPolicy, Waiver
from h3eval.store import clip_stem
from h3eval.verdict.gather import NO_TIMING_DATA, LoadedResult
from h3eval.verdict.schema import (WORST_SHOWN, GateVerdict, MetricVerdict, Outcome, Settings, SpeedVerdict,
                                   WaiverApplied)


def combine(outcomes: list[str]) -> Outcome:
    """FAIL beats INCONCLUSIVE beats PASS; nothing to combine is INCONCLUSIVE (never a silent PASS)."""
    if not outcomes:
        return "INCONCLUSIVE"
    if "FAIL" in outcomes:
        return "FAIL"
    if "INCONCLUSIVE" in outcomes:
        return "INCONCLUSIVE"
    return "PASS"


def waiver_for(
    waivers: list[Waiver], gate: str, metric: str | None, candidate: str, today: dt.date, warnings: list[str]
) -> Waiver | None:
    for w in waivers:
        if not w.covers(gate, metric, candidate) or (metric is None) != (w.metric is None):
            continue
        if w.active(today):
            return w
        warnings.append(f"waiver by {w.owner} ({w.reason}) expired on {w.expires.isoformat()}; not applied")
    return None


def apply_waiver(outcome: Outcome, waiver: Waiver | None) -> tuple[Outcome, WaiverApplied | None]:
    if waiver is None or outcome == "PASS":
        return outcome, None
    return "PASS", WaiverApplied(owner=waiver.owner, reason=waiver.reason, expires=waiver.expires, raw_outcome=outcome)


def _fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


class _MetricWork:
    """A metric verdict under construction: numbers gathered, stats computed, decision pending Holm."""

    def __init__(self, mv: MetricVerdict, mp: MetricPolicy, summary: S.DeltaSummary | None, values: np.ndarray | None,
                 power: float = S.DEFAULT_POWER):
        self.mv, self.mp, self.summary, self.values, self.power = mv, mp, summary, values, power


def metric_statistics(mv: MetricVerdict, mp: MetricPolicy, settings: Settings) -> _MetricWork:
    """The paired statistics of a gathered metric (oriented deltas, CI, tests); a metric that cannot be judged
    (reasons already given, or numbers the statistics refuse) gets none."""
    pairs = mv.pairs
    if mp.compare == "pair" and mp.departed is not None and mv.departed_limit is not None:
        # Pairs that drew another sample: counted (_departed_outcome, even when the rest cannot be judged), left out
        # of the mean and its CI.
        gone = [p for p in pairs if p.value is not None and math.isfinite(p.value) and p.value >= mv.departed_limit]
        mv.departed = [clip_stem(p.prompt_id, p.seed) for p in gone]
        gone_ids = {id(p) for p in gone}  # by identity: two pairs may hold equal values
        pairs = [p for p in pairs if id(p) not in gone_ids]
    if mv.reasons or mp.compare == "flag":  # a flag metric counts its flagged pairs (decide_flag), no statistics
        return _MetricWork(mv, mp, None, None, settings.power)
    key = f"{mv.gate}.{mv.metric}"
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
        return _MetricWork(mv, mp, None, None, settings.power)
    mv.stats = _summary_dict(summary, mp, mv.threshold)
    return _MetricWork(mv, mp, summary, values, settings.power)


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


def decide_metric(work: _MetricWork, alpha: float) -> None:
    """Set the raw outcome of a metric whose statistics are computed (Holm p already set): a ``pair`` metric's mean
    against its threshold (:func:`_decide_pair`), a ``sides`` / ``delta`` metric's non-inferiority and regression
    (:func:`_decide_paired_delta`); then its worst pairs as evidence."""
    mv, mp, s = work.mv, work.mp, work.summary
    assert s is not None and work.values is not None
    decisive_p = mv.p_holm if mv.p_holm is not None else mv.p_value
    p_ok = decisive_p is None or decisive_p <= alpha
    holm_note = f"Holm-adjusted p {_fmt(mv.p_holm)}" if mv.p_holm is not None else f"p {_fmt(mv.p_value)}"
    if mp.compare == "pair":
        outcomes = _decide_pair(work, alpha, p_ok, holm_note)
        order = sorted(mv.pairs, key=lambda p: p.value if mp.higher_is_better else -p.value)  # type: ignore[operator]
    else:
        outcomes = _decide_paired_delta(work, alpha, p_ok, holm_note)
        order = sorted(mv.pairs, key=lambda p: p.delta if p.delta is not None else 0.0)
    mv.worst = order[:WORST_SHOWN]
    mv.evidence = list(dict.fromkeys([p.file for p in mv.worst] + [a for p in mv.worst for a in p.artifacts]))
    mv.raw_outcome = combine(outcomes)


def _pair_mean_ci(work: _MetricWork) -> None:
    """A pair metric's mean value and its CI, from the CI of the room left to the threshold (value = threshold -/+
    room), or bootstrapped from the values when there is no threshold."""
    mv, mp, s = work.mv, work.mp, work.summary
    assert s is not None and work.values is not None
    t = mv.threshold
    if t is not None:
        if mp.higher_is_better:
            mv.ci_low, mv.ci_high = t + s.ci.low, t + s.ci.high
        else:
            mv.ci_low, mv.ci_high = t - s.ci.high, t - s.ci.low
    else:
        ci = S.mean_ci(work.values, confidence=s.ci.confidence, n_resamples=max(999, s.ci.n_resamples))
        mv.ci_low, mv.ci_high = ci.low, ci.high
    mv.mean_value = float(np.mean(work.values))


def _decide_pair(work: _MetricWork, alpha: float, p_ok: bool, holm_note: str) -> list[str]:
    """A ``pair`` metric: the mean against ``max`` / ``min`` (FAIL beyond it, PASS when the CI bound and the
    multiplicity-adjusted test clear it, else INCONCLUSIVE with the pairs needed), and every pair against
    ``pair_limit``."""
    mv, mp, s = work.mv, work.mp, work.summary
    assert s is not None
    outcomes: list[str] = []
    bad = "above" if not mp.higher_is_better else "below"
    _pair_mean_ci(work)
    mean_v, t = mv.mean_value, mv.threshold
    if t is not None:
        word = "max" if not mp.higher_is_better else "min"
        bound = mv.ci_high if not mp.higher_is_better else mv.ci_low
        if s.mean <= 0:
            outcomes.append("FAIL")
            mv.reasons.append(
                f"mean {_fmt(mean_v)} is {bad} {word} {_fmt(t)} ({s.signs.worse} of {s.n} pairs {bad} it); "
                f"{int(s.ci.confidence * 100)}% CI [{_fmt(mv.ci_low)}, {_fmt(mv.ci_high)}]"
            )
        elif s.ci.low > 0 and p_ok:
            outcomes.append("PASS")
            mv.reasons.append(f"mean {_fmt(mean_v)}, CI bound {_fmt(bound)} within {word} {_fmt(t)} ({holm_note})")
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
    if mp.departed is not None and mv.departed_limit is not None:
        outcomes.append(_departed_outcome(mv, mp))
    if mv.pair_limit is not None:
        limit = mv.pair_limit
        beyond = [p for p in mv.pairs if (p.value < limit if mp.higher_is_better else p.value > limit)]
        if beyond:
            outcomes.append("FAIL")
            shown = ", ".join(f"{clip_stem(p.prompt_id, p.seed)}={_fmt(p.value)}" for p in beyond[:5])
            mv.reasons.append(f"{len(beyond)} of {s.n} pair(s) {bad} pair_limit {_fmt(mv.pair_limit)}: {shown}")
        else:
            outcomes.append("PASS")
    return outcomes


def _departed_outcome(mv: MetricVerdict, mp: MetricPolicy) -> str:
    """FAIL when more of the run's pairs drew another sample (``departed``) than the rule allows, else PASS; either
    way the departed pairs are named."""
    assert mp.departed is not None
    n, k = len(mv.pairs), len(mv.departed)
    allowed = mp.departed.allowed(n)
    if k == 0:
        return "PASS"
    shown = ", ".join(mv.departed[:5]) + (", ..." if k > 5 else "")
    if k > allowed:
        mv.reasons.append(f"{k} of {n} pairs at or above {_fmt(mv.departed_limit)} drew another sample (at most "
                          f"{allowed} may: departed.max_share {mp.departed.max_share}): {shown}")
        return "FAIL"
    mv.reasons.append(f"{k} of {n} pairs at or above {_fmt(mv.departed_limit)} drew another sample, left out of the "
                      f"mean (at most {allowed} may): {shown}")
    return "PASS"


def _decide_paired_delta(work: _MetricWork, alpha: float, p_ok: bool, holm_note: str) -> list[str]:
    """A ``sides`` / ``delta`` metric: non-inferiority of the mean oriented delta against the margin (FAIL beyond
    it by ``fail_beyond``, PASS when the CI's lower bound and the adjusted test clear it, else INCONCLUSIVE), then the
    regression test (:func:`_regression_outcome`) and the sample-size warning."""
    mv, mp, s = work.mv, work.mp, work.summary
    assert s is not None
    outcomes: list[str] = []
    margin = float(mv.threshold)  # type: ignore[arg-type]
    mv.mean_value, mv.ci_low, mv.ci_high = s.mean, s.ci.low, s.ci.high
    detail = f"{s.signs.describe()}; Wilcoxon p {_fmt(s.wilcoxon.pvalue)}"
    if s.mcnemar is not None:
        detail += (f"; McNemar exact p {_fmt(s.mcnemar.pvalue)} ({s.mcnemar.regressed} regressed, "
                   f"{s.mcnemar.improved} improved)")
    ci_text = f"{int(s.ci.confidence * 100)}% CI [{_fmt(s.ci.low)}, {_fmt(s.ci.high)}]"
    if mp.fail_beyond == "ci" and s.ci.high < -margin:
        outcomes.append("FAIL")
        mv.reasons.append(
            f"inferior: the whole {ci_text} is worse than the margin -{_fmt(margin)} (mean delta {_fmt(s.mean)}; "
            f"{detail})"
        )
    elif mp.fail_beyond == "mean" and s.mean <= -margin:
        outcomes.append("FAIL")
        mv.reasons.append(f"mean delta {_fmt(s.mean)} is worse than the margin -{_fmt(margin)} ({ci_text}; {detail})")
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
        if s.mean <= -margin:  # fail_beyond = "ci": beyond the margin, but the CI reaches inside it
            mv.reasons.append(
                f"mean delta {_fmt(s.mean)} is worse than the margin -{_fmt(margin)} but the CI's upper bound "
                f"{_fmt(s.ci.high)} is not ({ci_text}; {detail})"
            )
        elif s.noninferiority.holds:  # the CI clears the margin; the multiplicity-adjusted test does not
            mv.reasons.append(
                f"lower bound {_fmt(s.ci.low)} clears -{_fmt(margin)} but the {holm_note} exceeds {_fmt(alpha)} "
                f"({ci_text}; {detail})"
            )
        else:
            mv.reasons.append(
                f"mean delta {_fmt(s.mean)} is within the margin -{_fmt(margin)} but the lower bound "
                f"{_fmt(s.ci.low)} is not ({ci_text}; {holm_note}; {detail})"
            )
    outcomes.extend(_regression_outcome(work))
    if outcomes[0] == "INCONCLUSIVE" and not s.underpowered and -margin < s.mean:
        # Powered for the margin itself, yet the mean sits close to it: what the next step is (the pairs that would
        # show this mean inside the margin, should it hold), as a ``pair`` metric's INCONCLUSIVE says.
        gap = s.mean + margin
        needed = S.pairs_needed(s.sd, gap, alpha=alpha, power=work.power)
        mv.warnings.append(
            f"sample size: the mean is {_fmt(gap)} inside the margin; "
            + (f"about {needed} pairs would show that at power {work.power}, if the mean holds" if needed else
               f"no affordable number of pairs would show that at power {work.power}"))
    if s.underpowered:
        mv.warnings.append(
            f"sample size: {s.n} pairs resolve only shifts of {_fmt(s.mde)} or more at power {work.power} "
            f"(sd {_fmt(s.sd)}), larger than the margin {_fmt(margin)}"
            + (f"; about {s.pairs_needed} pairs would resolve it" if s.pairs_needed else "")
        )
    return outcomes


def _regression_outcome(work: _MetricWork) -> list[str]:
    """The policy's ``regression`` test: FAIL a candidate consistently worse (Holm-adjusted one-sided Wilcoxon p at
    most ``alpha``) by at least ``min_shift``; nothing otherwise."""
    mv, rt, s = work.mv, work.mp.regression, work.summary
    assert s is not None
    if rt is None or mv.p_worse_holm is None or mv.regression_shift is None:
        return []
    if mv.p_worse_holm <= rt.alpha and s.mean <= -mv.regression_shift:
        mv.reasons.append(
            f"consistently worse: {s.signs.describe()}; one-sided Wilcoxon p {_fmt(mv.p_worse)} "
            f"(Holm {_fmt(mv.p_worse_holm)}) <= {_fmt(rt.alpha)} and mean delta {_fmt(s.mean)} <= "
            f"-{_fmt(mv.regression_shift)} (regression)")
        return ["FAIL"]
    return []


def decide_flag(mv: MetricVerdict, mp: MetricPolicy) -> None:
    """A ``flag`` metric (a per-clip artifact detector): each usable pair is candidate-flagged when the policy's
    :class:`~h3eval.policy.FlagRule` flags the candidate clip and not its baseline twin. More such pairs than
    ``max_flagged_pairs`` FAIL, whatever else is wrong with the run (a NaN or a missing pair cannot hide a flagged
    one); otherwise a metric that cannot be judged (its reasons: NaN, missing, too few pairs) is INCONCLUSIVE, never
    a PASS. The exact one-sided McNemar p of the discordant pairs (candidate-only against baseline-only flags) is
    reported beside the count; with ``flag_alpha`` a FAIL also needs it at most ``flag_alpha`` (flagged more often
    than the baseline's own clips beyond chance), else the count over the bound PASSes, stated so."""
    rule = mp.flag
    assert rule is not None
    cand_only, base_only, both = [], [], 0
    for p in mv.pairs:
        if p.value is None:  # a bit-identical pair: never flagged
            p.delta = 0.0
            continue
        c, b = rule.flags(p.value, p.baseline_value)  # type: ignore[arg-type]
        p.delta = float(b) - float(c)  # -1: candidate-flagged, +1: baseline-flagged (oriented: positive is better)
        both += c and b
        (cand_only if c and not b else base_only if b and not c else []).append(p)
    mcnemar = 1.0
    if cand_only:  # exact one-sided: P(at least this many of the discordant pairs candidate-only | 50:50)
        from scipy.stats import binomtest

        mcnemar = float(binomtest(len(cand_only), len(cand_only) + len(base_only), 0.5, alternative="greater").pvalue)
    mv.stats = {"candidate_flagged": len(cand_only), "baseline_flagged": len(base_only), "both_flagged": int(both),
                "max_flagged_pairs": mp.max_flagged_pairs, "mcnemar_p": mcnemar, "rule": rule.describe()}
    mv.mean_value = float(len(cand_only))
    mv.worst = sorted(cand_only, key=lambda p: -(p.value or 0.0))[:WORST_SHOWN]
    mv.evidence = list(dict.fromkeys([p.file for p in mv.worst] + [a for p in mv.worst for a in p.artifacts]))
    shown = ", ".join(f"{clip_stem(p.prompt_id, p.seed)}={_fmt(p.value)} (baseline {_fmt(p.baseline_value)})"
                      for p in mv.worst)
    count = (f"{len(cand_only)} of {len(mv.pairs)} pair(s) flagged on the candidate only ({mv.metric} "
             f"{rule.describe()}; {len(base_only)} on the baseline only, {both} on both; exact McNemar p "
             f"{_fmt(mcnemar)})")
    over = len(cand_only) > mp.max_flagged_pairs
    if over and (mp.flag_alpha is None or mcnemar <= mp.flag_alpha):
        beyond = "" if mp.flag_alpha is None else f" and McNemar p <= flag_alpha {_fmt(mp.flag_alpha)}"
        mv.reasons.insert(0, f"{count}, more than max_flagged_pairs {mp.max_flagged_pairs}{beyond}: {shown}")
        mv.raw_outcome = "FAIL"
        return
    why = (f"more than max_flagged_pairs {mp.max_flagged_pairs}, but no more often than the baseline's own clips "
           f"beyond chance (McNemar p > flag_alpha {_fmt(mp.flag_alpha)})" if over
           else f"within max_flagged_pairs {mp.max_flagged_pairs}")
    if mv.reasons:  # NaN, missing or too few pairs: never a PASS
        mv.reasons.insert(0, f"{count}, {why}, but")
        mv.raw_outcome = "INCONCLUSIVE"
    else:
        mv.reasons.append(f"{count}: {why}")
        mv.raw_outcome = "PASS"


def speed_outcome(ci_low: float, ci_high: float, bound: float) -> Outcome:
    """The symmetric speed rule: PASS when the whole CI is at or above ``bound``, FAIL when the whole CI is below it,
    INCONCLUSIVE when it spans the bound (either way) or is not finite (a NaN never decides)."""
    if not (math.isfinite(ci_low) and math.isfinite(ci_high)):
        return "INCONCLUSIVE"
    if ci_low >= bound:
        return "PASS"
    if ci_high < bound:
        return "FAIL"
    return "INCONCLUSIVE"


def decide_speed(sv: SpeedVerdict, problems: list[str], sp: SpeedPolicy, policy_min_pairs: int,
                 settings: Settings) -> SpeedVerdict:
    """The speedup's CI against the candidate's bound (:func:`speed_outcome`): ``min_speedup``, or ``1 - margin``
    for a candidate the policy's ``no_slower`` names (non-inferiority)."""
    if sp.no_slower is not None and sp.no_slower.covers(sv.candidate):
        sv.judged, sv.bound = "non_inferiority", 1.0 - sp.no_slower.margin
    else:
        sv.judged, sv.bound = "min_speedup", sp.min_speedup
    min_pairs = sp.min_pairs or policy_min_pairs
    reasons: list[str] = []
    if problems and not sv.pairs and all(NO_TIMING_DATA in p for p in problems):
        sides = sorted({s for p in problems for s in p.rsplit("(", 1)[-1].rstrip(")").split(" and ")})
        sv.reasons = [f"{NO_TIMING_DATA}: speed not judged ({', '.join(sides)} imported without latencies: give them "
                      "with `h3eval import ... --timings NAME=FILE` or in the manifest)"]
        return sv
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
    bound = sv.bound
    what = (f"the non-inferiority bound {bound:g}x (at most {sp.no_slower.margin:.0%} slower)"
            if sv.judged == "non_inferiority" else f"the minimum {bound:g}x")
    sv.raw_outcome = speed_outcome(res.ci.low, res.ci.high, bound)
    if sv.raw_outcome == "PASS":
        sv.reasons.append(f"{text}; the whole CI is at or above {what}")
    elif sv.raw_outcome == "FAIL":
        sv.reasons.append(f"{text}: the whole CI is below {what}")
    else:
        sv.reasons.append(f"{text}: the CI spans {what}; more pairs or a quieter machine decide it")
    return sv


# -- gates and candidates ------------------------------------------------------------------------------------------
def gate_level_checks(gv: GateVerdict, gp: GatePolicy, results: dict[tuple[str, int], LoadedResult],
                      expected: list[tuple[str, int]], policy_min_pairs: int) -> list[str]:
    """The gate-level outcomes of one candidate's gate (results present, flags, missing pairs); fills ``gv``."""
    if not results:
        gv.reasons.append(f"gate {gv.gate!r} has no results for candidate {gv.candidate!r} in this run "
                          f"(expected gates/{gv.gate}/{gv.candidate}/<prompt>-s<seed>.json)")
        return ["INCONCLUSIVE"]
    usable = {k: r for k, r in results.items() if r.problem is None}
    gv.n_usable = len(usable)
    for p, s in expected:
        lr = results.get((p, s))
        if lr is None:
            gv.unusable.append(f"{clip_stem(p, s)}: no result file")
        elif lr.problem:
            gv.unusable.append(f"{clip_stem(p, s)}: {lr.problem}")
    if gp.max_flagged is None:
        return []
    outcomes = []
    flagged = [r for r in usable.values() if r.result is not None and r.result.flagged]
    gv.flagged = [f"{clip_stem(r.prompt_id, r.seed)}: {'; '.join(r.result.flags) or 'flagged'}"
                  for r in flagged if r.result is not None]
    gv.evidence.extend(r.rel for r in flagged)
    gv.evidence.extend(a for r in flagged if r.result is not None for a in r.result.artifacts)
    min_pairs = gp.min_pairs or policy_min_pairs
    if len(flagged) > gp.max_flagged:
        gv.reasons.append(f"flagged on {len(flagged)} of {len(usable)} pairs (max_flagged "
                          f"{gp.max_flagged}): " + " | ".join(gv.flagged[:5]))
        outcomes.append("FAIL")
    if len(expected) - len(usable) > gp.max_missing:
        gv.reasons.append(f"{len(expected) - len(usable)} of {len(expected)} expected pairs have no "
                          f"usable result (max_missing {gp.max_missing}): " + "; ".join(gv.unusable[:5]))
        outcomes.append("INCONCLUSIVE")
    elif len(usable) < min_pairs:
        gv.reasons.append(f"only {len(usable)} usable pair(s); the policy needs at least {min_pairs}")
        outcomes.append("INCONCLUSIVE")
    else:
        outcomes.append("PASS")
    return outcomes


def run_test_outcome(gv: GateVerdict, gp: GatePolicy, results: dict[tuple[str, int], LoadedResult],
                     expected: list[tuple[str, int]], policy_min_pairs: int) -> Outcome:
    """The run-level test of a per-pair p-value (issue 19): FAIL when Benjamini-Hochberg over the pairs' p-values
    finds a discovery; INCONCLUSIVE when a p-value is absent or not in [0, 1] (never read as a pass), or pairs are
    missing or too few; else PASS."""
    rt = gp.run_test
    assert rt is not None
    usable = {k: r for k, r in results.items() if r.problem is None}
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
    min_pairs = gp.min_pairs or policy_min_pairs
    problems = bad[:5]
    if len(expected) - len(usable) > gp.max_missing:
        problems.append(f"{len(expected) - len(usable)} of {len(expected)} expected pairs have no usable result")
    if len(values) < min_pairs:
        problems.append(f"only {len(values)} pair(s) with a p-value; the policy needs at least {min_pairs}")
    if problems:
        gv.reasons.append(f"{text}: no discovery, but " + "; ".join(problems))
        return "INCONCLUSIVE"
    gv.reasons.append(f"{text}: no discovery")
    return "PASS"


def decide_metrics(works: list[_MetricWork], policy: Policy, settings: Settings, candidate: str) -> None:
    """Holm across the decisive p-values of the candidate's required metrics (advisory ones: their own family),
    then each metric's outcome, then its waiver."""
    for family in (True, False):
        fam = [w for w in works if w.summary is not None and w.mp.required == family and w.mv.threshold is not None]
        pvals = [w.summary.noninferiority.p_value for w in fam]  # type: ignore[union-attr]
        adjusted = S.holm(pvals) if policy.holm else pvals
        for w, p, q in zip(fam, pvals, adjusted):
            w.mv.p_value, w.mv.p_holm = p, (q if policy.holm else None)
    # The regression test (policy `regression`): one-sided Wilcoxon "the candidate is worse", Holm across the
    # candidate's metrics that carry it.
    reg = [w for w in works if w.summary is not None and w.mp.regression is not None]
    p_worse = [S.wilcoxon_signed_rank([p.delta for p in w.mv.pairs], alternative="less").pvalue for w in reg]
    for w, p, q in zip(reg, p_worse, S.holm(p_worse)):
        w.mv.p_worse, w.mv.p_worse_holm = p, q
    for w in works:
        if w.mp.compare == "flag":
            decide_flag(w.mv, w.mp)
        elif w.summary is not None:
            decide_metric(w, settings.alpha_one_sided)
        elif w.mp.departed is not None and w.mv.departed_limit is not None and w.mv.departed:
            # Too few pairs left to judge the mean: the count of departed pairs still decides a FAIL.
            w.mv.raw_outcome = "FAIL" if _departed_outcome(w.mv, w.mp) == "FAIL" else "INCONCLUSIVE"
        else:
            w.mv.raw_outcome = "INCONCLUSIVE"
        waiver = waiver_for(policy.waivers, w.mv.gate, w.mv.metric, candidate, settings.today, w.mv.warnings)
        w.mv.outcome, w.mv.waiver = apply_waiver(w.mv.raw_outcome, waiver)


def decide_gate(gv: GateVerdict, gp: GatePolicy, gate_level: list[str], policy: Policy, settings: Settings) -> None:
    """A gate's outcome from its gate-level checks and its required metrics; then its waiver."""
    parts = list(gate_level)
    parts.extend(m.outcome for m in gv.metrics if m.required)
    if gv.metrics and not any(m.required for m in gv.metrics) and gp.max_flagged is None and gp.run_test is None:
        gv.warnings.append("every metric of this gate is advisory: the gate decides nothing")
        parts.append("PASS")
    # combine([]) is INCONCLUSIVE: a gate that checked nothing never passes silently.
    gv.raw_outcome = combine(parts)
    for m in gv.metrics:
        if m.outcome != "PASS":
            gv.reasons.append(f"{m.metric}{'' if m.required else ' (advisory)'}: {m.outcome}: " + "; ".join(m.reasons))
    waiver = waiver_for(policy.waivers, gv.gate, None, gv.candidate, settings.today, gv.warnings)
    gv.outcome, gv.waiver = apply_waiver(gv.raw_outcome, waiver)


def candidate_outcome(gate_verdicts: list[GateVerdict], speed: SpeedVerdict | None) -> tuple[Outcome, list[str]]:
    """The candidate's outcome over its required gates and speed check, with the reasons of those not passing."""
    decisive = [g.outcome for g in gate_verdicts if g.required]
    if speed is not None and speed.required:
        decisive.append(speed.outcome)
    reasons = [f"{g.gate}: {g.outcome}" + (f" ({g.reasons[0]})" if g.reasons else "")
               for g in gate_verdicts if g.required and g.outcome != "PASS"]
    if speed is not None and speed.required and speed.outcome != "PASS":
        reasons.append(f"speed: {speed.outcome} ({speed.reasons[0] if speed.reasons else ''})")
    return combine(decisive), reasons
