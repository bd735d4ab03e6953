"""Issue 50's chain on the trained tiny preset, from `h3eval ab` through the verdict: turbo4-tiny PASS, its LoRA at 16x
the file's strength FAIL, the 8-step recipe without a LoRA FAIL.

The slow test reads the one run tests/_readme_workflow.py generates with the README's own commands (ab, gate
--policy, floor --from-run --policy, verdict): baseline, turbo4-tiny, the recipe-bug corpus's lora-16x plant
(bench/recipe_bugs/recipes/lora-16x.toml: lora.scale = 16 on turbo4-tiny, seed 001's "roughly 16x too strong") and
fewer-steps (8 steps, no distillation), 4 world-demo captions x 4 seeds = 16 pairs each (the policy's min_pairs), at
the trained tiny's own shape, one baseline for the three. CI has no VBench environment, so the policy is `demo` (the
release policy without VBench, gates/policies/demo.toml, generated from release.toml).

Every step runs under portable numerics (``H3_PORTABLE_NUMERICS=1``, h3/determinism.py; tests/_readme_workflow.py
passes its environment): the clips' and the gates' floats are the ones any x86-64 CPU with AVX2 computes, so the exact
outcomes are the same on CI's CPU, AMD or Intel, as on any other. In the runtime's default mode they were not: on a
Zen 1 AMD VM fewer-steps came out INCONCLUSIVE (Holm p 0.027 on dynamic degree) where the Intel VM FAILs it, and
turbo4-tiny was flagged on one pair at blocking 2.019 (session 23). bench/portable_numerics has the evidence (a clip's
bytes under the mode do not change when the libraries are capped at a Zen 1's ISA) and the cost.

The fast tests hold the ladder's shape: the shipped rungs over turbo4-tiny that change one `near` lever only, and the
full-size recipes left without a `parent` so the device drivers' runs gain no rung.
"""

from __future__ import annotations

import json

import pytest

from _readme_workflow import LORA_16X, readme_workflow

EXPECTED = {"turbo4-tiny": "PASS", "bug-lora-16x": "FAIL", "fewer-steps": "FAIL"}


def _judged(tmp_path_factory):
    flow = readme_workflow(tmp_path_factory)
    for name in ("ab", "gate", "floor"):
        step = flow.steps[name]
        assert step.returncode == 0, f"{' '.join(step.words)} exited {step.returncode}:\n{step.stderr[-3000:]}"
    verdict_step = flow.steps["verdict"]
    assert verdict_step.returncode == 1, verdict_step.stdout + verdict_step.stderr[-3000:]  # overall FAIL
    verdict = json.loads((flow.run_dir / "verdict.json").read_text(encoding="utf-8"))
    assert verdict["policy_name"] == "demo" and verdict["outcome"] == "FAIL"
    return {c["candidate"]: c for c in verdict["candidates"]}, verdict_step.stdout


@pytest.mark.slow
def test_the_16x_lora_fails_against_its_parent_and_the_baseline_and_the_8_step_recipe_never_passes(
        tmp_path_factory):
    """The part of the chain that holds on any CPU: the plant FAILs by a wide margin (15 of 16 pairs blocky, motion
    smoothness and faithfulness worse on 16 of 16 on the Zen 1 VM of session 23) and fewer-steps never PASSes."""
    found, out = _judged(tmp_path_factory)
    assert found["bug-lora-16x"]["outcome"] == "FAIL", out
    assert found["fewer-steps"]["outcome"] != "PASS", out
    # Who judged each: turbo4-tiny and fewer-steps as they declare (resample against the baseline); the plant names
    # turbo4-tiny as its parent, so it is a rung judged against it by the lever that differs (the LoRA's scale:
    # resample), and as the ladder's top against the baseline too, which it FAILs as well.
    assert (found["turbo4-tiny"]["judge"], found["turbo4-tiny"]["judged_against"]) == ("resample", None)
    assert (found["fewer-steps"]["judge"], found["fewer-steps"]["judged_against"]) == ("resample", None)
    plant = found["bug-lora-16x"]
    assert (plant["judge"], plant["judged_against"], plant["judge_source"]) == ("resample", "turbo4-tiny", "lineage")
    assert [d["lever"] for d in plant["lever_differences"]] == ["lora"]
    assert plant["against_baseline"]["outcome"] == "FAIL"
    # What executed: the plant's LoRA scale is flagged (16x its file's alpha / rank); turbo4-tiny's is not.
    assert any("16x the file's own alpha / rank" in f for f in plant["executed_flags"]), plant["executed_flags"]
    assert not any(f.startswith("lora") for f in found["turbo4-tiny"]["executed_flags"])
    # turbo4-tiny passes on its speed: 4 steps against 29.
    assert found["turbo4-tiny"]["speed"]["outcome"] == "PASS"


