"""The prompt-faithfulness gate on clips the world's renderer draws with ground truth: a faithful clip scores 1, a
planted content fault (another colour, another direction, no tone) scores what it got wrong, and a prompt without
ground truth is not applicable (never a pass)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from h3.world.render import render_audio, render_video
from h3.world.scene import COLOURS, DIRECTIONS, sample_scene

FRAMES = 56  # a short clip keeps the test fast; the scene is drawn for that length, so its caption still holds


def _scenes():
    out = []
    for i in range(60):
        s = sample_scene(11, i, num_frames=FRAMES)
        if len(s.shapes) == 1 and s.shapes[0].bounces and not s.pan:
            out.append(s)
        if len(out) == 2:
            return out
    raise AssertionError("no suitable scene")


def _faulty(scene, fault: str):
    spec = scene.shapes[0]
    if fault == "colour":
        other = next(c for c in COLOURS if c != spec.colour and c not in ("white", "gray", "grey"))
        spec = dataclasses.replace(spec, colour=other)
    elif fault == "direction":
        opposite = {"left to right": "right to left", "right to left": "left to right",
                    "top to bottom": "bottom to top", "bottom to top": "top to bottom"}
        assert set(opposite) == set(DIRECTIONS)
        spec = dataclasses.replace(spec, direction=opposite[spec.direction])
    return dataclasses.replace(scene, shapes=[spec])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from h3eval.synth import make_synthetic_run

    root = tmp_path_factory.mktemp("faith")
    scenes = dict(zip(["p0", "p1"], _scenes()))
    drawn = {"baseline": scenes, "colour": {p: _faulty(s, "colour") for p, s in scenes.items()},
             "direction": {p: _faulty(s, "direction") for p, s in scenes.items()}}
    keys = [(r, p) for r in drawn for p in scenes]
    frames = dict(zip(keys, render_video([drawn[r][p] for r, p in keys]).numpy()))  # one batch: fast
    audio = dict(zip(keys, render_audio([drawn[r][p] for r, p in keys]).numpy()))
    pcm = {k: (np.clip(a.T, -1, 1) * 32767).astype(np.int16) for k, a in audio.items()}
    make_synthetic_run(root, candidates=["colour", "direction"], prompt_ids=list(scenes), seeds=[0],
                       frames_fn=lambda r, p, s: frames[(r, p)], audio_fn=lambda r, p, s: pcm[(r, p)],
                       prompt_fn=lambda p: scenes[p].caption())
    return root, scenes


def test_faithful_clips_score_one_and_planted_faults_name_the_aspect(run):
    from h3eval.gaterun import run_gates

    root, scenes = run
    assert not run_gates(root, ["prompt_faithfulness"], progress=False).errors
    for candidate, aspect in (("colour", "colour"), ("direction", "direction")):
        for pid in scenes:
            result = json.loads((root / "gates" / "prompt_faithfulness" / candidate / f"{pid}-s0.json").read_text())
            assert result["metrics"]["faithfulness.baseline"]["value"] == 1.0
            aspects = result["info"]["candidate"]["aspects"]
            assert aspects[aspect] is False, aspects
            right = sum(aspects.values())
            assert result["metrics"]["faithfulness"]["value"] == pytest.approx(right / len(aspects))
            assert result["flagged"] and aspect in result["flags"][0]


def test_a_prompt_without_ground_truth_is_not_applicable(tmp_path):
    from h3eval.gaterun import run_gates
    from h3eval.synth import make_synthetic_run

    make_synthetic_run(tmp_path, candidates=["c"], prompt_ids=["p0"], seeds=[0],
                       frames_fn=lambda r, p, s: np.full((8, 32, 32, 3), 60, np.uint8),
                       audio_fn=lambda r, p, s: np.zeros((8000, 2), np.int16))
    run_gates(tmp_path, ["prompt_faithfulness"], progress=False)
    result = json.loads((tmp_path / "gates" / "prompt_faithfulness" / "c" / "p0-s0.json").read_text())
    assert result["status"] == "not_applicable" and "no ground truth" in result["info"]["reason"]
    assert result["metrics"] == {}


def test_an_identical_pair_scores_the_baseline_once_with_the_full_evaluations_values(tmp_path, monkeypatch):
    """A bit-identical pair: the baseline's clip is scored once and its share is the candidate's, marked identical;
    without the shortcut both decoded clips give the same."""
    import shutil

    from gates import prompt_faithfulness as pf
    from h3eval.gaterun import run_gates
    from h3eval.synth import make_synthetic_run

    [scene, _] = _scenes()
    frames = render_video([scene]).numpy()[0]
    pcm = (np.clip(render_audio([scene]).numpy()[0].T, -1, 1) * 32767).astype(np.int16)
    make_synthetic_run(tmp_path / "a", candidates=["same"], prompt_ids=["p0"], seeds=[0],
                       frames_fn=lambda r, p, s: frames, audio_fn=lambda r, p, s: pcm,
                       prompt_fn=lambda p: scene.caption())
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    calls = []
    original = pf.clip_faithfulness
    monkeypatch.setattr(pf, "clip_faithfulness", lambda *a, **k: (calls.append(1), original(*a, **k))[1])
    assert not run_gates(tmp_path / "a", ["prompt_faithfulness"], progress=False).errors
    assert len(calls) == 1
    short = json.loads((tmp_path / "a" / "gates" / "prompt_faithfulness" / "same" / "p0-s0.json").read_text())
    assert short["identical"] and "short_circuit" in short["info"]
    assert short["metrics"]["faithfulness"]["value"] == short["metrics"]["faithfulness.baseline"]["value"] == 1.0
    monkeypatch.delattr(pf.PromptFaithfulnessGate, "identical_result")
    assert not run_gates(tmp_path / "b", ["prompt_faithfulness"], progress=False).errors
    assert len(calls) == 3
    full = json.loads((tmp_path / "b" / "gates" / "prompt_faithfulness" / "same" / "p0-s0.json").read_text())
    assert {k: v["value"] for k, v in full["metrics"].items()} == {k: v["value"] for k, v in short["metrics"].items()}
    assert full["info"]["candidate"]["aspects"] == short["info"]["candidate"]["aspects"]
