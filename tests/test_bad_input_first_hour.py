"""The first hour's bad input (issue 51): each ends in one clear line and exit 3, nothing written; gates that cannot
apply to imported clips say so once and record it as not applicable; an imported run has a floor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from h3.media import encode_mp4
from h3eval.cli import app
from h3eval.synth import moving_square_frames, tone_pcm

runner = CliRunner()


def clip(path: Path, seed: int = 0, size: int = 32, frames: int = 12, fps: int = 12, freq: float = 440.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    encode_mp4(path, moving_square_frames(frames, size, seed), tone_pcm(frames / fps, freq=freq), fps=fps)
    return path


def one_error_line(result, message: str) -> None:
    assert result.exit_code == 3, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output


@pytest.fixture()
def folder(tmp_path):
    clip(tmp_path / "clips" / "a.mp4")
    return tmp_path / "clips"


def import_args(folder: Path, manifest: Path, out: Path) -> list[str]:
    return ["import", "--baseline-dir", f"base={folder}", "--candidate-dir", f"fp8={folder}", "--manifest",
            str(manifest), "--out", str(out)]


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_an_empty_manifest_imports_nothing_and_says_so(folder, tmp_path, text):
    manifest = folder / "m.jsonl"
    manifest.write_text(text)
    one_error_line(runner.invoke(app, import_args(folder, manifest, tmp_path / "run")), "names no clip")
    assert not (tmp_path / "run").exists()


def test_a_manifest_with_only_side_lines_names_no_clip(folder, tmp_path):
    manifest = folder / "m.jsonl"
    manifest.write_text(json.dumps({"side": "fp8", "kind": "near"}) + "\n")
    one_error_line(runner.invoke(app, import_args(folder, manifest, tmp_path / "run")), "names no clip")


def test_empty_folders_import_nothing_and_say_so(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    result = runner.invoke(app, ["import", "--baseline-dir", str(tmp_path / "a"), "--candidate-dir",
                                 str(tmp_path / "b"), "--out", str(tmp_path / "run")])
    one_error_line(result, "no clip named <prompt_id>-s<seed>.mp4")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key, value, message", [
    ("file", "../x.mp4", "leaves the manifest's folder"),
    ("file", "sub/../../x.mp4", "leaves the manifest's folder"),
    ("file", "ABSOLUTE", "is an absolute path"),
    ("sglang_perf_dump", "../perf.json", "leaves the manifest's folder"),
    ("sglang_perf_dump", "ABSOLUTE", "is an absolute path"),
])
def test_a_manifest_cannot_name_files_outside_its_folder(folder, tmp_path, key, value, message):
    outside = clip(tmp_path / "x.mp4")
    (tmp_path / "perf.json").write_text(json.dumps({"total_duration_ms": 1000.0}))
    value = str(outside if key == "file" else tmp_path / "perf.json") if value == "ABSOLUTE" else value
    line = {"side": "baseline", "file": "a.mp4", "prompt_id": "p", "seed": 0, key: value}
    manifest = folder / "m.jsonl"
    manifest.write_text(json.dumps(line) + "\n")
    result = runner.invoke(app, import_args(folder, manifest, tmp_path / "run"))
    one_error_line(result, message)
    assert f"{manifest}:1: " in result.output
    assert not (tmp_path / "run").exists()


def test_a_side_line_timing_file_outside_the_folder_is_refused(folder, tmp_path):
    (tmp_path / "t.json").write_text(json.dumps({"p-s0": 1.0}))
    lines = [{"side": "baseline", "file": "a.mp4", "prompt_id": "p", "seed": 0},
             {"side": "fp8", "timings": "../t.json"}]
    manifest = folder / "m.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    one_error_line(runner.invoke(app, import_args(folder, manifest, tmp_path / "run")), "leaves the manifest's folder")


def test_a_bad_perf_dump_is_one_clear_error(folder, tmp_path):
    (folder / "perf.json").write_text(json.dumps({"total_duration_ms": float("nan")}))
    line = {"side": "baseline", "file": "a.mp4", "prompt_id": "p", "seed": 0, "sglang_perf_dump": "perf.json"}
    manifest = folder / "m.jsonl"
    manifest.write_text(json.dumps(line) + "\n")
    one_error_line(runner.invoke(app, import_args(folder, manifest, tmp_path / "run")),
                   "total_duration_ms: nan is not a latency")


@pytest.fixture()
def imported_run(tmp_path):
    """An imported run of 2 prompts x 2 seeds, the candidate a copy of the baseline (no kinds, no timings)."""
    base, cand = tmp_path / "base", tmp_path / "cand"
    cand.mkdir()
    for pid in ("a", "b"):
        for seed in (0, 1):
            clip(base / f"{pid}-s{seed}.mp4", seed=10 * seed + ord(pid), size=48, frames=24, fps=24,
                 freq=300.0 + 60 * seed + ord(pid))
            shutil.copyfile(base / f"{pid}-s{seed}.mp4", cand / f"{pid}-s{seed}.mp4")
    out = tmp_path / "run"
    result = runner.invoke(app, ["import", "--baseline-dir", f"ref={base}", "--candidate-dir", f"fp8={cand}",
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "fp8: no signoff kind (declare it: --kind fp8=exact|near|resample), no timing data" in result.output
    return out


def test_opcheck_and_trajectory_say_once_that_they_cannot_apply_to_imported_clips(imported_run):
    from h3eval.store import RunStore, read_gate_result

    result = runner.invoke(app, ["gate", str(imported_run), "--gates", "opcheck,trajectory", "--no-progress"])
    assert result.exit_code == 0, result.output  # not applicable is not a failure
    assert "RecipeError" not in result.output and "unknown key" not in result.output
    lines = result.output.strip().splitlines()
    for gate in ("opcheck", "trajectory"):
        assert f"{gate}: 4 pairs, 4 computed, 0 resumed, 4 identical, 0 flagged, 0 errors, 4 not applicable" in lines
        said = [line for line in lines if line.startswith(f"  {gate}: cannot apply to imported clips")]
        assert len(said) == 1 and said[0].endswith("(recorded as not applicable, not as a failure)"), result.output
        store = RunStore(imported_run)
        results = [read_gate_result(p) for p in store.gate_result_files(gate, "fp8")]
        assert len(results) == 4 and all(r.status == "not_applicable" and r.error is None for r in results)
    assert lines[-1].startswith("next: h3eval verdict ")


def test_floor_from_an_imported_run(imported_run, tmp_path):
    from h3eval.policy import load_floor

    result = runner.invoke(app, ["floor", "--from-run", str(imported_run), "--recipe", "ref", "--gates", "audio",
                                 "--out", str(tmp_path / "floor")])
    assert result.exit_code == 0, result.output
    floor = load_floor(tmp_path / "floor" / "floor.json")
    assert floor.metrics["audio.stft_distance"] > 0 and floor.sha256  # the tones of different seeds differ
    assert json.loads((tmp_path / "floor" / "floor.json").read_text())["pairs_per_metric"]["audio.stft_distance"] == 4
    assert result.output.strip().splitlines()[-1] == (
        f"next: h3eval verdict {imported_run} --policy release --floor {tmp_path / 'floor' / 'floor.json'} --write")


def test_verdict_before_gate_names_the_command_to_run(imported_run):
    for command in ("verdict", "report"):
        result = runner.invoke(app, [command, str(imported_run), "--policy", "release"])
        one_error_line(result, f"run `h3eval gate {imported_run} --policy release` first (nothing was judged)")
    assert not (imported_run / "verdict.json").exists()


@pytest.mark.parametrize("args, message", [
    ([], "choose the gates with --gates NAME,... or with --policy NAME|FILE"),
    (["--gates", "integrity", "--policy", "release"], "one of the two"),
    (["--policy", "relase"], "policy 'relase' is neither a file nor a shipped policy (" + ", ".join(
        sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "gates" / "policies").glob("*.toml"))) + ")"),
    (["--policy", "release", "-o", "nosuch=1"], "option 'nosuch' is not an option of the chosen gates"),
])
def test_gate_bad_choice_of_gates_is_one_clear_error(imported_run, args, message):
    result = runner.invoke(app, ["gate", str(imported_run), *args, "--no-progress"])
    one_error_line(result, message)
    assert not (imported_run / "gates").exists()
