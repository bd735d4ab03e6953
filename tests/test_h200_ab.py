"""The production-scale chain (bench/full_size_ab/h200_ab.py): its gate list covers what the release policy judges by, where it can
run on the device; bench/full_size_ab/h200_ab_render.py on planted work folders: the gate time per pair counts only pairs the
gates scored, gate errors are named, and ``--merge`` keeps the shapes of other calls."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench.lib.ab import GATES as CHAIN_GATES
from bench.lib.ab import POLICY
from bench.lib.ab import render_all

GATES = ["integrity", "fidelity", "audio", "ghosting", "trajectory"]


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def plant(work: Path, shape: str, *, baseline_s: float = 80.0, candidate_s: float = 20.0) -> Path:
    """One shape's chain as a one-shape device call leaves it: baseline seed 0 made, seed 1 cut by the time box; the
    candidate's two seeds made; the gates scored seed 0 (two gates errored on a missing module) and failed every gate
    of seed 1 at once (no baseline clip)."""
    config = {"model": "h3-random", "device": "cuda", "layout": "shared", "shapes": [shape], "prompts": {shape: 1},
              "seeds": "0,1", "candidates": ["turbo4-sparse"], "gates": GATES, "off_identity": [], "warmup": 0,
              "policy": "release.toml", "lora_dir": "/tmp/lora"}
    _write(work / "config.json", config)
    for step in (f"ab-{shape}", f"gates-{shape}", f"verdict-{shape}", f"report-{shape}"):
        _write(work / "steps" / f"{step}.json", {"step": step, "status": "done"})
    run = work / "runs" / shape
    _write(run / "run.json", {"baseline": "baseline", "candidates": ["turbo4-sparse"], "status": "partial",
                              "errors": [{"error": "quality/baseline/p-s1: not run: the time box ends"}],
                              "model": "h3-random", "extra": {"ab": {}}, "hardware": {"gpu": "NVIDIA H200"}})
    quality = {}
    for recipe, seconds, seeds in (("baseline", baseline_s, (0,)), ("turbo4-sparse", candidate_s, (0, 1))):
        for seed in seeds:
            _write(run / "clips" / recipe / f"p-s{seed}.json", {"request": {"prompt_id": "p", "seed": seed},
                                                                "extra": {"model_load_s": {"build_and_draw_s": 40.0,
                                                                                           "placement_s": 60.5,
                                                                                           "levers_s": 2.0}}})
        quality[recipe] = {"status": "ok", "n": len(seeds),
                           "generation_side_latency_s": {"p50": seconds, "p90": seconds},
                           "request_to_file_latency_s": {"p50": seconds + 20, "p90": seconds + 20},
                           "stage_anatomy_median_s": {"denoise": seconds - 5}, "peak_memory_bytes": 80e9}
    _write(run / "speed.json", {"notices": [], "protocols": {"quality_clips": quality}})
    pair = {"candidate": "turbo4-sparse", "prompt_id": "p"}
    missing = "baseline clip baseline/p-s1 is not finished: /tmp/w/runs/x/clips/baseline/p-s1.json is missing"
    _write(work / f"gate_timing-{shape}.json", {
        "gates": GATES, "device": "cuda",
        "pairs": [{**pair, "seed": 0, "seconds": 3.0, "computed_results": 5},
                  {**pair, "seed": 1, "seconds": 0.001, "computed_results": 5}],
        "errors": [{**pair, "seed": 0, "gate": "fidelity", "error": "ModuleNotFoundError: No module named 'lpips'"},
                   *[{**pair, "seed": 1, "gate": g, "error": missing} for g in GATES]]})
    return work


def test_gate_time_per_pair_leaves_out_pairs_no_gate_scored_and_names_gate_errors(tmp_path):
    work = plant(tmp_path / "w", "5s-128x128")
    assert render_all(work, tmp_path / "out") == 0
    figures = json.loads((tmp_path / "out" / "h200_ab_5s-128x128.json").read_text())
    sparse = figures["recipes"]["turbo4-sparse"]
    # the seed-1 pair failed every gate in a millisecond (no baseline clip): not a gate time
    assert sparse["gate_pairs_timed"] == 1 and sparse["gate_s_per_pair_median"] == 3.0
    assert sparse["gate_time_fraction"] == 3.0 / 20.0 and sparse["pairs"] == 1
    assert figures["gate_pairs_unscored"] == [{"candidate": "turbo4-sparse", "prompt_id": "p", "seed": 1,
                                               "error": "baseline clip baseline/p-s1 is not finished"}]
    assert figures["gate_errors_on_scored_pairs"] == [
        {"gate": "fidelity", "error": "ModuleNotFoundError: No module named 'lpips'", "pairs": 1}]
    text = (tmp_path / "out" / "h200_ab_5s-128x128.md").read_text()
    assert "| turbo4-sparse | 1 | 3.00 | 20.00 | 15.0 % (missed) |" in text
    assert "fidelity: ModuleNotFoundError: No module named 'lpips' (1 pair)" in text
    assert "turbo4-sparse p-s1 (baseline clip baseline/p-s1 is not finished)" in text


def test_merge_keeps_the_shapes_other_work_folders_rendered(tmp_path):
    out = tmp_path / "out"
    small = plant(tmp_path / "small", "5s-128x128", baseline_s=10.0, candidate_s=4.0)
    large = plant(tmp_path / "large", "5s-544x960", baseline_s=80.0, candidate_s=14.0)
    assert render_all(small, out) == 0
    assert render_all(large, out) == 0  # without --merge: this work folder's shapes only
    assert set(json.loads((out / "h200_ab.json").read_text())["baseline"]) == {"5s-544x960"}
    assert render_all(small, out, merge=True) == 0
    summary = json.loads((out / "h200_ab.json").read_text())
    assert set(summary) == {"baseline", "turbo4-sparse"}
    assert summary["baseline"]["5s-544x960"]["generation_side_p50_s"] == 80.0
    assert summary["baseline"]["5s-128x128"]["generation_side_p50_s"] == 10.0
    assert summary["turbo4-sparse"]["5s-544x960"] == {
        "request_to_file_p50_s": 34.0, "generation_side_p50_s": 14.0, "peak_memory_gb": 80.0,
        "gate_time_fraction": 3.0 / 14.0, "pairs": 1, "partial": True}
    # a re-render of a shape replaces it, keeping the other
    assert render_all(plant(tmp_path / "again", "5s-128x128", candidate_s=5.0), out, merge=True) == 0
    summary = json.loads((out / "h200_ab.json").read_text())
    assert summary["turbo4-sparse"]["5s-128x128"]["generation_side_p50_s"] == 5.0
    assert summary["turbo4-sparse"]["5s-544x960"]["generation_side_p50_s"] == 14.0


def test_the_chain_runs_every_gate_of_the_release_policy_that_needs_no_other_environment():
    """A resample candidate (turbo4-sparse, turbo4-fp8-sage-compile) is judged by reference_free, vbench and
    prompt_faithfulness: the chain runs reference_free (no downloaded weights); vbench needs its own environment and
    prompt_faithfulness world ground truth, so those stay INCONCLUSIVE on the device."""
    from gates.base import known_gates
    from h3eval.policy import load_policy

    policy = load_policy(POLICY).policy
    judged_by = set(policy.all_gates())
    assert "reference_free" in policy.judges["resample"].gates
    assert judged_by - set(CHAIN_GATES) == {"vbench", "prompt_faithfulness"}
    assert set(CHAIN_GATES) <= set(known_gates())


def test_the_gates_step_writes_the_new_seed_floor_from_the_baselines_own_seeds(tmp_path):
    """``bench/full_size_ab/h200_ab.py gates --floor-out``: after timing the pairs, the same process gates the baseline's seed-0
    clip against its seed-1 clip and back (the new-seed view of h3eval.floor) and writes floor.json, whose audio floor
    is the mean of the audio gate's values on those pairs; with one seed it writes none and says why."""
    import argparse

    import numpy as np

    from bench.lib.ab import gates as gates_step
    from h3eval.store import RunStore, read_gate_result
    from h3eval.synth import make_synthetic_run, moving_square_frames, tone_pcm
    from tests.conftest import FAST_RECIPE

    def frames(recipe, pid, seed):
        return moving_square_frames(seed=seed)

    def audio(recipe, pid, seed):
        return tone_pcm(1.0, 440.0 + 60.0 * seed)

    def make(root, seeds):
        store = make_synthetic_run(root, candidates=["turbo4-sparse"], seeds=seeds, frames_fn=frames, audio_fn=audio)
        manifest = store.read_manifest()  # a real recipe for the baseline, as an ab run records it
        manifest.recipes = {name: {**FAST_RECIPE, "name": name} for name in manifest.recipes}
        store.write_manifest(manifest)

    run = tmp_path / "run"
    make(run, [0, 1])
    args = argparse.Namespace(run=str(run), device="cpu", gates="integrity,audio", option=[],
                              timing=str(tmp_path / "timing.json"), floor_out=str(tmp_path / "floor"))
    assert gates_step(args) == 0
    timing = json.loads((tmp_path / "timing.json").read_text())
    assert timing["floor"]["written"] and timing["floor"]["gates"] == ["audio"]
    assert timing["gate_threads"] == (min(2, os.cpu_count()) if os.cpu_count() >= 2 else 1)  # side by side: 2+ cores
    for pair in timing["pairs"]:  # each gate's own seconds, within the pair's (side by side: they overlap)
        assert set(pair["per_gate_s"]) == {"integrity", "audio"}
        assert 0 < max(pair["per_gate_s"].values()) <= pair["seconds"]
        if timing["gate_threads"] == 1:
            assert sum(pair["per_gate_s"].values()) <= pair["seconds"]
    floor = json.loads((tmp_path / "floor" / "floor.json").read_text())
    values = [read_gate_result(RunStore(tmp_path / "floor").gate_result_path("audio", "baseline-newseed", "p0", seed))
              .metrics["stft_distance"].value for seed in (0, 1)]  # each seed against the other seed's clip
    assert min(values) > 0 and floor["metrics"]["audio.stft_distance"] == np.mean(values)

    one = tmp_path / "one"
    make(one, [0])
    args = argparse.Namespace(run=str(one), device="cpu", gates="audio", option=[],
                              timing=str(tmp_path / "t1.json"), floor_out=str(tmp_path / "floor1"))
    assert gates_step(args) == 0
    info = json.loads((tmp_path / "t1.json").read_text())["floor"]
    assert not info["written"] and "at least two seeds" in info["why"]
    assert not (tmp_path / "floor1" / "floor.json").exists()


