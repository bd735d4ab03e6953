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
* A ``flag`` metric (a per-clip artifact detector) counts the pairs whose candidate clip its rule flags and whose
  baseline twin it does not: more than ``max_flagged_pairs`` is a FAIL whatever else is wrong with the run (a NaN or
  a missing pair never hides one); otherwise it is PASS, or INCONCLUSIVE when pairs are missing, NaN or too few.
* A gate is FAIL if a required metric (or its flag check) is FAIL, else INCONCLUSIVE if one is INCONCLUSIVE, else
  PASS. A candidate combines its required gates and the speed check the same way; the run combines candidates.
* An active waiver turns the FAIL / INCONCLUSIVE it covers into PASS and says so; an expired one is ignored, with a
  warning.

Exit codes (:data:`EXIT_CODES`): 0 PASS, 1 FAIL, 2 INCONCLUSIVE, 3 a usage or input error.

The package has four parts: :mod:`~h3eval.verdict.schema` (what ``verdict.json`` holds),
:mod:`~h3eval.verdict.lineage` (which recipe each candidate is judged against, by which judge),
:mod:`~h3eval.verdict.gather` (reading the run) and :mod:`~h3eval.verdict.decide` (outcomes); :func:`compute_verdict`
runs them. Each candidate's configured-versus-executed flags (:func:`h3eval.executed.run_executed_flags`) are
reported beside its outcome, not in it.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path

from pydantic import ValidationError

from h3.atomic import atomic_write_json
from h3.schema import non_finite_keys, validation_problems
from h3eval.executed import run_executed_flags
from h3eval.policy import (SPEED_GATE, LoadedPolicy, NoiseFloor, PolicyError, load_floor, load_policy,
                           registry_problems, resolve_floor_path, today_utc)
from h3eval.store import RunManifest, RunStore, StoreError
from h3eval.verdict.decide import (apply_waiver, candidate_outcome, combine, decide_gate, decide_metrics,
                                   decide_speed, gate_level_checks, metric_statistics, run_test_outcome,
                                   waiver_for)
from h3eval.verdict.gather import (gather_metric, gather_speed, input_hashes, load_results, registered_gate_classes,
                                   versions)
from h3eval.verdict.lineage import (Judgement, changed_levers, judgements, ladder_of, parent_in_run, recipe_floor_path,
                                    result_dir)
from h3eval.verdict.schema import (EXIT_CODES, EXIT_USAGE, VERDICT_SCHEMA, VERDICT_VERSION, WORST_SHOWN,
                                   CandidateVerdict, ClipHashes, FileHash, GateVerdict, InputHashes, LadderRung,
                                   MetricVerdict, Outcome, PairValue, Settings, SpeedPair, SpeedVerdict, Verdict,
                                   VerdictInputError, WaiverApplied)

logger = logging.getLogger(__name__)

__all__ = [
    "EXIT_CODES", "EXIT_USAGE", "VERDICT_SCHEMA", "VERDICT_VERSION", "WORST_SHOWN", "CandidateVerdict", "ClipHashes",
    "FileHash", "GateVerdict", "InputHashes", "LadderRung", "MetricVerdict", "Outcome", "PairValue", "Settings",
    "SpeedPair", "SpeedVerdict", "Verdict", "VerdictInputError", "WaiverApplied", "choose_judge", "combine",
    "compute_verdict", "ladder_rungs", "read_verdict", "run_verdict", "speed_verdict", "summary_lines",
    "write_verdict",
]


def speed_verdict(store: RunStore, manifest: RunManifest, candidate: str, loaded: LoadedPolicy, settings: Settings,
                  expected: list[tuple[str, int]], reference: str | None = None) -> SpeedVerdict:
    """Speedup of ``candidate`` over ``reference`` (None: the baseline) from paired clip records (warm-up requests
    excluded)."""
    sp = loaded.policy.speed
    assert sp is not None
    sv, problems = gather_speed(store, manifest, candidate, sp, expected, reference)
    return decide_speed(sv, problems, sp, loaded.policy.min_pairs, settings)


def choose_judge(policy, manifest: RunManifest, candidate: str) -> tuple[str | None, str | None, list[str]]:
    """(kind, why, problems) of the judge that decides ``candidate`` against its parent or the baseline
    (:func:`h3eval.verdict.lineage.judgements`): the levers that differ from its parent when its recipe names one in
    the run, else its recipe's ``[signoff] kind``. A problem (no kind declared, no judge for it) makes the candidate
    INCONCLUSIVE: a kind is never guessed."""
    first = judgements(policy, manifest, candidate)[0]
    return first.kind, first.why, list(first.problems)


