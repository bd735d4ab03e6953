"""Judging by lineage (issue 50): a recipe names its parent, each lever declares the judge a change of it implies, and
the judge of a candidate follows the levers that differ between it and its parent."""

from __future__ import annotations

import pytest

from h3.levers import REGISTRY
from h3.recipe import (KIND_ORDER, SETTING_KINDS, RecipeError, known_recipes, lever_differences, lineage_kind,
                       load_recipe, recipe_from_dict)


def _resolved(name: str) -> dict:
    return load_recipe(name).resolved()


def test_every_lever_declares_the_kind_a_change_of_it_implies():
    for config in REGISTRY:
        assert config.signoff_kind in KIND_ORDER, config.name
        assert config.signoff_why.strip(), config.name
    assert {k for k, _ in SETTING_KINDS.values()} <= set(KIND_ORDER)


def test_the_issues_levers_map_to_the_issues_kinds():
    kinds = {c.name: c.signoff_kind for c in REGISTRY}
    for lever in ("sparse_attention", "quant", "compile", "attention", "fp8_attention", "cache", "bucketing"):
        assert kinds[lever] == "near", lever
    for lever in ("offload", "adaln"):
        assert kinds[lever] == "exact", lever
    for lever in ("lora", "compensation_lora"):
        assert kinds[lever] == "resample", lever
    assert SETTING_KINDS["steps"][0] == "resample"


def test_parent_is_not_part_of_the_hash_and_a_recipe_without_one_resolves_as_before():
    data = _resolved("turbo4-tiny-int8")
    assert data["parent"] == "turbo4-tiny"
    without = {k: v for k, v in data.items() if k != "parent"}
    assert recipe_from_dict(without).sha256() == recipe_from_dict(data).sha256()
    assert "parent" not in _resolved("baseline")  # the resolved dict of a run recorded before parents is unchanged


def test_a_parent_must_be_a_recipe_name():
    data = {**_resolved("turbo4-tiny"), "parent": "../x"}
    with pytest.raises(RecipeError, match="parent"):
        recipe_from_dict(data)


def test_identity_differs_from_the_baseline_in_nothing_it_computes():
    # identity names fields of levers that are off (lora.fuse, adaln.disk_cache): an off lever does not differ.
    assert lever_differences(_resolved("baseline"), _resolved("identity")) == []
    assert lineage_kind([]) == "exact"


@pytest.mark.parametrize("parent,candidate,levers,kind", [
    ("baseline", "turbo4-tiny", {"steps", "lora"}, "resample"),
    ("baseline", "fewer-steps", {"steps"}, "resample"),
    ("baseline", "fp8-attention-emulated", {"fp8_attention"}, "near"),
    ("baseline", "fbc-cache", {"cache"}, "near"),
    ("turbo4-tiny", "turbo4-tiny-int8", {"quant"}, "near"),
    ("turbo4", "turbo4-sparse", {"bucketing", "sparse_attention", "compile", "vae_decoder"}, "near"),
    # turbo4-tiny-sparse85 loads run 13's LoRA, not turbo4-tiny's: the judge sees it (and the compensation LoRA).
    ("turbo4-tiny", "turbo4-tiny-sparse85", {"lora", "compensation_lora", "sparse_attention"}, "resample"),
])
def test_the_judge_is_the_strictest_kind_among_the_levers_that_differ(parent, candidate, levers, kind):
    diffs = lever_differences(_resolved(parent), _resolved(candidate))
    assert {d.lever for d in diffs} == levers
    assert lineage_kind(diffs) == kind
    lora = [d for d in diffs if d.lever == "lora"]
    if candidate == "turbo4-tiny-sparse85":
        assert (lora[0].parent["path"], lora[0].candidate["path"]) == ("@turbo4-tiny", "@turbo4-tiny-run13")


def test_an_exact_lever_alone_is_judged_exact_and_with_a_near_one_near():
    base = _resolved("turbo4-tiny")
    offload = {**base, "offload": {**base["offload"], "enabled": True}}
    assert lineage_kind(lever_differences(base, offload)) == "exact"
    both = {**offload, "quant": {**base["quant"], "mode": "int8_w8a8"}}
    assert {(d.lever, d.kind) for d in lever_differences(base, both)} == {("quant", "near"), ("offload", "exact")}
    assert lineage_kind(lever_differences(base, both)) == "near"


def test_every_shipped_parent_is_a_shipped_recipe():
    for name in known_recipes():
        parent = load_recipe(name).parent
        assert parent is None or parent in known_recipes(), (name, parent)