def test_a_chain_with_another_baseline_runs_ab_and_takes_the_floor_from_that_recipe(tmp_path):
    """``chain --baseline R`` (a lever added to a fast recipe, measured against it): ab is asked for R as its baseline,
    and the gates step's new-seed floor comes from R's own clips (the run manifest's baseline), not from a stock
    ``baseline`` the run does not have."""
    import argparse

    from bench.lib.ab import _ab_argv, chain_config
    from bench.lib.ab import gates as gates_step
    from h3eval.synth import make_synthetic_run, moving_square_frames, tone_pcm
    from tests.conftest import FAST_RECIPE

    args = argparse.Namespace(model="h3-random", device="cuda", layout="shared", shapes="5s-544x960", prompts="*=1",
                              seeds="0,1", candidates="bench/full_size_ab/recipes/turbo4-fp8-sage-compile-vaec.toml",
                              gates="integrity", off_identity="", warmup=1, warmup_recipes="", baseline_last=False,
                              baseline="turbo4-fp8-sage-compile", policy="release.toml", work=str(tmp_path))
    config = chain_config(args)
    argv = _ab_argv(config, "5s-544x960", tmp_path, None)
    assert argv[argv.index("--baseline") + 1] == "turbo4-fp8-sage-compile"
    assert argv[argv.index("--candidate") + 1] == "bench/full_size_ab/recipes/turbo4-fp8-sage-compile-vaec.toml"
    assert _ab_argv({**config, "baseline": "baseline"}, "5s-544x960", tmp_path, None)[5] == "baseline"

    run = tmp_path / "run"
    store = make_synthetic_run(run, baseline="fast", candidates=["vaec"], seeds=[0, 1],
                               frames_fn=lambda r, p, s: moving_square_frames(seed=s),
                               audio_fn=lambda r, p, s: tone_pcm(1.0, 440.0 + 60.0 * s))
    manifest = store.read_manifest()  # real recipes, as an ab run records them
    manifest.recipes = {name: {**FAST_RECIPE, "name": name} for name in manifest.recipes}
    store.write_manifest(manifest)
    args = argparse.Namespace(run=str(run), device="cpu", gates="audio", option=[],
                              timing=str(tmp_path / "timing.json"), floor_out=str(tmp_path / "floor"))
    assert gates_step(args) == 0
    floor = json.loads((tmp_path / "timing.json").read_text())["floor"]
    assert floor["written"], floor
    assert (tmp_path / "floor" / "floor.json").is_file()
    assert sorted(p.name for p in (tmp_path / "floor" / "gates" / "audio").iterdir()) == ["fast-newseed"]


