"""The reference-free gate as the artifact detectors' adapter: each detector's statistic is written as a
lower-is-better dimension with its threshold and flag in ``info["artifacts"]``, equal to the metric module's own
result; off by option; not run on clips too short for it. The dimensions' metric modules (gates/metrics/): each
declares the gate's direction, the metrics without a test of their own in test_gate_reference_free.py against a
float64 computation written out, the torch twins against the numpy metrics, NIQE's two backends against each other."""

from __future__ import annotations

import math

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


# -- the metric modules the gate declares (gates/metrics/, one per dimension) ------------------------------------------
DIMENSION_MODULES = {"motion_smoothness": "motion_smoothness", "dynamic_degree": "dynamic_degree", "niqe": "niqe",
                     "sharpness": "sharpness", "blur": "blur", "exposure_clipping": "exposure_clipping",
                     "contrast": "contrast", "colourfulness": "colourfulness", "loudness_lufs": "loudness",
                     "silence_fraction": "silence_fraction", "clipping_fraction": "clipping_fraction",
                     "av_sync": "av_sync"}


def test_every_dimension_has_its_module_with_the_declared_direction():
    import importlib

    assert set(DIMENSION_MODULES) == set(rf.DIMENSIONS)
    for name, module in DIMENSION_MODULES.items():
        mod = importlib.import_module(f"gates.metrics.{module}")
        assert mod.higher_is_better is rf.DIMENSIONS[name].higher_is_better, name
    for helper in ("luma", "flow"):
        assert importlib.import_module(f"gates.metrics.{helper}").higher_is_better is None


def _slow_silence(audio: np.ndarray, rate: int, window_s: float = 0.05, dbfs: float = -60.0) -> float:
    """Share of whole 50 ms windows whose RMS over every sample of every channel is below ``dbfs``, sample by
    sample in float64."""
    n = int(round(window_s * rate))
    count = audio.shape[-1] // n
    quiet = 0
    for k in range(count):
        total = sum(float(x) ** 2 for ch in audio for x in ch[k * n:(k + 1) * n])
        quiet += math.sqrt(total / (n * len(audio))) < 10 ** (dbfs / 20)
    return quiet / count


def test_silence_fraction_is_the_windowed_rms_written_out():
    rate = 8000
    rng = np.random.default_rng(2)
    # Windows straddling -60 dBFS (an RMS of 0.001): levels from -70 to -50 dBFS, channels at different levels.
    levels = 10 ** (rng.uniform(-70, -50, 23) / 20)
    audio = np.concatenate([lv * rng.normal(0, 1, (2, 400)) * np.array([[0.7], [1.2]]) for lv in levels], axis=1)
    assert rf.silence_fraction(audio, rate) == pytest.approx(_slow_silence(audio, rate), abs=1e-15)
    assert 0.2 < rf.silence_fraction(audio, rate) < 0.8
    mono = audio[0]
    assert rf.silence_fraction(mono, rate) == pytest.approx(_slow_silence(mono[None], rate), abs=1e-15)
    assert rf.silence_fraction(audio[:, :100], rate) == 1.0  # shorter than one window: nothing to hear


def test_clipping_fraction_counts_samples_at_the_clip_level():
    x = np.array([[0.0, 0.989, 0.99, -0.99, 1.0], [-1.0, 0.5, -0.98999, 0.2, 0.991]])
    assert rf.clipping_fraction(x) == pytest.approx(5 / 10)


def test_torch_twins_compute_the_numpy_metrics_frame_by_frame():
    """The GPU path's per-metric torch functions, run on the CPU, against the numpy functions of each frame."""
    import torch

    from gates.metrics.blur import blur_torch
    from gates.metrics.colourfulness import colourfulness_torch
    from gates.metrics.contrast import contrast_torch
    from gates.metrics.exposure_clipping import clipped_pixels
    from gates.metrics.sharpness import sharpness_torch

    frames = _clip(frames=5, h=37, w=45)
    frames[2] = np.random.default_rng(4).integers(0, 256, frames[2].shape, dtype=np.uint8)
    frames[3, :10] = 255
    gray = rf.luma(frames)
    t = torch.from_numpy(frames)
    g = torch.from_numpy(gray).double()
    for twin, numpy_metric, source in ((sharpness_torch, rf.sharpness, gray), (blur_torch, rf.blur, gray),
                                       (contrast_torch, rf.contrast, gray)):
        assert twin(g).numpy() == pytest.approx([numpy_metric(x) for x in source], rel=1e-9, abs=1e-12)
    assert colourfulness_torch(t).numpy() == pytest.approx([rf.colourfulness(f) for f in frames], rel=1e-9)
    assert int(clipped_pixels(torch.from_numpy(gray))) == int(clipped_pixels(gray)) == round(
        rf.exposure_clipping(gray) * gray.size)


def test_niqe_is_written_once_over_two_backends():
    """NIQE's torch path (niqe_frames_torch) runs the same pipeline as niqe_frame, only its MSCN and AGGD kernels
    differ: on the CPU the two agree to float rounding, frame by frame."""
    import torch

    from gates.metrics import niqe

    rng = np.random.default_rng(9)
    from scipy import ndimage as nd

    frames = np.stack([np.repeat(np.clip(nd.gaussian_filter(rng.normal(128, 60, (200, 230)), s), 0, 255)
                                 .astype(np.uint8)[..., None], 3, axis=-1) for s in (0.8, 2.5)])
    gray = rf.luma(frames)
    numpy_scores = [niqe.niqe_frame(g) for g in gray]
    for i in range(2):
        torch_score = niqe.niqe_frames_torch(torch.from_numpy(frames), [i], 1, torch.device("cpu"))
        assert torch_score == pytest.approx(numpy_scores[i], rel=1e-6)
    assert numpy_scores[1] != pytest.approx(numpy_scores[0], rel=0.05)  # the blurred frame reads otherwise