# -- the verdict -----------------------------------------------------------------------------------------------------
LINEAGE_POLICY = """
version = 1
name = "lineage-test"
min_pairs = 8
n_resamples = 2000

[speed]
min_speedup = 1.0

[gates.integrity]
max_flagged = 0

[judges.near]
why = "the same sample"

[judges.near.gates.ghosting]
run_test = { metric = "ghost_p_value", fdr = 0.01 }

[judges.near.gates.fidelity.metrics.lpips_mean]
direction = "lower_is_better"
max = 0.05

[judges.resample]
why = "another sample"

[judges.resample.gates.vbench.metrics.overall_consistency]
compare = "sides"
direction = "higher_is_better"
margin = 0.01
"""


def _ladder_run(tmp_path, *, parent="turbo", candidates=("turbo", "sparse")):
    """A run baseline -> turbo (turbo4-tiny's recipe) -> sparse (turbo + sparse attention, parent ``parent``)."""
    from h3eval.store import RunStore
    from verdict_fixtures import make_run

    speed = {"baseline": 3.0, "turbo": 2.0, "sparse": 1.0}
    store = make_run(tmp_path / "run", candidates=candidates, n_prompts=16,
                     latency=lambda recipe, pid, seed: speed[recipe])
    m = store.read_manifest()
    base = {**_resolved("baseline"), "name": "baseline"}
    turbo = {**_resolved("turbo4-tiny"), "name": "turbo"}
    sparse = {**turbo, "name": "sparse", "parent": parent,
              "sparse_attention": {**turbo["sparse_attention"], "enabled": True, "block_size": 32, "sparsity": 0.5}}
    m.recipes = {"baseline": base, "turbo": turbo, "sparse": sparse}
    RunStore(store.root).write_manifest(m)
    return store


def _write(store, gate, candidate, reference, metrics, rng_seed=0):
    """Gate results of ``candidate`` against ``reference`` for every pair; ``metrics(i)`` -> {name: (value, hib)}."""
    from gates.base import GateResult, Metric, PairRef
    from h3.atomic import atomic_write_json
    from h3eval.verdict.lineage import result_dir
    from verdict_fixtures import pairs_of

    for i, (pid, seed) in enumerate(pairs_of(store)):
        result = GateResult(gate=gate, pair=PairRef(baseline=reference, candidate=candidate, prompt_id=pid, seed=seed),
                            metrics={k: Metric(value=v, higher_is_better=h) for k, (v, h) in metrics(i).items()})
        path = result_dir(store, gate, candidate, reference, "baseline") / f"{pid}-s{seed}.json"
        atomic_write_json(path, result.model_dump(mode="json"))


def _judge(store, tmp_path):
    from h3eval.verdict import compute_verdict
    from h3eval.policy import load_policy

    policy = tmp_path / "lineage.toml"
    policy.write_text(LINEAGE_POLICY)
    return compute_verdict(store.root, load_policy(policy))


def _clean(store, *, ghost_p=None):
    import numpy as np

    rng = np.random.default_rng(5)
    uniform = rng.uniform(0.05, 1.0, 16)
    p_values = uniform if ghost_p is None else ghost_p
    for cand, ref in (("turbo", "baseline"), ("sparse", "baseline"), ("sparse", "turbo")):
        _write(store, "integrity", cand, ref, lambda i: {})
    base_oc = rng.uniform(0.2, 0.3, 16)
    for cand in ("turbo", "sparse"):
        _write(store, "vbench", cand, "baseline", lambda i: {
            "overall_consistency": (float(base_oc[i] + 0.001 * ((i % 3) - 1)), True),
            "overall_consistency.baseline": (float(base_oc[i]), True)})
    _write(store, "fidelity", "sparse", "turbo", lambda i: {"lpips_mean": (0.01 + 0.001 * (i % 4), False)})
    _write(store, "ghosting", "sparse", "turbo", lambda i: {"ghost_p_value": (float(p_values[i]), True)})