def test_the_gate_process_first_pair_is_reported_apart_from_the_per_pair_median(tmp_path):
    """The first pair of the gate process loads the models (cold); with other pairs timed it is left out of the
    median and named, with its seconds, in the record."""
    work = plant(tmp_path / "w", "5s-128x128")
    timing_path = work / "gate_timing-5s-128x128.json"
    timing = json.loads(timing_path.read_text())
    pair = {"candidate": "turbo4-sparse", "prompt_id": "p", "computed_results": 5}
    timing["pairs"] = [{**pair, "seed": 0, "seconds": 30.0, "per_gate_s": {"integrity": 29.0, "audio": 1.0}},
                       {**pair, "seed": 1, "seconds": 3.0, "per_gate_s": {"integrity": 2.5, "audio": 0.5}}]
    timing["errors"] = []
    timing["floor"] = {"written": True, "gates": ["audio"], "metrics": 3, "gate_errors": 0, "seconds": 1.5}
    timing_path.write_text(json.dumps(timing))
    assert render_all(work, tmp_path / "out") == 0
    figures = json.loads((tmp_path / "out" / "h200_ab_5s-128x128.json").read_text())
    sparse = figures["recipes"]["turbo4-sparse"]
    assert sparse["gate_s_per_pair_median"] == 3.0 and sparse["gate_pairs_timed"] == 1
    assert figures["gate_cold_first_pair"] == {"candidate": "turbo4-sparse", "prompt_id": "p", "seed": 0,
                                               "seconds": 30.0}
    text = (tmp_path / "out" / "h200_ab_5s-128x128.md").read_text()
    assert "first pair (turbo4-sparse p-s0) took 30.00 s" in text and "New-seed floor: written" in text
    assert "build and draw 40.0 s, placement 60.5 s, levers 2.0 s; 102.5 s in all" in text
    assert "decodes both clips): integrity 2.50, audio 0.50." in text  # the warm pair's, the cold one left out


