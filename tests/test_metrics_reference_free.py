"""The reference-free gate as the artifact detectors' adapter: each detector's statistic is written as a
lower-is-better dimension with its threshold and flag in ``info["artifacts"]``, equal to the metric module's own
result; off by option; not run on clips too short for it."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from gates import reference_free as rf
from gates.base import get_gate
from gates.metrics import audio_clicks, audio_dropout, echo, frozen_frames


def _clip(frames=40, h=64, w=80, speed=2):
    x = ndimage.gaussian_filter(np.random.default_rng(0).normal(0, 1, (h, w + speed * frames)), 1.2)
    x = 120 + 40 * x / x.std()
    clip = np.stack([x[:, speed * i: speed * i + w] for i in range(frames)])
    return np.repeat(np.clip(np.rint(clip), 0, 255).astype(np.uint8)[..., None], 3, axis=-1)


def _audio(seconds=40 / 24):
    t = np.arange(int(seconds * 32000)) / 32000
    x = 0.2 * np.sin(2 * np.pi * 440 * t)
    return np.stack([x, x])


def test_artifact_statistics_are_the_metric_modules_results():
    frames, audio = _clip(), _audio()
    frames[20] = frames[19]
    options = rf.ReferenceFreeOptions(niqe_frame_stride=40)
    scores, info = rf.score_clip(frames, 24.0, audio, 32000, options)
    assert scores["echo_score"] == echo.echo(frames).statistic
    assert scores["frozen_frames"] == frozen_frames.frozen_frames(frames).statistic == 1.0
    assert info["artifacts"]["frozen_frames"]["flagged"] is True
    assert info["artifacts"]["frozen_frames"]["threshold"] == frozen_frames.THRESHOLD
    assert scores["dropout_ms"] == audio_dropout.audio_dropout(audio, 32000).statistic
    assert scores["click_score"] == audio_clicks.audio_clicks(audio, 32000).statistic
    assert set(rf.ARTIFACTS) <= set(scores)
    gate = get_gate("reference_free")
    for name, dim in rf.ARTIFACTS.items():
        assert dim.higher_is_better is False
        assert gate.metrics[name].higher_is_better is False and gate.metrics[name + ".baseline"].unit == dim.unit
    off, off_info = rf.score_clip(frames, 24.0, audio, 32000, rf.ReferenceFreeOptions(niqe_frame_stride=40,
                                                                                      artifact_detectors=False))
    assert not set(rf.ARTIFACTS) & set(off) and "artifacts" not in off_info
    assert {k: off[k] for k in rf.DIMENSIONS} == pytest.approx({k: scores[k] for k in rf.DIMENSIONS}, rel=1e-12)


def test_short_clips_get_no_artifact_statistics():
    scores, info = rf.score_clip(_clip(frames=12), 24.0, None, None, rf.ReferenceFreeOptions(niqe_frame_stride=12))
    assert not set(rf.ARTIFACTS) & set(scores) and info["artifacts"].startswith("not run: 12 frames")