def test_a_rung_is_judged_near_against_its_parent_and_the_top_resample_against_the_baseline(tmp_path):
    store = _ladder_run(tmp_path)
    _clean(store)
    verdict = _judge(store, tmp_path)
    by = {c.candidate: c for c in verdict.candidates}
    turbo, sparse = by["turbo"], by["sparse"]
    assert (turbo.judge, turbo.judge_source, turbo.judged_against) == ("resample", "declared", None)
    assert (sparse.judge, sparse.judge_source, sparse.judged_against) == ("near", "lineage", "turbo")
    assert [d["lever"] for d in sparse.lever_differences] == ["sparse_attention"]
    assert "sparse_attention (near" in sparse.judge_reason and "'turbo'" in sparse.judge_reason
    assert {g.gate for g in sparse.gates} == {"integrity", "ghosting", "fidelity"}
    assert sparse.gates[0].evidence == ["gates/integrity/sparse/vs-turbo/"]
    # Speed of a rung is against the rung below: 2.0 s -> 1.0 s is 2x (against the baseline it would be 3x).
    assert sparse.speed.reference == "turbo" and abs(sparse.speed.speedup - 2.0) < 1e-9
    top = sparse.against_baseline
    assert top is not None and (top.judge, top.judge_source) == ("resample", "ladder top")
    assert {d["lever"] for d in top.lever_differences} == {"steps", "lora", "sparse_attention"}
    assert abs(top.speed.speedup - 3.0) < 1e-9
    assert sparse.outcome == "PASS" and top.outcome == "PASS", (sparse.reasons, top.reasons)
    assert [(r.candidate, r.below, r.judge) for r in verdict.ladder] == [("turbo", "baseline", "resample"),
                                                                        ("sparse", "turbo", "near")]
    assert abs(verdict.ladder[1].speedup - 2.0) < 1e-9


def test_a_ghost_against_the_parent_fails_the_rung_though_the_baseline_judge_would_pass_it(tmp_path):
    import numpy as np

    store = _ladder_run(tmp_path)
    p = np.full(16, 0.6)
    p[:5] = 1e-6  # five pairs with a lagged copy the parent's clip does not have
    _clean(store, ghost_p=p)
    sparse = {c.candidate: c for c in _judge(store, tmp_path).candidates}["sparse"]
    assert sparse.outcome == "FAIL" and sparse.own_outcome == "FAIL"
    assert sparse.against_baseline.outcome == "PASS"
    ghosting = next(g for g in sparse.gates if g.gate == "ghosting")
    assert ghosting.outcome == "FAIL" and len(ghosting.flagged) == 5


def test_a_rung_without_results_against_its_parent_is_inconclusive_and_says_how(tmp_path):
    store = _ladder_run(tmp_path)
    _clean(store)
    import shutil

    for gate in ("fidelity", "ghosting"):
        shutil.rmtree(store.root / "gates" / gate / "sparse" / "vs-turbo")
    sparse = {c.candidate: c for c in _judge(store, tmp_path).candidates}["sparse"]
    assert sparse.outcome == "INCONCLUSIVE"
    fidelity = next(g for g in sparse.gates if g.gate == "fidelity")
    assert any("pairs a candidate with its parent's clips" in r for r in fidelity.reasons)


def test_a_parent_absent_from_the_run_falls_back_to_the_declared_kind_with_a_warning(tmp_path):
    store = _ladder_run(tmp_path, parent="turbo4-tiny")
    _clean(store)
    sparse = {c.candidate: c for c in _judge(store, tmp_path).candidates}["sparse"]
    assert (sparse.judge, sparse.judge_source, sparse.judged_against) == ("resample", "declared", None)
    assert any("names parent 'turbo4-tiny', which has no clips in this run" in w for w in sparse.warnings)


def test_the_gate_runner_pairs_a_rung_with_its_parents_clips(tmp_path):
    """Same prompts, same seeds: the rung's clip against its parent's, written where the verdict reads it."""
    import numpy as np

    from h3eval.gaterun import run_gates
    from h3eval.policy import load_policy
    from h3eval.store import RunStore
    from h3eval.synth import make_synthetic_run
    from h3eval.verdict.lineage import pairing_gates
    from gates.base import GateResult

    store = make_synthetic_run(tmp_path / "run", candidates=("turbo", "sparse"), prompt_ids=("p0", "p1"))
    m = store.read_manifest()
    m.recipes["sparse"] = {**m.recipes["sparse"], "parent": "turbo"}
    RunStore(store.root).write_manifest(m)
    summary = run_gates(store.root, ["integrity"], progress=False)
    assert summary.pairs == 6 and not summary.errors  # turbo and sparse against the baseline, sparse against turbo
    rung = sorted((store.root / "gates" / "integrity" / "sparse" / "vs-turbo").glob("*.json"))
    assert [p.name for p in rung] == ["p0-s0.json", "p1-s0.json"]
    result = GateResult.model_validate_json(rung[0].read_text())
    assert (result.pair.baseline, result.pair.candidate, result.pair.prompt_id) == ("turbo", "sparse", "p0")
    assert np.isclose(len(list((store.root / "gates" / "integrity" / "sparse").glob("*.json"))), 2)
    # With a policy, each comparison runs the gates its judgement needs (here: a ladder of imported-style recipes
    # judged by their declared kinds; the rung by the near judge against its parent).
    for name, kind in (("turbo", "resample"), ("sparse", "near")):
        m.recipes[name] = {**m.recipes[name], "signoff": {"kind": kind}}
    policy = tmp_path / "lineage.toml"
    policy.write_text(LINEAGE_POLICY)
    needs = pairing_gates(load_policy(policy).policy, m)
    assert needs[("turbo", "sparse")] == {"integrity", "ghosting", "fidelity"}
    assert needs[("baseline", "sparse")] == {"integrity", "vbench"}  # the ladder's top, against the baseline
    assert needs[("baseline", "turbo")] == {"integrity", "vbench"}