def test_a_candidate_whose_only_gated_pair_was_the_cold_first_takes_the_shapes_warm_pairs(tmp_path):
    """The gates' work per pair depends on the shape: a candidate whose one pair was the gate process's cold first
    (models loading, CUDA warming) is not charged with it; its fraction uses the shape's warm pairs, and says so."""
    shape = "5s-128x128"
    work = plant(tmp_path / "w", shape)
    run = work / "runs" / shape
    manifest = json.loads((run / "run.json").read_text())
    _write(run / "run.json", {**manifest, "candidates": ["turbo4-fp8", "turbo4-sparse"]})
    _write(run / "clips" / "turbo4-fp8" / "p-s0.json", {"request": {"prompt_id": "p", "seed": 0}})
    speed = json.loads((run / "speed.json").read_text())
    speed["protocols"]["quality_clips"]["turbo4-fp8"] = {
        "status": "ok", "n": 1, "generation_side_latency_s": {"p50": 10.0, "p90": 10.0},
        "request_to_file_latency_s": {"p50": 14.0, "p90": 14.0}, "stage_anatomy_median_s": None}
    _write(run / "speed.json", speed)
    timing_path = work / f"gate_timing-{shape}.json"
    timing = json.loads(timing_path.read_text())
    timing["pairs"] = [{"candidate": "turbo4-fp8", "prompt_id": "p", "seed": 0, "seconds": 14.0,
                        "computed_results": 5},
                       {"candidate": "turbo4-sparse", "prompt_id": "p", "seed": 0, "seconds": 3.0,
                        "computed_results": 5}]
    timing["errors"] = []
    timing_path.write_text(json.dumps(timing))
    assert render_all(work, tmp_path / "out") == 0
    recipes = json.loads((tmp_path / "out" / f"h200_ab_{shape}.json").read_text())["recipes"]
    assert recipes["turbo4-fp8"]["gate_s_per_pair_median"] == 3.0 and recipes["turbo4-fp8"]["gate_s_source"] == "shape"
    assert recipes["turbo4-fp8"]["gate_time_fraction"] == 3.0 / 10.0
    assert recipes["turbo4-sparse"]["gate_s_source"] == "own" and recipes["turbo4-sparse"]["gate_time_fraction"] == 0.15
    text = (tmp_path / "out" / f"h200_ab_{shape}.md").read_text()
    assert "| turbo4-fp8 | 1 | 3.00 (the shape's warm pairs: its own was the cold first) | 10.00 | 30.0 %" in text