@pytest.mark.slow
def test_turbo4_tiny_passes_and_the_16x_lora_and_the_8_step_recipe_fail(tmp_path_factory):
    """Issue 50's done-when, exactly, on any CI CPU: the run's numerics are portable (the module docstring)."""
    found, out = _judged(tmp_path_factory)
    assert {name: found[name]["outcome"] for name in EXPECTED} == EXPECTED, out


def test_the_near_rungs_over_turbo4_tiny_change_one_near_lever():
    """turbo4-tiny-sparse (sparse attention, no new LoRA) and turbo4-tiny-int8 (INT8 W8A8 linears) name turbo4-tiny as
    their parent and differ from it by one lever that declares `near`: the near judge (same seeds, fidelity, the
    ghosting gate) decides them against turbo4-tiny; turbo4-tiny-sparse85 brings its own LoRAs and is resample."""
    from h3.recipe import lever_differences, lineage_kind, load_recipe

    parent = load_recipe("turbo4-tiny").resolved()
    for name, lever in (("turbo4-tiny-sparse", "sparse_attention"), ("turbo4-tiny-int8", "quant")):
        recipe = load_recipe(name)
        assert recipe.parent == "turbo4-tiny"
        differences = lever_differences(parent, recipe.resolved())
        assert [(d.lever, d.kind) for d in differences] == [(lever, "near")], name
        assert lineage_kind(differences) == "near"
    sparse = load_recipe("turbo4-tiny-sparse").sparse_attention
    assert (sparse.enabled, sparse.block_size, sparse.sparsity, sparse.dense_steps) == (True, 32, 0.5, 1)
    assert lineage_kind(lever_differences(parent, load_recipe("turbo4-tiny-sparse85").resolved())) == "resample"


def test_the_full_size_recipes_name_no_parent_so_the_device_runs_gain_no_rung():
    """A parent joins the run (h3eval.ladder): with `parent = "turbo4"` on turbo4-sparse, bench/device/h200_ab.sh's
    default candidates (the FP8 recipe and turbo4-sparse) would generate turbo4 as well, at full size. The full-size
    recipes are judged against the baseline as they declare; a ladder over turbo4 names its parents on the command line
    (`h3eval ab --candidate turbo4 --candidate turbo4-sparse`) or in a recipe of its own."""
    from h3.recipe import load_recipe
    from h3eval.ladder import ladder_recipes

    for name in ("turbo4", "turbo4-sparse", "turbo4-fp8", "turbo4-int8", "turbo4-fp8-sage", "turbo4-fp8-sage-compile"):
        assert load_recipe(name).parent is None, name
    candidates = [load_recipe("turbo4-fp8-sage-compile"), load_recipe("turbo4-sparse")]
    assert [r.name for r in ladder_recipes(load_recipe("baseline"), candidates)] == [c.name for c in candidates]


def test_the_chain_plants_the_16x_lora_through_the_real_setting():
    """The FAIL the chain expects comes from a recipe setting, not a test switch: turbo4-tiny's own LoRA at 16x."""
    from h3.recipe import lever_differences, load_recipe

    plant = load_recipe(LORA_16X)
    assert (plant.name, plant.parent, plant.lora.scale) == ("bug-lora-16x", "turbo4-tiny", 16.0)
    (difference,) = lever_differences(load_recipe("turbo4-tiny").resolved(), plant.resolved())
    assert difference.lever == "lora" and difference.kind == "resample"
