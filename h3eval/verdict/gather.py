"""Gathering a verdict's evidence from the run store: per-pair gate results, per-pair latencies, input hashes.

Nothing here decides: every function reads (through :class:`h3eval.store.RunStore` and its one reader of each file
kind), checks what it read (missing, unreadable, NaN, direction contradicting the policy) and returns numbers and
reasons for :mod:`h3eval.verdict.decide`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import metadata

from gates.base import GateResult, gate_class, known_gates
from h3.atomic import sha256_file
from h3.record import ClipRecord
from h3eval.policy import (BaselineFraction, GatePolicy, LoadedPolicy, MetricPolicy, NoiseFloor, SpeedPolicy,
                           resolve_threshold)
from h3eval.store import (GateResultError, RecordError, RunManifest, RunStore, clip_stem, read_clip_record,
                          read_gate_result)
from h3eval.verdict.schema import ClipHashes, FileHash, InputHashes, MetricVerdict, PairValue, SpeedPair, SpeedVerdict


class LoadedResult:
    """One expected pair's gate result file: the result, or the problem that makes it unusable."""


    __slots__ = ("prompt_id", "seed", "rel", "result", "problem")

    def __init__(self, prompt_id: str, seed: int, rel: str, result: GateResult | None, problem: str | None):
        self.prompt_id, self.seed, self.rel, self.result, self.problem = prompt_id, seed, rel, result, problem