def _judge_candidate(store: RunStore, manifest: RunManifest, candidate: str, loaded: LoadedPolicy,
                     classes: dict[str, type], present: list[str], expected: list[tuple[str, int]],
                     floor: NoiseFloor | None, settings: Settings, gate_hashes: dict[str, str]) -> CandidateVerdict:
    """One candidate under each of its judgements (:func:`h3eval.verdict.lineage.judgements`): against its parent
    (or the baseline), and for the top of a ladder against the baseline as well; its outcome combines them."""
    found = judgements(loaded.policy, manifest, candidate)
    verdicts = [_judge_against(store, manifest, candidate, j, loaded, classes, present, expected, floor, settings,
                               gate_hashes) for j in found]
    for verdict in verdicts:
        if verdict.floor is not None and verdict.floor.path != str(floor.path if floor else None):
            # the parent's own floor: its hash joins the inputs the verdict was computed from
            gate_hashes[f"floor of {verdict.judged_against}"] = verdict.floor.sha256
    main = verdicts[0]
    main.executed_flags = run_executed_flags(store, manifest, candidate)
    if len(verdicts) > 1:
        top = verdicts[1]
        main.against_baseline, main.own_outcome = top, main.outcome
        main.outcome = combine([main.outcome, top.outcome])
        main.reasons.append(f"against the baseline {manifest.baseline!r} (the top of the ladder "
                            f"{' -> '.join(ladder_of(manifest, candidate))}), judged as {top.judge}: {top.outcome}"
                            + (f" ({'; '.join(top.reasons[:2])})" if top.reasons else ""))
    return main


def _judge_against(store: RunStore, manifest: RunManifest, candidate: str, judgement: Judgement,
                   loaded: LoadedPolicy, classes: dict[str, type], present: list[str], expected: list[tuple[str, int]],
                   floor: NoiseFloor | None, settings: Settings, gate_hashes: dict[str, str]) -> CandidateVerdict:
    """One candidate against one reference: its judge, every gate of it (gathered, then decided together: Holm spans
    the candidate's metrics), the speed check, and their combination."""
    policy = loaded.policy
    kind, judge_reason, judge_problems = judgement.kind, judgement.why, judgement.problems
    reference = judgement.reference
    gates = policy.gates_for(kind)
    cand_warnings: list[str] = list(judgement.warnings)
    floor, floor_warning = floor_against(store, manifest, reference, floor)
    if floor_warning and any(_floor_relative(gp) for gp in gates.values()):
        cand_warnings.append(floor_warning)
    if kind is not None and len(expected) < policy.judges[kind].warn_below_pairs:
        cand_warnings.append(
            f"only {len(expected)} pairs (prompts x seeds): under {policy.judges[kind].warn_below_pairs} a paired "
            f"comparison can point the wrong way (seed 002: a 4-clip check suggested an improvement that the 16-clip "
            f"test reversed)")
    gate_verdicts: list[GateVerdict] = []
    gate_level: dict[str, list[str]] = {}
    """Outcomes of the gate-level checks (results present, flags, missing pairs) per gate."""
    works = []
    for gate, gp in gates.items():
        folder = store.relative(result_dir(store, gate, candidate, reference, manifest.baseline))
        gv = GateVerdict(gate=gate, candidate=candidate, required=gp.required, outcome="INCONCLUSIVE",
                         raw_outcome="INCONCLUSIVE", n_expected=len(expected), evidence=[f"{folder}/"])
        gate_verdicts.append(gv)
        if gate not in classes and gate not in present:
            gv.reasons.append(
                f"unknown gate {gate!r}: not registered (known: {', '.join(sorted(classes)) or 'none'}) and no "
                f"results under gates/{gate}/ in this run"
            )
            gate_level[gate] = ["INCONCLUSIVE"]
            continue
        results, stray, n_files = load_results(store, gate, candidate, reference, expected, gate_hashes,
                                               manifest.baseline)
        gv.warnings.extend(stray)
        gv.n_results = n_files
        if not n_files and reference != manifest.baseline:
            gv.reasons.append(f"no results of {candidate!r} against its parent {reference!r} under {folder}/: "
                              f"`h3eval gate RUN --gates {gate}` pairs a candidate with its parent's clips")
        if gp.when_applicable and results and all(
                r.result is not None and r.result.status == "not_applicable" for r in results.values()):
            why = next(iter(results.values())).result.info.get("reason", "")  # type: ignore[union-attr]
            gv.required = False
            gv.reasons.append(f"not applicable on this run's pairs, so it decides nothing: {why}")
            gate_level[gate] = ["INCONCLUSIVE"]
            continue
        gate_level[gate] = gate_level_checks(gv, gp, results, expected, policy.min_pairs)
        if results and gp.run_test is not None:
            gate_level[gate].append(run_test_outcome(gv, gp, results, expected, policy.min_pairs))
        if not results:
            continue
        for metric, mp in gp.metrics.items():
            mv = gather_metric(gate, metric, mp, candidate, gp, policy.min_pairs, expected, results, floor)
            works.append(metric_statistics(mv, mp, settings))
            gv.metrics.append(mv)
    decide_metrics(works, policy, settings, candidate)
    for gv in gate_verdicts:
        decide_gate(gv, gates[gv.gate], gate_level[gv.gate], policy, settings)

    speed: SpeedVerdict | None = None
    if policy.speed is not None:
        speed = speed_verdict(store, manifest, candidate, loaded, settings, expected, reference)
        if kind is not None and policy.judges[kind].speed_required is not None:
            speed.required = policy.judges[kind].speed_required
        waiver = waiver_for(policy.waivers, SPEED_GATE, None, candidate, settings.today, speed.warnings)
        speed.outcome, speed.waiver = apply_waiver(speed.raw_outcome, waiver)
    outcome, reasons = candidate_outcome(gate_verdicts, speed)
    if judge_problems:
        outcome = combine([outcome, "INCONCLUSIVE"])
        reasons = judge_problems + reasons
    return CandidateVerdict(candidate=candidate, outcome=outcome, judge=kind, judge_reason=judge_reason,
                            reasons=reasons, warnings=cand_warnings, gates=gate_verdicts, speed=speed,
                            judged_against=None if reference == manifest.baseline else reference,
                            judge_source=judgement.source if policy.judges else None,
                            lever_differences=judgement.differences, detectable=detectable(gate_verdicts),
                            floor=FileHash(path=str(floor.path), sha256=floor.sha256) if floor else None)


