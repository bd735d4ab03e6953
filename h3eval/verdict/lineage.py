"""Judging by lineage (issue 50): which recipe a candidate is judged against, and by which judge.

A candidate whose recipe names no ``parent`` is judged against the run's baseline by its declared ``[signoff] kind``.
A candidate that names one is judged against it by the levers that differ between the two
(:func:`h3.recipe.lever_differences`: the strictest kind among them, exact < near < resample), not by its whole
recipe: sparse attention added on top of turbo4 is ``near`` against turbo4, with the same prompts and seeds, the
ghosting gate and its run-level test (seed 001 put same-seed frames of turbo and turbo + sparse side by side). The
top of a ladder (a candidate with a parent among the candidates that no other candidate names as its parent) is also
judged against the baseline, by the levers that differ from it (seed 000's cumulative chain: each stage against the
one below, and the whole chain against the start).

Gate results of a candidate against a parent other than the baseline live in
``gates/<gate>/<candidate>/vs-<parent>/<prompt>-s<seed>.json`` (:func:`result_dir`), beside its results against the
baseline in ``gates/<gate>/<candidate>/``; the gate runner writes both (:func:`pairings`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h3eval.store import RunManifest, RunStore, check_safe_name

REFERENCE_PREFIX = "vs-"
"""Folder (inside a candidate's gate results) of its results against a reference other than the baseline."""
FLOORS_DIR = "floors"
"""Folder of a run that holds the new-seed floors of its own recipes other than the baseline (a rung's parent):
``<run>/floors/<recipe>/``, a floor run over that recipe's clips (``h3eval floor --from-run RUN --recipe R --out
RUN/floors/R``, or :func:`h3eval.floor.parent_floors_from_run`)."""


def recipe_floor_path(store: RunStore, recipe: str) -> Path:
    """The floor file of ``recipe``'s own new-seed floor in the run (each of its clips against the same prompt's next
    seed): a rung judged against ``recipe`` as its parent has its floor-relative bounds read against it, not against
    the baseline's floor (a 4-step parent's clips differ between seeds by another amount than the 29-step
    baseline's)."""
    return store.root / FLOORS_DIR / check_safe_name("recipe name", recipe) / "floor.json"


def parents_judged(policy, manifest: RunManifest) -> dict[str, set[str | None]]:
    """Parent (other than the baseline) -> the kinds its children are judged by against it under ``policy``: the
    recipes whose own floor the verdict reads."""
    out: dict[str, set[str | None]] = {}
    for candidate in manifest.candidates:
        for judgement in judgements(policy, manifest, candidate):
            if judgement.reference != manifest.baseline:
                out.setdefault(judgement.reference, set()).add(judgement.kind)
    return out


def result_dir(store: RunStore, gate: str, candidate: str, reference: str, baseline: str | None) -> Path:
    """Where ``gate``'s results of ``candidate`` against ``reference`` live (the baseline's: the usual folder)."""
    directory = store.gate_result_dir(gate, candidate)
    if reference == baseline:
        return directory
    return directory / f"{REFERENCE_PREFIX}{check_safe_name('recipe name', reference)}"


def declared_parent(manifest: RunManifest, candidate: str) -> str | None:
    """The ``parent`` the candidate's resolved recipe names (run.json), or None."""
    recipe = manifest.recipes.get(candidate)
    parent = recipe.get("parent") if isinstance(recipe, dict) else None
    return parent if isinstance(parent, str) and parent else None


def parent_in_run(manifest: RunManifest, candidate: str) -> str | None:
    """The candidate's parent when the run has its clips (the baseline or another candidate), else None."""
    parent = declared_parent(manifest, candidate)
    if parent is None or parent == candidate:
        return None
    return parent if parent == manifest.baseline or parent in manifest.candidates else None


def pairings(manifest: RunManifest) -> list[tuple[str, str]]:
    """(reference, candidate) of every comparison the run's judges may make: each candidate against the baseline,
    then each candidate whose parent is another candidate against that parent (same prompts, same seeds)."""
    out = [(manifest.baseline, c) for c in manifest.candidates if manifest.baseline is not None]
    for candidate in manifest.candidates:
        parent = parent_in_run(manifest, candidate)
        if parent is not None and parent != manifest.baseline:
            out.append((parent, candidate))
    return out


def is_ladder_top(manifest: RunManifest, candidate: str) -> bool:
    """A candidate with a parent among the candidates that no candidate names as its own parent."""
    parent = parent_in_run(manifest, candidate)
    if parent is None or parent == manifest.baseline:
        return False
    return not any(parent_in_run(manifest, other) == candidate for other in manifest.candidates)


def ladder_of(manifest: RunManifest, candidate: str) -> list[str]:
    """The rungs from the baseline up to ``candidate`` (following parents present in the run)."""
    chain = [candidate]
    while (parent := parent_in_run(manifest, chain[-1])) is not None and parent not in chain:
        chain.append(parent)
    if chain[-1] != manifest.baseline and manifest.baseline is not None:
        chain.append(manifest.baseline)
    return chain[::-1]


@dataclass
class Judgement:
    """Against which recipe a candidate is judged, by which kind, and why."""

    reference: str
    kind: str | None
    why: str | None
    source: str
    """``declared`` (the recipe's [signoff] kind), ``lineage`` (the levers that differ from its parent) or
    ``ladder top`` (the levers that differ from the baseline, for the top of a ladder)."""
    differences: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _has_levers(recipe: Any) -> bool:
    """Whether a run.json recipe is one this suite computes (its levers are known), not clips imported from another
    stack (whose recipe holds what the import declared: its kind, its parent, where the clips came from)."""
    from h3.recipe import RecipeError, recipe_from_dict

    if not isinstance(recipe, dict):
        return False
    try:
        recipe_from_dict(recipe)
    except RecipeError:
        return False
    return True


def changed_levers(manifest: RunManifest, reference: str, candidate: str) -> list[str]:
    """The levers that differ between two of the run's recipes (empty when either is imported: levers unknown)."""
    from h3.recipe import lever_differences

    ref, cand = manifest.recipes.get(reference), manifest.recipes.get(candidate)
    if not (_has_levers(ref) and _has_levers(cand)):
        return []
    return [d.lever for d in lever_differences(ref, cand)]


def _by_levers(policy, manifest: RunManifest, candidate: str, reference: str, source: str) -> Judgement:
    from h3.recipe import lever_differences, lineage_kind

    ref, cand = manifest.recipes.get(reference), manifest.recipes.get(candidate)
    if not (_has_levers(ref) and _has_levers(cand)):
        # Imported clips: no levers to compare. The kind declared for the candidate (``--kind``) judges it against its
        # parent, never a guess; the top of such a ladder is judged `resample` against the baseline (the rungs'
        # changes compounded: another sample of the prompt).
        if source == "lineage":
            judgement = _declared(policy, manifest, candidate, reference)
            judgement.source = source
            return judgement
        judge = policy.judges.get("resample")
        why = (f"the top of the ladder {' -> '.join(ladder_of(manifest, candidate))}, judged against the baseline "
               f"{reference!r}: its levers are not known here (imported clips), so as another sample of the prompt")
        if judge is None:
            return Judgement(reference, None, None, source, problems=[
                f"{why}, which policy {policy.name!r} has no `resample` judge for"])
        return Judgement(reference, "resample", f"{why}: {judge.why or judge.description}", source)
    diffs = lever_differences(ref, cand)
    kind = lineage_kind(diffs)
    shown = [{"lever": d.lever, "kind": d.kind, "why": d.why} for d in diffs]
    levers = "; ".join(f"{d.lever} ({d.kind}: {d.why})" for d in diffs) or "no lever (the same computation)"
    judge = policy.judges.get(kind)
    what = "the parent" if source == "lineage" else "the baseline (the top of a ladder)"
    why = f"judged against {what} {reference!r} by the levers that differ: {levers}; the strictest is {kind!r}"
    if judge is None:
        return Judgement(reference, None, None, source, shown, problems=[
            f"{why}, which policy {policy.name!r} has no judge for (it judges: {', '.join(policy.judges)})"])
    return Judgement(reference, kind, f"{why}: {judge.why or judge.description or kind}", source, shown)


def _declared(policy, manifest: RunManifest, candidate: str, reference: str | None = None) -> Judgement:
    baseline = reference or manifest.baseline or ""
    recipe = manifest.recipes.get(candidate) or {}
    signoff = recipe.get("signoff") if isinstance(recipe, dict) else None
    kind = signoff.get("kind") if isinstance(signoff, dict) else None
    known = ", ".join(policy.judges)
    if kind is None:
        return Judgement(baseline, None, None, "declared", problems=[
            f"recipe {candidate!r} declares no [signoff] kind; policy {policy.name!r} judges by kind ({known}) and "
            f"does not guess one"])
    if kind not in policy.judges:
        return Judgement(baseline, None, None, "declared", problems=[
            f"recipe {candidate!r} declares [signoff] kind = {kind!r}, which policy {policy.name!r} has no judge for "
            f"(it judges: {known})"])
    judge = policy.judges[kind]
    declared = f"recipe {candidate!r} declares [signoff] kind = {kind!r}"
    if signoff.get("reason"):
        declared += f" ({signoff['reason']})"
    return Judgement(baseline, kind, f"{declared}: {judge.why or judge.description or kind}", "declared")


def judgements(policy, manifest: RunManifest, candidate: str) -> list[Judgement]:
    """The judgements of ``candidate`` (see the module docstring): the first decides against its parent (or the
    baseline); a ladder's top has a second, against the baseline. A policy without judges judges every candidate
    against the baseline, with no kind."""
    baseline = manifest.baseline or ""
    if not policy.judges:
        return [Judgement(baseline, None, None, "declared")]
    named = declared_parent(manifest, candidate)
    parent = parent_in_run(manifest, candidate)
    if named is not None and parent is None:
        first = _declared(policy, manifest, candidate)
        first.warnings.append(
            f"recipe {candidate!r} names parent {named!r}, which has no clips in this run: judged against the baseline "
            f"by its declared kind instead (`h3eval ab` with --candidate {named} --candidate {candidate} makes the "
            f"ladder)")
        return [first]
    if parent is None:
        return [_declared(policy, manifest, candidate)]
    out = [_by_levers(policy, manifest, candidate, parent, "lineage")]
    if parent != baseline and is_ladder_top(manifest, candidate):
        out.append(_by_levers(policy, manifest, candidate, baseline, "ladder top"))
    return out


def pairing_gates(policy, manifest: RunManifest) -> dict[tuple[str, str], set[str]]:
    """(reference, candidate) -> the gates its judgements under ``policy`` need (the shared gates and the judge's):
    what :func:`h3eval.gaterun.run_gates` runs for each comparison when a policy picks the gates."""
    out: dict[tuple[str, str], set[str]] = {}
    for candidate in manifest.candidates:
        for judgement in judgements(policy, manifest, candidate):
            out.setdefault((judgement.reference, candidate), set()).update(policy.gates_for(judgement.kind))
    return out