def load_results(
    store: RunStore, gate: str, candidate: str, baseline: str, expected: list[tuple[str, int]], hashes: dict[str, str],
    run_baseline: str | None = None,
) -> tuple[dict[tuple[str, int], LoadedResult], list[str], int]:
    """Result of each expected pair (absent key = no file), stray-file warnings, and files found. ``baseline`` is the
    recipe the candidate is compared with: the run's baseline (``run_baseline``, None: the same) or its parent, whose
    results live in their own folder (:func:`h3eval.verdict.lineage.result_dir`)."""
    from h3eval.verdict.lineage import result_dir

    out: dict[tuple[str, int], LoadedResult] = {}
    warnings: list[str] = []
    expected_set = {clip_stem(p, s): (p, s) for p, s in expected}
    directory = result_dir(store, gate, candidate, baseline, run_baseline if run_baseline is not None else baseline)
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    for path in files:
        rel = store.relative(path)
        stem = path.stem
        if stem not in expected_set:
            warnings.append(f"{rel} is not a pair of this run's manifest; ignored")
            continue
        prompt_id, seed = expected_set[stem]
        if not path.is_file():  # a directory where a result should be: unreadable, like a truncated file
            out[(prompt_id, seed)] = LoadedResult(prompt_id, seed, rel, None,
                                                  f"{rel} is not a valid gate result: it is a directory")
            continue
        hashes[rel] = sha256_file(path)
        try:
            result = read_gate_result(path)
        except GateResultError as exc:
            out[(prompt_id, seed)] = LoadedResult(
                prompt_id, seed, rel, None, f"{rel} is not a valid gate result: {exc.detail}"
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
        out[(prompt_id, seed)] = LoadedResult(prompt_id, seed, rel, result, problem)
    return out, warnings, len(files)


def gather_metric(
    gate: str,
    metric: str,
    mp: MetricPolicy,
    candidate: str,
    gp: GatePolicy,
    policy_min_pairs: int,
    expected: list[tuple[str, int]],
    results: dict[tuple[str, int], LoadedResult],
    floor: NoiseFloor | None,
) -> MetricVerdict:
    """The metric's verdict with its per-pair values and the reasons it cannot be judged (empty: it can).

    Resolves the threshold (absolute or floor-relative: :func:`resolve_thresholds`); collects each expected pair's
    value (:func:`collect_pairs`: a bit-identical pair the gate short-circuited takes delta 0, or the policy's
    ``identical_value``); a threshold on the baseline's mean is resolved from the pairs
    (:func:`resolve_on_baseline`); :func:`unjudgeable_reasons` names missing pairs, NaN values, a direction
    contradicting the policy, and too few pairs.
    """
    mv = MetricVerdict(
        gate=gate, metric=metric, candidate=candidate, compare=mp.compare, direction=mp.direction,
        required=mp.required, outcome="INCONCLUSIVE", raw_outcome="INCONCLUSIVE", n_expected=len(expected),
    )
    on_baseline = resolve_thresholds(mv, mp, floor)
    found = collect_pairs(mv, mp, metric, expected, results)
    mv.pairs = found.pairs
    mv.n_pairs = len(found.pairs)
    if any(on_baseline):
        resolve_on_baseline(mv, mp, floor, on_baseline)
    unjudgeable_reasons(mv, mp, found, gp, policy_min_pairs, expected)
    return mv


def _threshold_spec(mp: MetricPolicy):
    """The metric's main threshold as written: ``max`` / ``min`` of a pair metric, else the margin (None: a flag)."""
    return (mp.max if mp.max is not None else mp.min) if mp.compare == "pair" else mp.margin


def resolve_thresholds(mv: MetricVerdict, mp: MetricPolicy, floor: NoiseFloor | None) -> tuple[bool, bool]:
    """Resolve the threshold, the regression shift and the pair limit into ``mv`` (a reason where one is unknown);
    returns whether the threshold and the shift are stated on the baseline's mean (resolved once the pairs are in)."""
    key = f"{mv.gate}.{mv.metric}"
    spec = _threshold_spec(mp)
    on_baseline = (isinstance(spec, BaselineFraction),
                   isinstance(mp.regression.min_shift if mp.regression else None, BaselineFraction))
    if spec is not None and not on_baseline[0]:
        res = resolve_threshold(spec, key, floor)
        mv.threshold, mv.threshold_source = res.value, res.source
        if res.value is None:
            mv.reasons.append(f"threshold unknown: {res.source}")
    if mp.regression is not None and not on_baseline[1]:
        res = resolve_threshold(mp.regression.min_shift, key, floor)
        mv.regression_shift = res.value
        if res.value is None:
            mv.reasons.append(f"regression min_shift unknown: {res.source}")
    if mp.pair_limit is not None:
        res = resolve_threshold(mp.pair_limit, key, floor)
        mv.pair_limit = res.value
        if res.value is None:
            mv.reasons.append(f"pair_limit unknown: {res.source}")
    if mp.departed is not None:
        res = resolve_threshold(mp.departed.at_least, key, floor)
        mv.departed_limit = res.value
        if res.value is None:
            mv.reasons.append(f"departed.at_least unknown: {res.source}")
    if mp.flag is not None:
        mv.threshold_source = f"flag: the candidate clip's {mv.metric} {mp.flag.describe()}, its baseline twin's not"
    return on_baseline


def resolve_on_baseline(mv: MetricVerdict, mp: MetricPolicy, floor: NoiseFloor | None,
                        on_baseline: tuple[bool, bool]) -> None:
    """A margin (or regression shift) stated on the baseline's mean score: resolved from the pairs judged."""
    key = f"{mv.gate}.{mv.metric}"
    scores = [p.baseline_value for p in mv.pairs if p.baseline_value is not None]
    mean = float(sum(scores) / len(scores)) if scores else None
    if on_baseline[0]:
        res = resolve_threshold(_threshold_spec(mp), key, floor, mean)  # type: ignore[arg-type]
        mv.threshold, mv.threshold_source = res.value, res.source
        if res.value is None:
            mv.reasons.append(f"threshold unknown: {res.source}")
    if on_baseline[1]:
        res = resolve_threshold(mp.regression.min_shift, key, floor, mean)  # type: ignore[union-attr]
        mv.regression_shift = res.value
        if res.value is None:
            mv.reasons.append(f"regression min_shift unknown: {res.source}")


@dataclass
class PairsFound:
    """What :func:`collect_pairs` read: the usable pairs and what kept the others out."""

    pairs: list[PairValue] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    nan_files: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    seen_metric: bool = False
    other_names: set[str] = field(default_factory=set)


def collect_pairs(mv: MetricVerdict, mp: MetricPolicy, metric: str, expected: list[tuple[str, int]],
                  results: dict[tuple[str, int], LoadedResult]) -> PairsFound:
    """Each expected pair's value (and its baseline side for ``sides`` and ``flag``), in the run's order."""
    found = PairsFound()
    two_sided = mp.compare in ("sides", "flag")
    for prompt_id, seed in expected:
        stem = clip_stem(prompt_id, seed)
        lr = results.get((prompt_id, seed))
        if lr is None or lr.problem is not None or lr.result is None:
            found.missing.append(f"{stem}: {'no result file' if lr is None else lr.problem}")
            continue
        result = lr.result
        found.other_names.update(result.metrics)
        m = result.metrics.get(metric)
        value: float | None = None
        base_value: float | None = None
        if m is not None:
            found.seen_metric = True
            if m.higher_is_better != mp.higher_is_better:
                found.conflicts.append(lr.rel)
            value = m.value
        if two_sided:
            bm = result.metrics.get(mp.baseline_key(metric))
            if bm is not None:
                if bm.higher_is_better != mp.higher_is_better:
                    found.conflicts.append(lr.rel)
                base_value = bm.value
        # A pair the gate short-circuited as bit-identical: its delta is 0 by definition (never flagged); a pair
        # metric takes the value the policy declares for identical clips (never guessed).
        if result.identical and value is None:
            if mp.compare == "pair" and mp.identical_value is not None:
                value = mp.identical_value
                found.seen_metric = True
            elif mp.compare in ("sides", "delta", "flag"):
                found.seen_metric = True
                found.pairs.append(PairValue(prompt_id=prompt_id, seed=seed, value=None, delta=0.0, file=lr.rel,
                                             artifacts=result.artifacts))
                continue
        if value is None or (two_sided and base_value is None):
            why = "value is null" if m is not None else "metric absent"
            if two_sided and base_value is None and value is not None:
                why = f"baseline score {mp.baseline_key(metric)!r} absent or null"
            found.missing.append(f"{stem}: {why} ({lr.rel})")
            continue
        if not math.isfinite(value) or (base_value is not None and not math.isfinite(base_value)):
            found.nan_files.append(lr.rel)
            continue
        found.pairs.append(PairValue(prompt_id=prompt_id, seed=seed, value=value, baseline_value=base_value,
                                     file=lr.rel, artifacts=result.artifacts))
    return found


def unjudgeable_reasons(mv: MetricVerdict, mp: MetricPolicy, found: PairsFound, gp: GatePolicy,
                        policy_min_pairs: int, expected: list[tuple[str, int]]) -> None:
    """The reasons the metric cannot be judged, into ``mv``: absent everywhere, NaN, contradicting directions,
    missing pairs beyond ``max_missing`` (fewer: a warning), fewer usable pairs than ``min_pairs``."""
    min_pairs = mp.min_pairs or gp.min_pairs or policy_min_pairs
    if not found.seen_metric:
        have = ", ".join(sorted(found.other_names)) or "none (no usable result)"
        mv.reasons.append(
            f"no result of gate {mv.gate!r} for {mv.candidate!r} has metric {mv.metric!r} (metrics present: {have})"
        )
    if found.nan_files:
        mv.reasons.append(f"NaN or infinite value in {len(found.nan_files)} result(s): "
                          f"{', '.join(found.nan_files[:5])}")
    if found.conflicts:
        mv.reasons.append(
            f"the gate declares the opposite direction to the policy ({mp.direction}) in {len(set(found.conflicts))} "
            f"result(s), e.g. {found.conflicts[0]}: metadata contradiction, not judged"
        )
    missing = found.missing
    if len(missing) > gp.max_missing:
        shown = "; ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        mv.reasons.append(
            f"{mv.metric} missing on {len(missing)} of {len(expected)} expected pairs "
            f"(max_missing {gp.max_missing}): {shown}"
        )
    elif missing:
        mv.warnings.append(f"{len(missing)} pair(s) without a value (within max_missing): {'; '.join(missing[:5])}")
    if len(found.pairs) < min_pairs:
        mv.reasons.append(f"only {len(found.pairs)} usable pair(s); the policy needs at least {min_pairs}")


