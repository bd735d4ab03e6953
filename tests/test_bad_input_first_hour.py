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


def clip(path: Path, seed: int = 0, size: int = 32, frames: int = 12, fps: int = 12) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    encode_mp4(path, moving_square_frames(frames, size, seed), tone_pcm(frames / fps), fps=fps)
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
    lines = [{"side": "baseline", "file": "a.mp4", "prompt_id": "p", "seed": 0}, {"side": "fp8", "timings": "../t.json"}]
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
