"""h3eval.reuse: an ab run reuses another run's clip only when it is the same request, and the clip it reuses is the
bytes the run would have made itself (the demo's floor clips in its signoff run, issue 51)."""

from __future__ import annotations

import json
import shutil

import pytest

from h3.recipe import load_recipe
from h3eval.ab import run_ab_from_args
from h3eval.prompts import load_prompts
from h3eval.reuse import reuse_clips, reuse_problems, reused_from
from h3eval.runner import RunPlan, fill_run
from h3eval.store import RunStore, read_finished_record
from tests.test_ab import write_prompts, write_recipe

SEEDS = [0, 1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A floor-like source run of the baseline (one warm-up, then its clips), an ab run reusing them and an ab run of
    the same requests made afresh: the random tiny preset, two steps, one prompt, two seeds."""
    root = tmp_path_factory.mktemp("reuse")
    prompts = write_prompts(root / "p.jsonl", {"a": "a red ball bounces"})
    base, cand = write_recipe(root), write_recipe(root, name="three", steps=3)
    source = root / "source"
    manifest = fill_run(RunPlan(out=source, model="tiny-random", recipes=[load_recipe(base)],
                                prompts=load_prompts(prompts), seeds=SEEDS, baseline="fast", kind="floor",
                                device="cpu", warmup=1), progress=False)
    assert manifest.status == "complete"
    common = dict(baseline=str(base), candidates=[str(cand)], prompts=prompts, model="tiny-random",
                  seeds=",".join(map(str, SEEDS)), warmup=0, speed_rounds=0, device="cpu", progress=False)
    run_ab_from_args(out=root / "reused", reuse={"fast": source}, **common)
    run_ab_from_args(out=root / "fresh", **common)
    return root, RunStore(source), RunStore(root / "reused"), RunStore(root / "fresh")


def test_the_reused_clips_are_the_bytes_a_fresh_run_makes(runs):
    """Every baseline clip of the reusing run came from the source (its record names it, its timings are the
    source's) and is byte-identical to the fresh run's own making of that request; the candidate's clips were made in
    the run and equal the fresh run's too; the source's warm-up is recorded and excluded, and speed.json pairs the candidate with the reused latencies."""
    _, source, reused, fresh = runs
    for pid in ("a",):
        for seed in SEEDS:
            got, src = reused.read_record("fast", pid, seed), source.read_record("fast", pid, seed)
            assert reused_from(got) == str(source.clip_path("fast", pid, seed).resolve())
            assert got.timings == src.timings and got.mp4_sha256 == src.mp4_sha256
            assert reused.clip_path("fast", pid, seed).read_bytes() == fresh.clip_path("fast", pid, seed).read_bytes()
            assert reused_from(fresh.read_record("fast", pid, seed)) is None
            made = reused.read_record("three", pid, seed)
            assert reused_from(made) is None and made.mp4_sha256 == fresh.read_record("three", pid, seed).mp4_sha256
    warm = [read_finished_record(p) for p in sorted(source.warmup_dir("fast").glob("*.mp4"))]
    assert len(warm) == 1 and warm[0].extra["warmup"] is True and warm[0].request.prompt_id == "a"
    speed = json.loads(reused.speed_json_path.read_text())["protocols"]["quality_clips"]
    assert speed["three"]["speedup"]["n_pairs"] == 2  # the candidate's latencies pair with the reused ones


def test_a_different_request_is_not_reused(runs, tmp_path):
    """Each fact that decides a clip's bytes, changed in the target's manifest, refuses the reuse and names itself;
    a source record that asked for another prompt text is skipped, so the target makes that clip."""
    _, source, reused, _ = runs
    target = reused.read_manifest()
    assert reuse_problems(source.read_manifest(), target, "fast") == []
    changes = {
        "recipe_sha256": ({"fast": "0" * 64}, "recipe 'fast' differs"),
        "plan": ({**target.plan, "height": target.plan["height"] * 2}, "height"),
        "hardware": ({**target.hardware, "torch_threads": 99}, "hardware differs"),
        "model": ("tiny-trained", "model differs"),
    }
    for key, (value, said) in changes.items():
        problems = reuse_problems(source.read_manifest(), target.model_copy(update={key: value}), "fast")
        assert len(problems) >= 1 and any(p.startswith(said) for p in problems), (key, problems)
    with_traj = target.model_copy(update={"plan": {**target.plan, "trajectory": True}})
    assert reuse_problems(source.read_manifest(), with_traj, "fast") == [
        "the target run records latent trajectories (not reused)"]

    planted = tmp_path / "source"
    shutil.copytree(source.root, planted)
    record = planted / "clips" / "fast" / "a-s0.json"
    data = json.loads(record.read_text())
    data["request"]["prompt"] = "another prompt"
    record.write_text(json.dumps(data))
    target_store = RunStore(tmp_path / "target")
    got = reuse_clips(planted, target_store, target, "fast", load_prompts(runs[0] / "p.jsonl"), SEEDS)
    assert got == ["a-s1"]
    assert target_store.read_record("fast", "a", 0) is None