def test_ab_generates_a_rungs_parent_in_the_same_run():
    from h3eval.ab import ladder_recipes
    from h3eval.runner import RunError

    base = load_recipe("baseline")
    names = [r.name for r in ladder_recipes(base, [load_recipe("turbo4-tiny-sparse85")])]
    assert names == ["turbo4-tiny", "turbo4-tiny-sparse85"]
    # Listed already (in any order): not added twice, and the parent comes first.
    names = [r.name for r in ladder_recipes(base, [load_recipe("turbo4-tiny-int8"), load_recipe("turbo4-tiny")])]
    assert names == ["turbo4-tiny", "turbo4-tiny-int8"]
    loop = recipe_from_dict({**_resolved("turbo4-tiny"), "name": "a", "parent": "b"})
    other = recipe_from_dict({**_resolved("turbo4-tiny"), "name": "b", "parent": "a"})
    with pytest.raises(RunError, match="loop"):
        ladder_recipes(base, [loop, other])
    orphan = recipe_from_dict({**_resolved("turbo4-tiny"), "name": "c", "parent": "no-such-recipe"})
    with pytest.raises(RunError, match="names parent 'no-such-recipe'"):
        ladder_recipes(base, [orphan])


def test_the_report_shows_each_rung_against_the_rung_below_with_its_judge_speed_and_quality(tmp_path):
    from h3eval.report import render_markdown

    store = _ladder_run(tmp_path)
    _clean(store)
    text = render_markdown(_judge(store, tmp_path))
    assert "## Ladder" in text
    assert ("| turbo | baseline | resample | steps, lora | 1.5x [1.5, 1.5] | integrity PASS, vbench PASS | **PASS** |"
            in text)
    assert "| sparse | turbo | near | sparse_attention | 2x [2, 2] | integrity PASS, ghosting PASS, fidelity PASS | " \
           "**PASS** |" in text
    assert "Judged as **near** against `turbo`" in text and "| sparse_attention | near |" in text
    assert "### sparse against the baseline `baseline` (the top of the ladder): PASS" in text
    assert "### speed (against `turbo`, the rung below): PASS" in text


def test_each_candidate_states_the_smallest_regression_its_run_could_detect(tmp_path):
    from h3eval import stats as S
    from h3eval.report import render_markdown

    store = _ladder_run(tmp_path)
    _clean(store)
    verdict = _judge(store, tmp_path)
    turbo = {c.candidate: c for c in verdict.candidates}["turbo"]
    (row,) = [d for d in turbo.detectable if d["metric"] == "vbench.overall_consistency"]
    metric = next(m for g in turbo.gates for m in g.metrics if m.metric == "overall_consistency")
    deltas = [p.delta for p in metric.pairs]
    import numpy as np

    expected = S.minimum_detectable_effect(float(np.std(deltas, ddof=1)), 16, alpha=0.025, power=0.8)
    assert row["mde"] == pytest.approx(expected, rel=1e-9) and row["margin"] == 0.01 and row["n_pairs"] == 16
    assert row["resolves"] is (expected <= 0.01)
    assert "Smallest regression this run could detect at its size (16 pairs" in render_markdown(verdict)