def floor_against(store: RunStore, manifest: RunManifest, reference: str,
                  floor: NoiseFloor | None) -> tuple[NoiseFloor | None, str | None]:
    """The floor a comparison against ``reference`` reads its floor-relative thresholds against, and a warning when
    it falls back: against the baseline the run's floor (``floor``); against a parent the parent's own new-seed floor
    (:func:`h3eval.verdict.lineage.recipe_floor_path`: the parent's clips against the same prompt's next seed), else
    the run's floor, said in a warning (a 4-step parent's seeds differ by another amount than the baseline's: the
    INT8 rung over turbo4-tiny failed audio.stft_distance's bound of 0.1 x the 29-step baseline's floor in 600 of 600
    runs of bench/recipe_signoff)."""
    if reference == manifest.baseline:
        return floor, None
    path = recipe_floor_path(store, reference)
    if path.is_file():
        return load_floor(path), None
    return floor, (f"no new-seed floor of the parent {reference!r} in this run ({store.relative(path)}): its "
                   f"floor-relative thresholds are read against {'the run floor' if floor else 'no floor'} instead "
                   f"(`h3eval floor --from-run RUN --recipe {reference} --out RUN/floors/{reference}` measures it)")


def _floor_relative(gp) -> bool:
    """Whether a gate's policy states any threshold against the floor."""
    from h3eval.thresholds import FloorFraction

    def rel(spec) -> bool:
        return isinstance(spec, FloorFraction)

    for mp in gp.metrics.values():
        specs = [getattr(mp, name, None) for name in ("max", "min", "margin", "pair_limit")]
        if mp.departed is not None:
            specs.append(mp.departed.at_least)
        if mp.regression is not None:
            specs.append(mp.regression.min_shift)
        if any(rel(x) for x in specs):
            return True
    return False


def detectable(gate_verdicts: list[GateVerdict]) -> list[dict]:
    """The minimum detectable effect of each required metric with statistics, beside its margin (see
    :attr:`CandidateVerdict.detectable`); a ``pair`` metric's MDE is of its mean value's distance to the threshold."""
    out = []
    for g in gate_verdicts:
        for m in g.metrics:
            mde = (m.stats or {}).get("mde")
            if not m.required or mde is None or m.threshold is None:
                continue
            out.append({"metric": f"{m.gate}.{m.metric}", "n_pairs": m.n_pairs, "mde": mde, "margin": m.threshold,
                        "compare": m.compare, "resolves": bool(mde <= m.threshold)})
    return out


