"""Import as a signoff path: each candidate's signoff kind, parent and timings declared on the command line or in the
manifest land where the verdict reads them for recipes made here; a folder of imported clips reaches PASS for an
identical candidate and FAIL for a degraded one under the release policy (issue 51)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import typer
from typer.testing import CliRunner

from h3.media import encode_mp4
from h3eval.backends.folder import read_sglang_perf_dump
from h3eval.commands.import_ import register, run_import
from h3eval.gateplan import policy_path
from h3eval.policy import load_policy
from h3eval.runner import RunError
from h3eval.store import RunStore
from h3eval.synth import moving_square_frames, tone_pcm


def clip(path: Path, seed: int = 0, size: int = 32, frames: int = 12, fps: int = 12) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    encode_mp4(path, moving_square_frames(frames, size, seed), tone_pcm(frames / fps), fps=fps)
    return path


@pytest.fixture()
def two_folders(tmp_path):
    base, cand = tmp_path / "base", tmp_path / "cand"
    for pid in ("a", "b"):
        clip(base / f"{pid}-s0.mp4", seed=ord(pid))
        cand.mkdir(exist_ok=True)
        shutil.copyfile(base / f"{pid}-s0.mp4", cand / f"{pid}-s0.mp4")
    return base, cand


def app() -> typer.Typer:
    application = typer.Typer()
    register(application)

    @application.command("noop")
    def _noop() -> None:
        pass

    return application


def test_kind_parent_and_timings_on_the_command_line_reach_the_resolved_recipe(two_folders, tmp_path):
    base, cand = two_folders
    times = tmp_path / "times.json"
    times.write_text(json.dumps({"a-s0": 2.5, "b-s0.mp4": {"generation_side_latency_s": 3.0,
                                                           "request_to_file_latency_s": 3.5}}))
    base_times = tmp_path / "base-times.json"
    base_times.write_text(json.dumps({"a-s0": 10.0, "b-s0": 12.0}))
    out = tmp_path / "run"
    result = CliRunner().invoke(app(), ["import", "--baseline-dir", f"ref={base}", "--candidate-dir", f"fp8={cand}",
                                        "--kind", "fp8=near", "--parent", "fp8=ref", "--timings", f"fp8={times}",
                                        "--timings", f"baseline={base_times}", "--out", str(out)])
    assert result.exit_code == 0, result.output
    run = RunStore(out).read_manifest()
    assert run.recipes["fp8"]["signoff"]["kind"] == "near" and run.recipes["fp8"]["parent"] == "ref"
    assert "signoff" not in run.recipes["ref"] and "parent" not in run.recipes["ref"]
    # The verdict's judge lookup finds the declared kind where it finds a generated recipe's [signoff] kind.
    from h3eval.policy import load_policy
    from h3eval.verdict import choose_judge

    release = load_policy(Path(__file__).resolve().parent.parent / "gates" / "policies" / "release.toml").policy
    kind, why, problems = choose_judge(release, run, "fp8")
    assert kind == "near" and problems == [] and "declared on import" in why
    store = RunStore(out)
    a, b = store.read_record("fp8", "a", 0), store.read_record("fp8", "b", 0)
    assert a.timings.generation_side_latency_s == 2.5 and b.timings.request_to_file_latency_s == 3.5
    assert "timings.generation_side_latency_s" not in a.extra["unreported"]
    assert store.read_record("ref", "b", 0).timings.generation_side_latency_s == 12.0
    assert "fp8: kind near, parent ref, 2 of 2 clip(s) timed" in result.output
    assert result.output.strip().splitlines()[-1] == f"next: h3eval gate {out} --policy release"


def test_a_rerun_declares_a_kind_and_brings_timings_without_reimporting(two_folders, tmp_path):
    base, cand = two_folders
    out = tmp_path / "run"
    run_import(baseline_dir=f"ref={base}", candidate_dirs=[f"fp8={cand}"], out=out)
    store = RunStore(out)
    mp4_before = store.clip_path("fp8", "a", 0).stat().st_mtime_ns
    assert "signoff" not in store.read_manifest().recipes["fp8"]
    times = tmp_path / "t.json"
    times.write_text(json.dumps({"a-s0": 4.0}))
    run = run_import(baseline_dir=f"ref={base}", candidate_dirs=[f"fp8={cand}"], out=out, kinds=["fp8=exact"],
                     timings=[f"fp8={times}"])
    assert run.status == "complete" and run.recipes["fp8"]["signoff"]["kind"] == "exact"
    assert store.read_record("fp8", "a", 0).timings.generation_side_latency_s == 4.0
    assert store.clip_path("fp8", "a", 0).stat().st_mtime_ns == mp4_before  # the clip itself was kept
    # A rerun without --kind keeps the declaration on disk.
    assert run_import(baseline_dir=f"ref={base}", candidate_dirs=[f"fp8={cand}"], out=out
                      ).recipes["fp8"]["signoff"]["kind"] == "exact"


def test_the_manifest_declares_kind_parent_timings_and_sglang_perf_dumps(tmp_path):
    folder = tmp_path / "clips"
    for i in range(3):
        clip(folder / f"c{i}.mp4", seed=1)
    (folder / "perf.json").write_text(json.dumps({"total_duration_ms": 14959.11, "steps": [
        {"name": "TextEncodingStage", "duration_ms": 611.83}, {"name": "DenoisingStage", "duration_ms": 14289.46}]}))
    (folder / "turbo-times.json").write_text(json.dumps({"p-s3": 5.0}))
    lines = [{"side": "baseline", "file": "c0.mp4", "prompt_id": "p", "seed": 3, "sglang_perf_dump": "perf.json"},
             {"side": "turbo", "file": "c1.mp4", "prompt_id": "p", "seed": 3},
             {"side": "sparse", "file": "c2.mp4", "prompt_id": "p", "seed": 3, "generation_side_latency_s": 4.0},
             {"side": "turbo", "kind": "resample", "timings": "turbo-times.json"},
             {"side": "sparse", "kind": "near", "parent": "turbo"}]
    manifest = folder / "m.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = run_import(baseline_dir=f"base={folder}", candidate_dirs=[f"turbo={folder}", f"sparse={folder}"],
                     out=tmp_path / "run", manifest=manifest)
    assert run.status == "complete"
    assert run.recipes["turbo"]["signoff"]["kind"] == "resample" and "parent" not in run.recipes["turbo"]
    assert run.recipes["sparse"]["signoff"]["kind"] == "near" and run.recipes["sparse"]["parent"] == "turbo"
    store = RunStore(tmp_path / "run")
    assert store.read_record("base", "p", 3).timings.generation_side_latency_s == pytest.approx(14.95911, abs=1e-12)
    assert store.read_record("turbo", "p", 3).timings.generation_side_latency_s == 5.0
    assert store.read_record("sparse", "p", 3).timings.generation_side_latency_s == 4.0
    assert read_sglang_perf_dump(folder / "perf.json") == pytest.approx(14.95911)


@pytest.mark.parametrize("timing, message", [
    ({"a-s0": float("nan")}, "nan is not a latency"),
    ({"a-s0": 0}, "0 is not a latency"),
    ({"a-s0": -1.5}, "-1.5 is not a latency"),
    ({"a-s0": True}, "True is not a latency"),
    ({"a-s0": 10**400}, "is not a latency"),
    ({"a-s0": "12"}, "'12' is not a latency"),
    ({"zz-s0": 1.0}, "times zz-s0, which fp8 has no clip for"),
    ({"a-s0": {"generation_latency_s": 1.0}}, "unknown key 'generation_latency_s'"),
    ({"a_s0": 1.0}, "is not a clip name"),
    ({}, "non-empty JSON object"),
])
def test_a_bad_timing_file_is_one_clear_error(two_folders, tmp_path, timing, message):
    base, cand = two_folders
    times = tmp_path / "t.json"
    times.write_text(json.dumps(timing) if timing != {"a-s0": 10**400} else '{"a-s0": 1' + "0" * 400 + "}")
    result = CliRunner().invoke(app(), ["import", "--baseline-dir", str(base), "--candidate-dir", f"fp8={cand}",
                                        "--timings", f"fp8={times}", "--out", str(tmp_path / "run")])
    assert result.exit_code == 3, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args, message", [
    (["--kind", "fp8=approximate"], "the signoff kind is one of exact, near, resample"),
    (["--kind", "base=near"], "is the baseline"),
    (["--kind", "other=near"], "'other' is not a candidate of this import"),
    (["--kind", "fp8"], "use --kind NAME=VALUE"),
    (["--kind", "fp8=near", "--kind", "fp8=exact"], "fp8 given twice"),
    (["--parent", "fp8=fp8"], "cannot be its own parent"),
    (["--parent", "fp8=nowhere"], "'nowhere' is not a recipe of this import"),
])
def test_a_bad_declaration_is_one_clear_error(two_folders, tmp_path, args, message):
    base, cand = two_folders
    result = CliRunner().invoke(app(), ["import", "--baseline-dir", str(base), "--candidate-dir", f"fp8={cand}",
                                        *args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 3, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert not (tmp_path / "run").exists()


def test_a_parent_cycle_is_refused(two_folders, tmp_path):
    base, cand = two_folders
    with pytest.raises(RunError, match="a cycle x -> y -> x"):
        run_import(baseline_dir=str(base), candidate_dirs=[f"x={cand}", f"y={cand}"], out=tmp_path / "run",
                   parents=["x=y", "y=x"])


def test_without_any_timing_the_speed_check_says_no_timing_data(two_folders, tmp_path):
    """Imported clips without latencies: the speed part is INCONCLUSIVE and says so plainly (their records hold a
    placeholder 0, which once read as "latency not a positive number")."""
    from h3eval.policy import load_policy
    from h3eval.verdict import compute_verdict

    base, cand = two_folders
    out = tmp_path / "run"
    run_import(baseline_dir=f"ref={base}", candidate_dirs=[f"fp8={cand}"], out=out)
    policy = tmp_path / "speed.toml"
    policy.write_text('version = 1\nname = "speed-only"\nmin_pairs = 2\nn_resamples = 999\n'
                      '[speed]\nmin_speedup = 1.0\n')
    speed = compute_verdict(out, load_policy(policy)).candidates[0].speed
    assert speed.outcome == "INCONCLUSIVE" and speed.n_pairs == 0
    assert speed.reasons == ["no timing data: speed not judged (fp8, ref imported without latencies: give them with "
                             "`h3eval import ... --timings NAME=FILE` or in the manifest)"]
    # With the latencies of one side only, the other side is named.
    times = tmp_path / "t.json"
    times.write_text(json.dumps({"a-s0": 1.0, "b-s0": 1.0}))
    run_import(baseline_dir=f"ref={base}", candidate_dirs=[f"fp8={cand}"], out=out, timings=[f"ref={times}"])
    assert "(fp8 imported without latencies" in compute_verdict(out, load_policy(policy)).candidates[0].speed.reasons[0]
    times_fp8 = tmp_path / "t8.json"
    times_fp8.write_text(json.dumps({"a-s0": 0.5, "b-s0": 0.5}))
    run_import(baseline_dir=f"ref={base}", candidate_dirs=[f"fp8={cand}"], out=out, timings=[f"fp8={times_fp8}"])
    speed = compute_verdict(out, load_policy(policy)).candidates[0].speed
    assert speed.n_pairs == 2 and speed.speedup == pytest.approx(2.0)


@pytest.mark.slow
def test_imported_folders_reach_pass_and_fail_under_the_release_policy(tmp_path):
    """Issue 51's done-when: clips from another stack, imported with a manifest that declares kinds and latencies,
    gated and floored by the release policy, reach PASS for a candidate identical to the baseline (exact) and FAIL for
    a degraded one (near: the same clips under heavy noise), through the commands a new user runs."""
    import numpy as np

    from h3eval.cli import app as h3eval_app
    from h3eval.verdict import read_verdict

    folder = tmp_path / "stack"
    folder.mkdir()
    rng = np.random.default_rng(51)
    lines, latency = [], {}
    for p in range(4):  # 4 prompts x 4 seeds: the release policy's 16 pairs
        for seed in range(4):
            frames = moving_square_frames(24, 64, 10 * seed + p)
            audio = tone_pcm(1.0, freq=330.0 + 40 * seed + 10 * p)
            noisy = np.clip(frames.astype(np.int16) + rng.integers(-70, 71, frames.shape), 0, 255).astype(np.uint8)
            encode_mp4(folder / f"base-p{p}-s{seed}.mp4", frames, audio, fps=24)
            shutil.copyfile(folder / f"base-p{p}-s{seed}.mp4", folder / f"same-p{p}-s{seed}.mp4")
            encode_mp4(folder / f"noisy-p{p}-s{seed}.mp4", noisy, audio, fps=24)
            for side, seconds in (("baseline", 10.0 + p + 0.1 * seed), ("same", 9.5 + p), ("noisy", 5.0 + p)):
                latency[(side, f"p{p}", seed)] = seconds
                lines.append({"side": side, "file": f"{'base' if side == 'baseline' else side}-p{p}-s{seed}.mp4",
                              "prompt_id": f"p{p}", "seed": seed, "generation_side_latency_s": seconds})
    lines += [{"side": "same", "kind": "exact"}, {"side": "noisy", "kind": "near", "parent": "base"}]
    (folder / "manifest.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run, floor = tmp_path / "run", tmp_path / "floor"
    rand = ["-o", "fidelity.lpips_trunk=rand"]  # no AlexNet file offline: the random trunk, as the demo does

    def h3eval(*args: str, code: int = 0) -> str:
        result = CliRunner().invoke(h3eval_app, list(args))
        assert result.exit_code == code, result.output
        return result.output

    out = h3eval("import", "--baseline-dir", f"base={folder}", "--candidate-dir", f"same={folder}", "--candidate-dir",
                 f"noisy={folder}", "--manifest", str(folder / "manifest.jsonl"), "--out", str(run))
    assert out.strip().splitlines()[-1] == f"next: h3eval gate {run} --policy release"
    h3eval("verdict", str(run), "--policy", "release", code=3)  # before the gates: the one line naming them
    out = h3eval("gate", str(run), "--policy", "release", "--no-progress", *rand)
    assert "same: integrity, fidelity, audio" in out
    assert "noisy: integrity, ghosting, fidelity, audio, trajectory" in out
    assert out.strip().splitlines()[-1].startswith(
        f"next: h3eval floor --from-run {run} --recipe base --policy release")
    out = h3eval("floor", "--from-run", str(run), "--recipe", "base", "--policy", "release", "--out", str(floor), *rand)
    assert "floor gates from policy 'release' (exact, near): fidelity, audio, ghosting" in out
    h3eval("verdict", str(run), "--policy", "release", "--floor", str(floor / "floor.json"), "--write", code=1)

    verdict = read_verdict(run / "verdict.json")
    by_name = {c.candidate: c for c in verdict.candidates}
    assert verdict.outcome == "FAIL"
    assert by_name["same"].outcome == "PASS" and by_name["same"].judge == "exact"
    noisy = by_name["noisy"]
    assert noisy.outcome == "FAIL" and noisy.judge == "near"
    fidelity = next(g for g in noisy.gates if g.gate == "fidelity")
    lpips = next(m for m in fidelity.metrics if m.metric == "lpips_mean")
    floor_value = json.loads((floor / "floor.json").read_text())["metrics"]["fidelity.lpips_mean"]
    assert fidelity.outcome == "FAIL" and lpips.outcome == "FAIL"
    values = [json.loads(f.read_text())["metrics"]["lpips_mean"]["value"]
              for f in sorted((run / "gates" / "fidelity" / "noisy").glob("*.json"))]
    rule = load_policy(policy_path("release")).policy.judges["near"].gates["fidelity"].metrics["lpips_mean"]
    assert lpips.threshold == pytest.approx(rule.max.fraction_of_floor * floor_value)
    # Heavy noise makes every clip another sample as far as the near judge reads it: all 16 pairs at or past the
    # departed limit (a quarter of the floor), far more than the 2 it allows: FAIL with no mean left to judge.
    assert lpips.departed_limit == pytest.approx(rule.departed.at_least.fraction_of_floor * floor_value)
    assert len(values) == 16 and min(values) >= lpips.departed_limit and len(lpips.departed) == 16
    assert float(np.mean(values)) > lpips.threshold
    # Speed from the declared latencies: every pair's ratio lies in the CI's neighbourhood, and it is judged.
    ratios = [latency[("baseline", f"p{p}", s)] / latency[("noisy", f"p{p}", s)] for p in range(4) for s in range(4)]
    assert noisy.speed.n_pairs == 16 and noisy.speed.outcome == "PASS"
    assert min(ratios) <= noisy.speed.speedup <= max(ratios)


@pytest.fixture()
def resample_run(tmp_path, monkeypatch):
    """An imported run of 2 prompts x 2 seeds: ``turbo`` (resample) a copy of the baseline, ``fp8`` (exact) too; no
    VBench environment and no AlexNet file here, whatever this machine has."""
    monkeypatch.setenv("H3EVAL_VBENCH_ENV", str(tmp_path / "no-vbench-env"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))
    monkeypatch.delenv("H3EVAL_LPIPS_TRUNK", raising=False)
    base, cand = tmp_path / "base", tmp_path / "cand"
    cand.mkdir()
    for pid in ("a", "b"):
        for seed in (0, 1):
            clip(base / f"{pid}-s{seed}.mp4", seed=10 * seed + ord(pid), size=48, frames=24, fps=24)
            shutil.copyfile(base / f"{pid}-s{seed}.mp4", cand / f"{pid}-s{seed}.mp4")
    out = tmp_path / "run"
    run_import(baseline_dir=f"ref={base}", candidate_dirs=[f"turbo={cand}", f"fp8={cand}"], out=out,
               kinds=["turbo=resample", "fp8=exact"])
    return out


def test_gate_policy_runs_each_judges_gates_and_names_what_cannot_run_here(resample_run, tmp_path):
    from h3eval.cli import app as h3eval_app
    from h3eval.store import RunStore

    result = CliRunner().invoke(h3eval_app, ["gate", str(resample_run), "--policy", "release", "--no-progress"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    alexnet = tmp_path / "torch-home" / "hub" / "checkpoints" / "alexnet-owt-7be5be79.pth"
    fidelity = next(line for line in lines if line.startswith("fidelity: cannot run here: "))
    assert f"to run it: put alexnet-owt-7be5be79.pth at {alexnet}" in fidelity
    assert "or pass `-o fidelity.lpips_trunk=rand`" in fidelity
    vbench = next(line for line in lines if line.startswith("vbench: cannot run here: "))
    assert vbench.endswith("to run it: `h3eval vbench setup --dimensions temporal_flickering`")
    assert "turbo: integrity, reference_free, prompt_faithfulness" in lines
    assert "fp8: integrity, audio" in lines
    store = RunStore(resample_run)
    # Each gate's results go to the candidates whose judge needs it.
    assert store.gate_candidates("reference_free") == ["turbo"] and store.gate_candidates("audio") == ["fp8"]
    assert store.gate_candidates("integrity") == ["fp8", "turbo"] and "vbench" not in store.gates_present()
    assert lines[-1] == (f"next: h3eval floor --from-run {resample_run} --recipe ref --policy release --out "
                         f"{resample_run}-floor, then h3eval verdict {resample_run} --policy release --floor "
                         f"{resample_run}-floor/floor.json --write")
    # The verdict names the gates still missing and what would make them run.
    verdict = CliRunner().invoke(h3eval_app, ["verdict", str(resample_run), "--policy", "release"])
    tail = verdict.output.strip().splitlines()
    assert tail[-3] == (f"next: h3eval gate {resample_run} --policy release (no results yet: vbench for turbo; "
                        "fidelity for fp8)")
    assert tail[-2].startswith("  vbench: cannot run here: ") and tail[-1].startswith("  fidelity: cannot run here: ")


def test_floor_policy_gives_the_resample_judge_its_reference_free_floor(resample_run, tmp_path):
    from h3eval.cli import app as h3eval_app

    out = tmp_path / "floor"
    result = CliRunner().invoke(h3eval_app, ["floor", "--from-run", str(resample_run), "--recipe", "ref", "--policy",
                                             "release", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "floor gates from policy 'release' (resample, exact): reference_free, audio" in result.output
    assert "fidelity: cannot run here: " in result.output and "vbench: cannot run here: " in result.output
    metrics = json.loads((out / "floor.json").read_text())["metrics"]
    assert "reference_free.sharpness" in metrics and "audio.stft_distance" in metrics
    assert not any(key.startswith(("fidelity.", "vbench.")) for key in metrics)