def test_a_rung_against_its_parent_reads_the_parents_own_new_seed_floor(tmp_path, monkeypatch):
    """Issue 50: a near rung's floor-relative bounds are its parent's new-seed floor (the parent's clips against the
    same prompt's next seed), measured from the run by h3eval.floor.parent_floors_from_run; without it, the run's
    (baseline's) floor, with a warning. The gate computation is planted (stand-in clips); the floor's value is checked
    against a float64 mean of the planted new-seed pairs."""
    import numpy as np

    from h3.atomic import atomic_write_json
    from h3eval import gaterun
    from h3eval.floor import parent_floors_from_run
    from h3eval.policy import load_policy, write_floor
    from h3eval.store import RunStore
    from h3eval.verdict import compute_verdict
    from h3eval.verdict.lineage import recipe_floor_path
    from verdict_fixtures import make_run

    store = make_run(tmp_path / "run", candidates=("turbo", "sparse"), n_prompts=4, seeds=(0, 1, 2, 3))
    m = store.read_manifest()
    turbo = {**_resolved("turbo4-tiny"), "name": "turbo"}
    m.recipes = {"baseline": {**_resolved("baseline"), "name": "baseline"}, "turbo": turbo,
                 "sparse": {**turbo, "name": "sparse", "parent": "turbo", "sparse_attention": {
                     **turbo["sparse_attention"], "enabled": True, "block_size": 32, "sparsity": 0.5}}}
    RunStore(store.root).write_manifest(m)
    _clean(store)
    policy_file = tmp_path / "lineage.toml"
    policy_file.write_text(LINEAGE_POLICY.replace("max = 0.05", "max = {fraction_of_floor = 0.1}"))
    loaded = load_policy(policy_file)
    base_floor = write_floor(tmp_path / "floor.json", {"fidelity.lpips_mean": 0.05}, recipe="baseline").path

    planted = {}

    def fake_run_gates(run, gates, **kwargs):
        """fidelity of turbo's clip of seed s+1 filed under seed s (the new-seed view), a value per pair."""
        from gates.base import GateResult, Metric, PairRef

        floor_store = RunStore(run)
        fm = floor_store.read_manifest()
        assert gates == ["fidelity"] and fm.baseline == "turbo" and fm.candidates == ["turbo-newseed"]
        rng = np.random.default_rng(11)
        for pid in fm.prompts.ids:
            for seed in fm.seeds:
                record = floor_store.read_record("turbo-newseed", pid, seed)
                assert record.extra["floor_source_seed"] == (seed + 1) % 4
                value = float(rng.uniform(0.2, 0.4))
                planted[(pid, seed)] = value
                result = GateResult(gate="fidelity", pair=PairRef(baseline="turbo", candidate="turbo-newseed",
                                                                   prompt_id=pid, seed=seed),
                                    metrics={"lpips_mean": Metric(value=value, higher_is_better=False)})
                path = floor_store.gate_result_dir("fidelity", "turbo-newseed") / f"{pid}-s{seed}.json"
                atomic_write_json(path, result.model_dump(mode="json"))
        return type("Summary", (), {"errors": []})()

    # without the parent's floor: the baseline's (0.1 x 0.05), said in a warning; the rung's LPIPS ~0.0115 FAILs it
    sparse = {c.candidate: c for c in compute_verdict(store.root, loaded, floor_path=base_floor).candidates}["sparse"]
    lpips = next(mv for g in sparse.gates if g.gate == "fidelity" for mv in g.metrics if mv.metric == "lpips_mean")
    assert abs(lpips.threshold - 0.1 * 0.05) < 1e-15 and lpips.outcome == "FAIL"
    assert any("no new-seed floor of the parent 'turbo'" in w for w in sparse.warnings), sparse.warnings

    monkeypatch.setattr(gaterun, "run_gates", fake_run_gates)
    got = parent_floors_from_run(store.root, loaded.policy, progress=False)
    expected = float(np.mean(np.abs(np.array(list(planted.values()), dtype=np.float64))))
    assert set(got) == {"turbo"} and len(planted) == 16
    assert abs(got["turbo"]["metrics"]["fidelity.lpips_mean"] - expected) < 1e-12
    assert recipe_floor_path(store, "turbo").is_file()

    verdict = compute_verdict(store.root, loaded, floor_path=base_floor)
    by = {c.candidate: c for c in verdict.candidates}
    lpips = next(mv for g in by["sparse"].gates if g.gate == "fidelity" for mv in g.metrics
                 if mv.metric == "lpips_mean")
    assert abs(lpips.threshold - 0.1 * expected) < 1e-12 and lpips.outcome == "PASS", lpips
    assert by["sparse"].floor.path == str(recipe_floor_path(store, "turbo"))
    assert not any("no new-seed floor" in w for w in by["sparse"].warnings)
    # the ladder top against the baseline and turbo itself keep the run's floor
    assert by["sparse"].against_baseline.floor.path == str(base_floor) and by["turbo"].floor.path == str(base_floor)
