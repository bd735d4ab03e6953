"""`h3eval import`: clips from another stack, paired by name or manifest; unpaired or mismatched clips are errors."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from h3.media import decode_video, encode_mp4
from h3eval.commands.import_ import register, run_import
from h3eval.store import RunStore
from h3eval.synth import moving_square_frames, tone_pcm
from tests.conftest import tree_digest


def clip(path: Path, seed: int = 0, size: int = 64, fps: int = 24, frames: int = 48) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    encode_mp4(path, moving_square_frames(frames, size, seed), tone_pcm(frames / fps), fps=fps)
    return path


@pytest.fixture()
def folders(tmp_path):
    base, cand = tmp_path / "lightx2v-base", tmp_path / "lightx2v-fp8"
    for pid in "abce":
        clip(base / f"{pid}-s0.mp4", seed=ord(pid))
    cand.mkdir()
    shutil.copyfile(base / "a-s0.mp4", cand / "a-s0.mp4")  # the same file as its partner
    clip(cand / "b-s0.mp4", seed=ord("b"), size=32)  # different resolution
    clip(cand / "e-s0.mp4", seed=ord("e"), fps=25)   # different fps (and so duration)
    clip(cand / "d-s0.mp4", seed=ord("d"))           # no baseline partner
    return base, cand                                  # c has no candidate partner


def test_import_pairs_by_name_and_reports_every_bad_clip(folders, tmp_path):
    base, cand = folders
    out = tmp_path / "run"
    run = run_import(baseline_dir=str(base), candidate_dirs=[f"fp8={cand}"], out=out)
    assert run.status == "partial" and run.kind == "import" and run.backend == "folder"
    assert run.baseline == "lightx2v-base" and run.candidates == ["fp8"]
    errors = {(e.recipe, e.prompt_id): e.error for e in run.errors}
    assert set(errors) == {("fp8", "b"), ("fp8", "c"), ("fp8", "d"), ("fp8", "e")}
    assert "width 64 vs 32" in errors[("fp8", "b")] and "height 64 vs 32" in errors[("fp8", "b")]
    assert "no fp8 clip partners baseline" in errors[("fp8", "c")]
    assert "has no baseline partner" in errors[("fp8", "d")]
    assert "fps 24 vs 25" in errors[("fp8", "e")]
    store = RunStore(out)
    assert sorted(p.name for p in store.clip_dir("fp8").glob("*.mp4")) == ["a-s0.mp4"]
    assert sorted(p.name for p in store.clip_dir("lightx2v-base").glob("*.mp4")) == [
        "a-s0.mp4", "b-s0.mp4", "c-s0.mp4", "e-s0.mp4"]
    a_base, a_cand = store.read_record("lightx2v-base", "a", 0), store.read_record("fp8", "a", 0)
    frames, _ = decode_video(base / "a-s0.mp4")
    assert a_base.frames_sha256 == a_cand.frames_sha256 == hashlib.sha256(frames.tobytes()).hexdigest()
    assert a_base.extra["hash_source"] == "decoded" and a_base.shape.num_frames == 48
    assert (store.clip_path("fp8", "a", 0)).read_bytes() == (cand / "a-s0.mp4").read_bytes()
    # A rerun keeps what was imported and changes no clip.
    def clips_and_records():  # error files are rewritten (with a new time) by each attempt; clips must not be
        return {k: v for k, v in tree_digest(out / "clips").items() if not k.endswith(".error.json")}

    before = clips_and_records()
    again = run_import(baseline_dir=str(base), candidate_dirs=[f"fp8={cand}"], out=out)
    assert again.status == "partial" and len(again.errors) == 4
    assert clips_and_records() == before


def test_import_by_manifest_with_timings(tmp_path):
    clip(tmp_path / "comfy" / "out_0001.mp4", seed=1)
    clip(tmp_path / "comfy" / "out_0002.mp4", seed=1)
    lines = [{"side": "baseline", "file": "comfy/out_0001.mp4", "prompt_id": "p1", "seed": 3, "prompt": "a cat",
              "generation_side_latency_s": 80.5},
             {"side": "turbo", "file": "comfy/out_0002.mp4", "prompt_id": "p1", "seed": 3,
              "generation_side_latency_s": 15.25, "peak_memory_mb": 1024}]
    manifest = tmp_path / "pairs.jsonl"
    manifest.write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = run_import(baseline_dir=f"base={tmp_path / 'comfy'}", candidate_dirs=[f"turbo={tmp_path / 'comfy'}"],
                     out=tmp_path / "run", manifest=manifest)
    assert run.status == "complete" and run.errors == []
    store = RunStore(tmp_path / "run")
    turbo = store.read_record("turbo", "p1", 3)
    assert turbo.timings.generation_side_latency_s == 15.25 and turbo.peak_memory_bytes == 1024 * 2**20
    assert "timings.request_to_file_latency_s" in turbo.extra["unreported"]
    assert store.read_record("base", "p1", 3).request.prompt == "a cat"


def test_import_command_bad_input(folders, tmp_path):
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:
        pass

    base, cand = folders
    (cand / "weird name.mp4").write_bytes(b"x")
    cases = [(["--baseline-dir", str(tmp_path / "missing"), "--candidate-dir", str(cand)], 3, "does not exist"),
             (["--baseline-dir", str(base), "--candidate-dir", str(cand)], 3, "cannot pair weird name.mp4")]
    for args, code, message in cases:
        result = CliRunner().invoke(app, ["import", *args, "--out", str(tmp_path / "run")])
        assert result.exit_code == code, result.output
        assert message in result.output
    assert not (tmp_path / "run").exists()