def test_steps_run_at_home_an_ab_cut_while_exiting_and_first_and_last_steps_are_said_so(tmp_path):
    """A device call whose box cut ab after its run completed (the process was exiting) and left the verdict and
    report to ``finish`` at home: nothing is missing, and the record says where those steps ran. A 4-step recipe's
    step median mixes its compile steps with its warm ones: the first and last steps are reported apart (medians over
    the requests' own step lists)."""
    shape = "5s-128x128"
    work = plant(tmp_path / "w", shape)
    run = work / "runs" / shape
    manifest = json.loads((run / "run.json").read_text())
    _write(run / "run.json", {**manifest, "status": "complete", "errors": []})
    _write(work / "steps" / f"ab-{shape}.json", {"step": f"ab-{shape}", "status": "timeout"})
    for step in (f"verdict-{shape}", f"report-{shape}"):
        _write(work / "steps" / f"{step}.json", {"step": step, "status": "done", "where": "home: vm"})
    for seed, steps in ((0, [18.3, 9.9, 4.23, 4.22]), (1, [7.5, 4.4, 4.1, 4.0])):
        path = run / "clips" / "turbo4-sparse" / f"p-s{seed}.json"
        record = json.loads(path.read_text())
        _write(path, {**record, "timings": {"stage_anatomy": {"denoise_steps": steps}}})
    assert render_all(work, tmp_path / "out") == 0
    figures = json.loads((tmp_path / "out" / f"h200_ab_{shape}.json").read_text())
    assert figures["missing_steps"] == [] and figures["ab_exit_late"]
    assert figures["steps_elsewhere"] == {f"verdict-{shape}": "home: vm", f"report-{shape}": "home: vm"}
    anatomy = figures["recipes"]["turbo4-sparse"]["stage_anatomy_median_s"]
    assert anatomy["denoise_step_first"] == (18.3 + 7.5) / 2 and anatomy["denoise_step_last"] == (4.22 + 4.0) / 2
    text = (tmp_path / "out" / f"h200_ab_{shape}.md").read_text()
    assert f"run after the device call (home: vm): verdict-{shape}, report-{shape}" in text
    assert "stopped at its limit after the run had completed" in text and "(12.90 / 4.11)" in text


