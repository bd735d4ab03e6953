"""Per-recipe signoff kinds: recipes declare how they are judged, the shipped release policy picks the judge by kind
(exact / near: same-seed fidelity against the floor; resample: paired non-inferiority of every reference-free
dimension, temporal flickering and prompt faithfulness), and the verdict and the report say which judge and why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gates.reference_free import ARTIFACTS as RF_ARTIFACTS
from gates.reference_free import DIMENSIONS as RF_DIMENSIONS
from h3.recipe import RECIPES_DIR, known_recipes, load_recipe, recipe_from_dict
from h3eval.policy import PolicyError, load_policy, parse_policy, write_floor
from h3eval.store import RunStore
from h3eval.verdict import compute_verdict, summary_lines
from verdict_fixtures import make_run, pairs_of, write_result

RELEASE = Path(__file__).resolve().parent.parent / "gates" / "policies" / "release.toml"


def test_every_shipped_recipe_declares_its_kind_and_the_kind_is_not_part_of_its_hash():
    for name in known_recipes():
        assert load_recipe(name).signoff is not None, f"{name}.toml declares no [signoff] kind"
    assert load_recipe("identity").signoff.kind == "exact"
    assert load_recipe("turbo4").signoff.kind == "resample" and load_recipe("fewer-steps").signoff.kind == "resample"
    data = load_recipe("turbo4").resolved()
    undeclared = recipe_from_dict({**data, "signoff": None})
    assert undeclared.sha256() == load_recipe("turbo4").sha256()  # finished clips stay valid
    with pytest.raises(ValueError, match="signoff.kind"):
        recipe_from_dict({**data, "signoff": {"kind": "close-enough"}})


def test_the_device_drivers_fp8_fallback_recipe_declares_the_kind_of_the_recipe_it_stands_in_for():
    """bench/full_size_ab/recipes/turbo4-fp8-compile.toml is turbo4-fp8-sage-compile with native attention (what the H200 chain runs
    without sageattention): judged as that recipe is, or the release policy's verdict on it is FAIL for a missing
    kind (the 2026-12-01 calls, bench/full_size_ab/results/h200_ab_20261201_session.md)."""
    fallback = load_recipe(Path(__file__).resolve().parent.parent / "bench" / "full_size_ab" / "recipes" / "turbo4-fp8-compile.toml")
    shipped = load_recipe("turbo4-fp8-sage-compile")
    assert fallback.signoff is not None, "bench/full_size_ab/recipes/turbo4-fp8-compile.toml declares no [signoff] kind"
    assert fallback.signoff.kind == shipped.signoff.kind == "resample"


def test_a_gate_is_either_shared_or_a_judges():
    base = {"version": 1, "name": "x", "gates": {"integrity": {"max_flagged": 0}}}
    with pytest.raises(PolicyError, match="repeats shared gate"):
        parse_policy({**base, "judges": {"near": {"gates": {"integrity": {"max_flagged": 0}}}}})
    with pytest.raises(PolicyError, match="judges.nearly"):
        parse_policy({**base, "judges": {"nearly": {"gates": {"fidelity": {"max_flagged": 0}}}}})


KINDS = {"same": "exact", "resampled": "resample", "softer": "resample", "duller": "resample", "undeclared": None}
FLOOR = {f"reference_free.{d}": 1.0 for d in RF_DIMENSIONS} | {"reference_free.clipping_fraction": 0.0} | {
    "reference_free.echo_score": 0.01} | {
    "vbench.temporal_flickering_delta": 0.01, "fidelity.lpips_mean": 0.4, "audio.stft_distance": 2.0}


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    root = tmp_path_factory.mktemp("kinds")
    store = make_run(root, candidates=list(KINDS), n_prompts=16)
    manifest = store.read_manifest()
    for name, kind in KINDS.items():
        manifest.recipes[name] = {"name": name, **({"signoff": {"kind": kind, "reason": f"{name} test"}} if kind
                                                   else {})}
    store.write_manifest(manifest)
    rng = np.random.default_rng(18)
    for cand in KINDS:
        for pid, seed in pairs_of(store):
            write_result(store, "integrity", cand, pid, seed, {"candidate_problems": (0.0, False)})
            write_result(store, "fidelity", cand, pid, seed, {"lpips_mean": (0.0, False)}, identical=True)
            write_result(store, "audio", cand, pid, seed, {"stft_distance": (0.0, False)}, identical=True)
            metrics = {}
            for dim, spec in RF_DIMENSIONS.items():
                base = float(rng.uniform(5, 10))
                # A benign resample moves each score a little (a fifth of the floor); `softer` loses 3 floors of
                # sharpness on every clip.
                cand_value = base + float(rng.normal(0, 0.2))
                if dim == "clipping_fraction":  # never moves: a floor of 0, the margin's at_least decides
                    base = cand_value = 0.0
                if cand == "softer" and dim == "sharpness":
                    cand_value = base - 3.0
                if cand == "duller" and dim == "contrast":  # inside the margin, but worse on every clip
                    cand_value = base - 0.3 + float(rng.normal(0, 0.05))
                metrics[dim] = (cand_value, spec.higher_is_better)
                metrics[f"{dim}.baseline"] = (base, spec.higher_is_better)
            for dim, spec in RF_ARTIFACTS.items():  # clean clips by the artifact detectors (none flagged)
                base = 0.0 if dim in ("frozen_frames", "dropout_ms") else float(rng.uniform(0.2, 0.6))
                cand_value = base if base == 0.0 else base + float(rng.normal(0, 0.002))
                metrics[dim] = (cand_value, spec.higher_is_better)
                metrics[f"{dim}.baseline"] = (base, spec.higher_is_better)
            write_result(store, "reference_free", cand, pid, seed, metrics)
            write_result(store, "vbench", cand, pid, seed,
                         {"temporal_flickering_delta": (float(rng.normal(0, 0.001)), True)})
            write_result(store, "prompt_faithfulness", cand, pid, seed, {}, status="not_applicable",
                         info={"reason": "the prompt is not a caption of the procedural world"})
    floor = write_floor(root / "floor.json", FLOOR)
    return store, compute_verdict(root, load_policy(RELEASE), floor_path=floor.path)


def _candidate(verdict, name):
    return next(c for c in verdict.candidates if c.candidate == name)


def test_exact_is_judged_by_same_seed_fidelity(judged):
    _, verdict = judged
    c = _candidate(verdict, "same")
    assert c.judge == "exact" and c.outcome == "PASS", c.reasons
    assert {g.gate for g in c.gates} == {"integrity", "fidelity", "audio"}
    assert "declares [signoff] kind = 'exact'" in c.judge_reason and "same computation" in c.judge_reason
    assert c.speed is not None and not c.speed.required  # reported, not deciding, for an exact recipe


def test_resample_is_judged_reference_free_and_a_planted_loss_fails_by_name(judged):
    _, verdict = judged
    ok, soft = _candidate(verdict, "resampled"), _candidate(verdict, "softer")
    assert ok.judge == soft.judge == "resample"
    assert {g.gate for g in ok.gates} == {"integrity", "reference_free", "vbench", "prompt_faithfulness"}
    assert ok.outcome == "PASS", ok.reasons
    rf = next(g for g in ok.gates if g.gate == "reference_free")
    # Every dimension, and the artifact detectors the release policy judges (issue 50: all but click_score).
    assert len(rf.metrics) == len(RF_DIMENSIONS) + len(RF_ARTIFACTS) - 1 and all(m.outcome == "PASS" for m in rf.metrics)
    clipping = next(m for m in rf.metrics if m.metric == "clipping_fraction")
    assert clipping.threshold == 0.0001 and clipping.threshold_source.startswith("at_least")
    # The suite has no ground truth: prompt faithfulness says so and decides nothing.
    pf = next(g for g in ok.gates if g.gate == "prompt_faithfulness")
    assert not pf.required and "not applicable" in pf.reasons[0]
    assert soft.outcome == "FAIL"
    failed = [m.metric for g in soft.gates for m in g.metrics if m.outcome == "FAIL"]
    assert failed == ["sharpness"] and "sharpness" in " ".join(soft.reasons)
    assert "judged as resample" in "\n".join(summary_lines(verdict))


def test_a_consistent_worsening_inside_the_margin_fails_as_a_regression(judged):
    _, verdict = judged
    duller = _candidate(verdict, "duller")
    contrast = next(m for g in duller.gates for m in g.metrics if m.metric == "contrast")
    assert duller.outcome == "FAIL" and contrast.outcome == "FAIL"
    assert contrast.mean_value > -contrast.threshold  # within the non-inferiority margin...
    assert contrast.p_worse == pytest.approx(2.0 ** -16) and "consistently worse" in contrast.reasons[-1]
    # ...and a benign candidate's symmetric deltas trigger no regression.
    ok = _candidate(verdict, "resampled")
    assert all(m.p_worse_holm > 0.01 for g in ok.gates for m in g.metrics if m.p_worse_holm is not None)


def test_a_recipe_without_a_kind_is_inconclusive_never_guessed(judged):
    _, verdict = judged
    c = _candidate(verdict, "undeclared")
    assert c.judge is None and c.outcome == "INCONCLUSIVE"
    assert "declares no [signoff] kind" in c.reasons[0]


def test_floor_of_a_per_clip_score_is_its_difference_between_seeds(tmp_path):
    from types import SimpleNamespace

    from h3eval.floor import floor_from_results

    store = make_run(tmp_path, candidates=["b-newseed"], n_prompts=2)
    write_result(store, "reference_free", "b-newseed", "p00", 0, {"sharpness": (5.0, True), "sharpness.baseline":
                                                                  (3.0, True)})
    write_result(store, "reference_free", "b-newseed", "p01", 0, {"sharpness": (1.0, True), "sharpness.baseline":
                                                                  (2.0, True)})
    metrics, counts = floor_from_results(store, SimpleNamespace(name="b"), ["reference_free"])
    assert metrics == {"reference_free.sharpness": 1.5} and counts == {"reference_free.sharpness": 2}


def test_power_warning_under_16_pairs(tmp_path):
    store = make_run(tmp_path, candidates=["r"], n_prompts=4)
    manifest = store.read_manifest()
    manifest.recipes["r"] = {"name": "r", "signoff": {"kind": "resample"}}
    store.write_manifest(manifest)
    verdict = compute_verdict(tmp_path, load_policy(RELEASE))
    c = _candidate(verdict, "r")
    assert c.outcome == "INCONCLUSIVE" and "only 4 pairs" in c.warnings[0] and "seed 002" in c.warnings[0]


def test_the_report_says_which_judge_and_why(judged):
    from h3eval.report import render_markdown

    _, verdict = judged
    text = render_markdown(verdict)
    assert "## softer: FAIL\n\nJudged as **resample**: recipe 'softer' declares [signoff] kind = 'resample'" in text
    assert "Judged as **exact**" in text