def ladder_rungs(verdict_candidates: list[CandidateVerdict], manifest: RunManifest) -> list[LadderRung]:
    """Each candidate judged against a parent other than the baseline, with the rung below it (a candidate judged
    against the baseline by lineage too), in the order of the ladder: seed 000's stage table."""
    by_name = {c.candidate: c for c in verdict_candidates}
    rungs: list[LadderRung] = []
    parents = {parent_in_run(manifest, name) for name in manifest.candidates} - {None, manifest.baseline}
    in_ladder = {name for name in manifest.candidates if parent_in_run(manifest, name) is not None} | parents
    for name in manifest.candidates:
        if name not in in_ladder or name not in by_name:
            continue
        c = by_name[name]
        below = c.judged_against or manifest.baseline or ""
        sp = c.speed
        quality = ", ".join(f"{g.gate} {g.outcome}" for g in c.gates if g.required)
        levers = [d["lever"] for d in c.lever_differences] or changed_levers(manifest, below, name)
        rungs.append(LadderRung(
            candidate=name, below=below, judge=c.judge, levers=levers,
            outcome=c.own_outcome or c.outcome, speedup=sp.speedup if sp else None,
            speedup_ci=(sp.ci_low, sp.ci_high) if sp and sp.ci_low is not None and sp.ci_high is not None else None,
            quality=quality))
    order = {name: len(ladder_of(manifest, name)) for name in manifest.candidates}
    return sorted(rungs, key=lambda r: order.get(r.candidate, 0))


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
    classes = registered_gate_classes()
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
    present = store.gates_present()
    unchecked = [g for g in present if g not in policy.all_gates()]
    if unchecked:
        warnings.append(f"gate results present but not checked by policy {policy.name!r}: {', '.join(unchecked)}")

    candidates = [_judge_candidate(store, manifest, candidate, loaded, classes, present, expected, floor, settings,
                                   gate_hashes) for candidate in manifest.candidates]
    ladder = ladder_rungs(candidates, manifest) if policy.judges else []
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
        notices=store.weights_notices(),
        candidates=candidates,
        ladder=ladder,
        settings=settings,
        inputs=input_hashes(store, manifest, loaded, floor, gate_hashes),
        versions=versions(),
    )


def write_verdict(verdict: Verdict, run_dir: str | Path) -> Path:
    """Write ``verdict.json`` holding the run's lock (StoreError while another process writes into the run)."""
    store = RunStore(run_dir)
    with store.lock("h3eval verdict"):
        atomic_write_json(store.verdict_path, verdict.dump())
    return store.verdict_path


def read_verdict(path: str | Path) -> Verdict:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        # The writer stores a non-finite number as null (mode="json"): a NaN here was put in by hand, and the report
        # must not render it under the file's PASS (issue 26's campaign).
        try:
            bad = non_finite_keys(json.loads(text))
        except ValueError:
            bad = []  # not JSON: the schema below names it
        if bad:
            raise VerdictInputError(f"{path} is not a readable verdict: "
                                    + "; ".join(f"key '{key}': not a finite number" for key in bad[:10]))
        return Verdict.model_validate_json(text)
    except ValidationError as exc:
        raise VerdictInputError(f"{path} is not a readable verdict: " + "; ".join(validation_problems(exc))) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise VerdictInputError(f"{path} is not a readable verdict: {exc}") from None


def summary_lines(verdict: Verdict) -> list[str]:
    """Short human-readable lines: overall, then each candidate and gate (for the CLI)."""
    lines = [f"{verdict.outcome}  policy {verdict.policy_name!r}, baseline {verdict.baseline!r}"]
    lines += [f"  NOTE: {notice}" for notice in verdict.notices]
    for c in verdict.candidates:
        against = f" against {c.judged_against}" if c.judged_against else ""
        lines.append(f"  {c.candidate}: {c.outcome}" + (f" (judged as {c.judge}{against})" if c.judge else ""))
        if c.judge_reason:
            lines.append(f"    judge: {c.judge_reason}")
        top = c.against_baseline
        if top is not None:
            lines.append(f"    against the baseline (ladder top): {top.outcome}"
                         + (f" (judged as {top.judge})" if top.judge else ""))
            lines += [f"      - {reason}" for reason in top.reasons]
        for reason in c.reasons:
            if reason.startswith("recipe "):
                lines.append(f"    - {reason}")
        for w in c.warnings:
            lines.append(f"    warning: {w}")
        lines += [f"    configured versus executed: {flag}" for flag in c.executed_flags]
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


def run_verdict(
    run_dir: str | Path,
    policy: str | Path,
    *,
    floor: str | Path | None = None,
    write: bool = False,
    today: dt.date | None = None,
) -> Verdict:
    """Judge ``run_dir`` under the policy file; optionally write ``verdict.json``. Raises on input errors."""
    loaded = load_policy(policy)
    verdict = compute_verdict(run_dir, loaded, floor_path=floor, today=today)
    if write:
        write_verdict(verdict, run_dir)
    return verdict