def test_finish_runs_the_verdict_and_report_the_box_cut_at_home_with_this_checkouts_policy(tmp_path):
    """``bench/full_size_ab/h200_ab.py finish``: on a restored work folder whose verdict step timed out on the device and whose
    report never ran, it runs both here (the device's policy path does not exist here: the same policy file of this
    checkout is used), marks them done with where they ran, and leaves a done gates step alone."""
    import argparse

    from bench.lib.ab import finish
    from bench.lib.ab import gates as gates_step
    from h3eval.synth import make_synthetic_run
    from tests.conftest import FAST_RECIPE

    shape = "5s-128x128"
    work = tmp_path / "w"
    run = work / "runs" / shape
    store = make_synthetic_run(run, candidates=["turbo4-sparse"], seeds=[0])
    manifest = store.read_manifest()
    manifest.recipes = {name: {**FAST_RECIPE, "name": name} for name in manifest.recipes}
    store.write_manifest(manifest)
    assert gates_step(argparse.Namespace(run=str(run), device="cpu", gates="integrity", option=[],
                                         timing=str(work / f"gate_timing-{shape}.json"), floor_out=None)) == 0
    _write(work / "config.json", {"model": "h3-random", "device": "cuda", "layout": "shared", "shapes": [shape],
                                  "prompts": {shape: 1}, "seeds": "0", "candidates": ["turbo4-sparse"],
                                  "gates": ["integrity"], "off_identity": [], "warmup": 0,
                                  "policy": "/nonexistent/device/checkout/gates/policies/release.toml"})
    gates_mark = {"step": f"gates-{shape}", "status": "done", "at": "device"}
    _write(work / "steps" / f"gates-{shape}.json", gates_mark)
    _write(work / "steps" / f"verdict-{shape}.json", {"step": f"verdict-{shape}", "status": "timeout"})
    assert finish(argparse.Namespace(work=str(work))) == 0
    for step in (f"verdict-{shape}", f"report-{shape}"):
        mark = json.loads((work / "steps" / f"{step}.json").read_text())
        assert mark["status"] == "done" and mark["where"].startswith("home: ")
    verdict = json.loads((run / "verdict.json").read_text())
    assert verdict["policy_name"] == "release" and verdict["outcome"] in ("FAIL", "INCONCLUSIVE")
    assert (run / "report.md").is_file()
    assert json.loads((work / "steps" / f"gates-{shape}.json").read_text()) == gates_mark
    assert "release.toml" in (work / "progress.log").read_text()


def test_snapshot_with_a_hard_linked_record_restores_and_a_link_out_of_the_folder_is_refused(tmp_path):
    """The floor folder hard-links the baseline's records into the work folder: the snapshot stores the link and
    restore makes it again (the 2026-12-01 state could not be restored); a link pointing outside is refused."""
    import argparse
    import io
    import os
    import tarfile

    import pytest

    from bench.lib.ab import restore, snapshot

    work = tmp_path / "w"
    (work / "runs" / "s" / "clips" / "baseline").mkdir(parents=True)
    record = work / "runs" / "s" / "clips" / "baseline" / "p-s0.json"
    record.write_text('{"request": {"seed": 0}}')
    (work / "floor-s" / "clips" / "baseline").mkdir(parents=True)
    os.link(record, work / "floor-s" / "clips" / "baseline" / "p-s0.json")
    (work / "config.json").write_text("{}")
    assert snapshot(argparse.Namespace(work=str(work), out=str(tmp_path / "snap"), max_mib=15.0, max_parts=2)) == 0
    assert restore(argparse.Namespace(state=str(tmp_path / "snap"), work=str(tmp_path / "back"))) == 0
    for rel in ("runs/s/clips/baseline/p-s0.json", "floor-s/clips/baseline/p-s0.json"):
        assert (tmp_path / "back" / rel).read_text() == '{"request": {"seed": 0}}'

    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w:gz") as tar:
        link = tarfile.TarInfo("x.json")
        link.type, link.linkname = tarfile.LNKTYPE, "../../etc/passwd"
        tar.addfile(link)
    (tmp_path / "evil").mkdir()
    (tmp_path / "evil" / "state.tgz").write_bytes(evil.getvalue())
    with pytest.raises(SystemExit, match="refusing snapshot entry 'x.json'"):
        restore(argparse.Namespace(state=str(tmp_path / "evil"), work=str(tmp_path / "evil-out")))
