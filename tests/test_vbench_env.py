"""End to end: build the pinned VBench environment, score a tiny run through the subprocess, refuse tampering.

Slow (the environment build takes minutes: torch and its CUDA libraries from the local wheel mirror); CI runs it.
temporal_flickering is the one dimension that needs no downloaded model, so it is scored for real; the dimensions
that load a model are taken through the real subprocess up to their missing-checkpoint error.

``H3EVAL_VBENCH_TEST_ENV=PATH`` reuses (and, if needed, builds) an environment at PATH instead of a fresh one.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gates.vbench import RUNNER, evaluate_run
from h3eval.gaterun import run_context
from h3.atomic import atomic_write_json, sha256_file
from h3.media import decode_video
from gates.vbench.env import check_env, setup_env
from gates.vbench.pins import SOURCE_PINS_PATH, VBenchPinError, verify

pytestmark = pytest.mark.slow

DIM = "temporal_flickering"
FLICKER = 20  # gray levels added to every other frame of the candidate: a planted flicker of known size


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Path:
    reuse = os.environ.get("H3EVAL_VBENCH_TEST_ENV")
    path = Path(reuse or tmp_path_factory.mktemp("vbench") / "env")
    setup_env(path, [DIM])
    yield path
    if not reuse:
        shutil.rmtree(path, ignore_errors=True)  # about 6 GB (torch with its CUDA libraries)


def _frames(recipe: str, prompt_id: str, seed: int) -> np.ndarray:
    """Smooth content (a slow horizontal gradient drift); the candidate adds a flicker on every other frame."""
    # p1 clips last 5 s (120 frames at 24 fps): what VBench calls a long video.
    t = np.arange(120 if prompt_id == "p1" else 24)[:, None, None]
    x = np.arange(64)[None, None, :]
    y = np.arange(48)[None, :, None]
    base = 60 + 90 * (x + 0.5 * t + 4 * seed) / 64 + 30 * y / 48 + (10 if prompt_id == "p1" else 0)
    frames = np.repeat(base[..., None], 3, axis=-1) * np.array([1.0, 0.9, 0.8])
    if recipe == "flicker":
        frames[1::2] += FLICKER
    return np.clip(frames, 0, 255).astype(np.uint8)


def _audio(recipe: str, prompt_id: str, seed: int) -> np.ndarray:
    return np.zeros((32000, 2), dtype=np.int16)


def _reference_temporal_flickering(mp4: Path) -> float:
    """VBench's definition (vbench/temporal_flickering.py) in float64 over frames decoded with PyAV:
    1 - mean over consecutive frame pairs of the mean absolute difference, divided by 255."""
    frames, _ = decode_video(mp4)
    frames = frames.astype(np.float64)
    mae = [np.mean(np.abs(frames[i + 1] - frames[i])) for i in range(len(frames) - 1)]
    return (255.0 - float(np.mean(mae))) / 255.0


def _tiny_run(root: Path):
    from h3eval.synth import make_synthetic_run

    return make_synthetic_run(root, candidates=["flicker"], prompt_ids=["p0", "p1"], seeds=[0, 1],
                              frames_fn=_frames, audio_fn=_audio)


def test_environment_is_isolated_and_pins_match_the_wheel_record(env):
    info = check_env(env, [DIM])
    assert info.versions["vbench"] == "0.1.5"
    assert info.versions["numpy"].startswith("1.")  # vbench's numpy<2, beside the product's numpy 2
    # Independent reference for the committed pins: the sha256 the vbench wheel itself records for each file.
    record = {}
    site = Path(info.site_packages)
    with open(site / "vbench-0.1.5.dist-info" / "RECORD", newline="") as handle:
        for row in csv.reader(handle):
            if row[1].startswith("sha256="):
                record[row[0]] = base64.urlsafe_b64decode(row[1][7:] + "==").hex()
    pins = json.loads(SOURCE_PINS_PATH.read_text())["files"]
    assert {rel: record[rel] for rel in pins} == pins
    assert verify(env, [DIM]).problems == []


def test_tiny_run_is_scored_end_to_end_and_matches_the_definition(env, tmp_path):
    store = _tiny_run(tmp_path / "run")
    summary = evaluate_run(run_context(store.root, "vbench"), [DIM], env=env)

    assert summary["partial"] is False and summary["complete"] is True
    assert summary["mode"] == "custom_input" and summary["long_video_handling"] == "whole_clip"
    assert summary["long_videos"] == sorted(f"{r}/p1-s{s}" for r in ("baseline", "flicker") for s in (0, 1))
    assert summary["denominators"][DIM] == {"clips": {"eligible": 8, "scored": 8, "missing": 0, "error": 0},
                                           "pairs": {"eligible": 4, "scored": 4, "missing": 0, "error": 0}}
    prov = summary["provenance"]
    assert prov["source_pins_sha256"] == sha256_file(SOURCE_PINS_PATH)
    assert prov["env"]["versions"]["vbench"] == "0.1.5"
    assert summary["runner"]["device"] in ("cpu", "cuda")

    gate_dir = store.root / "gates" / "vbench"
    for recipe in ["baseline", "flicker"]:
        for pid in ["p0", "p1"]:
            for seed in [0, 1]:
                clip = json.loads((gate_dir / "clips" / recipe / f"{pid}-s{seed}.json").read_text())
                ref = _reference_temporal_flickering(store.clip_path(recipe, pid, seed))
                assert clip["scores"][DIM]["raw"] == pytest.approx(ref, abs=1e-6)
                assert clip["scores"][DIM]["normalized"] == pytest.approx((ref - 0.6293) / (1 - 0.6293), abs=1e-5)
                assert clip["long_video"] is (pid == "p1")
                assert clip["duration_s"] == pytest.approx(5.0 if pid == "p1" else 1.0)
    for pid in ["p0", "p1"]:
        for seed in [0, 1]:
            pair = json.loads((gate_dir / "flicker" / f"{pid}-s{seed}.json").read_text())
            base = _reference_temporal_flickering(store.clip_path("baseline", pid, seed))
            cand = _reference_temporal_flickering(store.clip_path("flicker", pid, seed))
            assert pair["status"] == "ok"
            assert pair["metrics"][f"{DIM}_delta"]["value"] == pytest.approx(cand - base, abs=1e-6)
            # The planted flicker costs about FLICKER/255 of the score (every transition gains ~FLICKER of MAE).
            assert pair["metrics"][f"{DIM}_delta"]["value"] == pytest.approx(-FLICKER / 255, abs=0.01)

    # Resumable: a second call reuses every clip's scores.
    again = evaluate_run(run_context(store.root, "vbench"), [DIM], env=env)
    assert again["reused_clips"] == 8 and again["rescored_clips"] == 0


def test_undecodable_and_missing_clips_make_the_result_partial_never_zero(env, tmp_path):
    store = _tiny_run(tmp_path / "run")
    # A clip VBench cannot decode: truncated, with its record updated so the store counts it as finished.
    mp4 = store.clip_path("flicker", "p0", 0)
    mp4.write_bytes(mp4.read_bytes()[:600])
    record_path = store.record_path("flicker", "p0", 0)
    record = json.loads(record_path.read_text())
    record["mp4_sha256"] = sha256_file(mp4)
    atomic_write_json(record_path, record)
    # A missing clip: its record is gone.
    store.record_path("baseline", "p1", 1).unlink()

    summary = evaluate_run(run_context(store.root, "vbench"), [DIM], env=env)
    assert summary["partial"] is True and summary["complete"] is False
    assert summary["denominators"][DIM] == {"clips": {"eligible": 8, "scored": 6, "missing": 1, "error": 1},
                                           "pairs": {"eligible": 4, "scored": 2, "missing": 1, "error": 1}}
    gate_dir = store.root / "gates" / "vbench"
    bad = json.loads((gate_dir / "flicker" / "p0-s0.json").read_text())
    assert bad["status"] == "error" and bad["metrics"][DIM]["value"] is None
    assert bad["metrics"][f"{DIM}_delta"]["value"] is None
    assert "cannot decode" in bad["error"] and str(mp4.resolve()) in bad["error"]
    gone = json.loads((gate_dir / "flicker" / "p1-s1.json").read_text())
    assert gone["metrics"][f"{DIM}_delta"]["value"] is None and "baseline not scored" in gone["error"]
    assert json.loads((gate_dir / "clips" / "baseline" / "p1-s1.json").read_text())["scores"][DIM]["raw"] is None


def test_one_changed_byte_in_a_pinned_file_stops_scoring(env, tmp_path):
    store = _tiny_run(tmp_path / "run")
    target = Path(check_env(env, [DIM]).site_packages) / "vbench" / "temporal_flickering.py"
    original = target.read_bytes()
    tampered = bytearray(original)
    tampered[200] ^= 0x01
    try:
        target.write_bytes(bytes(tampered))
        with pytest.raises(VBenchPinError, match=f"pinned VBench file changed: {target}"):
            evaluate_run(run_context(store.root, "vbench"), [DIM], env=env)
        assert not (store.root / "gates" / "vbench").exists()
    finally:
        target.write_bytes(original)
    assert verify(env, [DIM]).ok


MODEL_DIMENSIONS = ["imaging_quality", "overall_consistency", "subject_consistency", "background_consistency",
                    "aesthetic_quality", "motion_smoothness", "dynamic_degree"]


def test_model_dimensions_stop_at_the_missing_checkpoint_inside_the_subprocess(env, tmp_path):
    """The runner itself refuses a model dimension whose checkpoint is absent (and never downloads it); one
    subprocess for all seven, as a run would use."""
    store = _tiny_run(tmp_path / "run")
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    request = {
        "dimensions": MODEL_DIMENSIONS + [DIM],
        "clips": [{"key": "baseline/p0-s0", "path": str(store.clip_path("baseline", "p0", 0)), "prompt": "x"}],
        "cache_dir": str(cache), "device": "cpu", "work_dir": str(tmp_path / "work"),
        "pinned_files": json.loads(SOURCE_PINS_PATH.read_text())["files"],
    }
    (tmp_path / "request.json").write_text(json.dumps(request))
    python = check_env(env, [DIM]).python
    proc = subprocess.run([python, "-I", str(RUNNER), str(tmp_path / "request.json"), str(tmp_path / "out.json")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((tmp_path / "out.json").read_text())["dimensions"]
    for dimension in MODEL_DIMENSIONS:
        assert out[dimension]["clips"]["baseline/p0-s0"]["value"] is None
        assert out[dimension]["error"].startswith(f"missing checkpoint for {dimension}: {cache}/")
        assert out[dimension]["clips"]["baseline/p0-s0"]["error"] == out[dimension]["error"]
    # The model-free dimension in the same request is still scored.
    ref = _reference_temporal_flickering(store.clip_path("baseline", "p0", 0))
    assert out[DIM]["clips"]["baseline/p0-s0"]["value"] == pytest.approx(ref, abs=1e-6)
    assert list(cache.iterdir()) == []  # nothing was fetched into the cache


def test_per_pair_gate_interface_agrees_with_the_whole_run(env, tmp_path):
    from gates.base import ClipSide, PairContext, PairRef, get_gate

    store = _tiny_run(tmp_path / "run")
    pair = PairRef(baseline="baseline", candidate="flicker", prompt_id="p1", seed=0)
    sides = [ClipSide(recipe, store.clip_path(recipe, "p1", 0),
                      json.loads(store.record_path(recipe, "p1", 0).read_text())) for recipe in ("baseline", "flicker")]
    ctx = PairContext(run_dir=store.root, pair=pair, baseline=sides[0], candidate=sides[1],
                      artifact_dir=tmp_path / "art", options={"dimensions": [DIM], "env": str(env)})
    result = get_gate("vbench").evaluate(ctx)
    base = _reference_temporal_flickering(sides[0].mp4)
    cand = _reference_temporal_flickering(sides[1].mp4)
    assert result.status == "ok" and result.gate == "vbench"
    assert result.metrics[DIM].value == pytest.approx(cand, abs=1e-6)
    assert result.metrics[f"{DIM}_delta"].value == pytest.approx(cand - base, abs=1e-6)


def test_the_runner_rechecks_the_pins_itself_and_its_failure_is_a_clear_error(env, tmp_path, monkeypatch):
    """A pinned file changed between verification and import: the subprocess refuses before importing vbench, and
    the parent reports the subprocess failure as an error, scoring nothing."""
    from gates.vbench import ClipInput, VBenchRunnerError, run_scorer

    store = _tiny_run(tmp_path / "run")
    report = verify(env, [DIM])
    assert report.ok
    pins = json.loads(SOURCE_PINS_PATH.read_text())
    pins["files"]["vbench/utils.py"] = "0" * 64
    fake_pins = tmp_path / "pins.json"
    fake_pins.write_text(json.dumps(pins))
    clip = ClipInput("baseline", "p0", 0, store.clip_path("baseline", "p0", 0), "x", "", 1.0)
    import gates.vbench as gv

    monkeypatch.setattr(gv, "SOURCE_PINS_PATH", fake_pins)
    with pytest.raises(VBenchRunnerError, match=r"pinned VBench files do not match: changed .*vbench/utils\.py"):
        run_scorer([clip], [DIM], report, tmp_path / "work")
    assert not (tmp_path / "work" / "result.json").exists()