def load_record(store: RunStore, recipe: str, prompt_id: str, seed: int) -> tuple[ClipRecord | None, str | None]:
    try:
        return store.load_record(recipe, prompt_id, seed), None
    except RecordError as exc:
        if exc.problem == "missing":
            return None, f"{recipe}/{clip_stem(prompt_id, seed)}: no clip record"
        return None, f"{store.relative(exc.path)}{str(exc).removeprefix(str(exc.path))}"


NO_TIMING_DATA = "no timing data"
"""The speed problem of a pair whose clip record has no latency (imported without one): h3eval.verdict.decide says
"no timing data: speed not judged" when no pair has any."""


def gather_speed(store: RunStore, manifest: RunManifest, candidate: str, sp: SpeedPolicy,
                 expected: list[tuple[str, int]], reference: str | None = None) -> tuple[SpeedVerdict, list[str]]:
    """The candidate's speed verdict against ``reference`` (None: the baseline; a ladder's rung: its parent) with its
    latency pairs (warm-up requests excluded), and the pairs whose timings cannot be used (no record, unreadable, not
    a positive number)."""
    assert manifest.baseline is not None
    reference = reference or manifest.baseline
    sv = SpeedVerdict(candidate=candidate, required=sp.required, outcome="INCONCLUSIVE", raw_outcome="INCONCLUSIVE",
                      latency=sp.latency, min_speedup=sp.min_speedup,
                      reference=None if reference == manifest.baseline else reference)
    problems: list[str] = []
    for prompt_id, seed in expected:
        base, err_b = load_record(store, reference, prompt_id, seed)
        cand, err_c = load_record(store, candidate, prompt_id, seed)
        if err_b or err_c:
            problems.extend(e for e in (err_b, err_c) if e)
            continue
        assert base is not None and cand is not None
        if base.extra.get("warmup") is True or cand.extra.get("warmup") is True:
            sv.excluded_warmup += 1
            continue
        b = getattr(base.timings, sp.latency)
        c = getattr(cand.timings, sp.latency)
        untimed = [r.recipe_name for r in (base, cand) if f"timings.{sp.latency}" in r.extra.get("unreported", [])]
        if untimed:  # an imported clip without latencies: its record holds a placeholder 0
            problems.append(f"{clip_stem(prompt_id, seed)}: {NO_TIMING_DATA} ({' and '.join(untimed)})")
            continue
        if not (math.isfinite(b) and math.isfinite(c) and b > 0 and c > 0):
            problems.append(f"{clip_stem(prompt_id, seed)}: latency not a positive number ({b}, {c})")
            continue
        sv.pairs.append(SpeedPair(prompt_id=prompt_id, seed=seed, baseline_s=b, candidate_s=c))
        sv.evidence.append(store.relative(store.record_path(candidate, prompt_id, seed)))
    sv.n_pairs = len(sv.pairs)
    return sv, problems


def registered_gate_classes() -> dict[str, type]:
    """Registered gate classes by name, without instantiating them (a gate's constructor may load weights)."""
    return {name: gate_class(name) for name in known_gates()}


def input_hashes(store: RunStore, manifest: RunManifest, loaded: LoadedPolicy, floor: NoiseFloor | None,
                  gate_hashes: dict[str, str]) -> InputHashes:
    clips: dict[str, ClipHashes] = {}
    for recipe in [manifest.baseline, *manifest.candidates]:
        if recipe is None:
            continue
        for path in store.clip_record_paths(recipe):
            try:
                rec = read_clip_record(path)
            except RecordError:
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


def versions() -> dict[str, str]:
    out = {}
    for dist in ("h3eval", "numpy", "scipy", "pydantic"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out
