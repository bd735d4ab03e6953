"""gates.metrics audio_offset, audio_dropout and audio_clicks against planted defects of known size, and the audio
gate's lip-sync flag (ITU-R BT.1359-1: sound at most 45 ms early, 125 ms late)."""

from __future__ import annotations

import numpy as np
import pytest
from _gate_clips import SIZE, make_run, moving_square_frames, noise_pcm, pair_context, rewrite_clip

from gates.base import get_gate
from gates.metrics import audio_clicks, audio_dropout, audio_offset

SR = 32000


def _tone(seconds=3.0, seed=0):
    t = np.arange(int(seconds * SR)) / SR
    rng = np.random.default_rng(seed)
    x = 0.2 * np.sin(2 * np.pi * 440 * t) + 0.05 * np.sin(2 * np.pi * 1000 * t) + 0.0002 * rng.normal(size=t.size)
    return np.stack([x, x])


@pytest.mark.parametrize("ms, flagged, bound", [(200.0, True, 125.0), (125.0, False, 125.0), (100.0, False, 125.0),
                                                (-60.0, True, 45.0), (-40.0, False, 45.0), (0.0, False, 125.0)])
def test_offset_flag_uses_the_bt1359_window(ms, flagged, bound):
    d = audio_offset.offset_flag(ms)
    assert d.flagged is flagged and d.threshold == bound and d.statistic == ms


def test_offset_flag_refuses_nan():
    with pytest.raises(ValueError, match="not finite"):
        audio_offset.offset_flag(float("nan"))


def test_single_clip_offset_is_the_median_matched_delay():
    events = [1.0, 2.0, 3.0, 4.0]
    assert audio_offset.single_clip_offset(events, [e + 0.2 for e in events]) == pytest.approx(200.0)
    assert audio_offset.single_clip_offset(events, [1.05]) is None  # one match is not an estimate


def test_the_audio_gate_flags_a_200ms_offset(tmp_path):
    seconds = 1.5
    store = make_run(tmp_path / "run", frames_fn=lambda r, p, s: moving_square_frames(36, SIZE, 0),
                     audio_fn=lambda r, p, s: noise_pcm(seconds=seconds))
    base = noise_pcm(seconds=seconds).astype(np.float64)
    delay = int(0.2 * 32000)
    late = np.concatenate([np.zeros((delay, 2)), base[:-delay]])
    rewrite_clip(store, "candidate", "p0", 0, moving_square_frames(36, SIZE, 0), np.rint(late).astype(np.int16))
    result = get_gate("audio").evaluate(pair_context(store, gate="audio"))
    assert result.metrics["offset_ms"].value == pytest.approx(200.0, abs=1000 / 32000)
    assert result.metrics["offset_excess_ms"].value == pytest.approx(75.0, abs=1000 / 32000)
    assert result.flagged and any("ITU-R BT.1359" in f and "late" in f for f in result.flags)


def test_a_one_second_dropout_is_measured_and_leading_silence_is_not_one():
    clean = _tone()
    assert not audio_dropout.audio_dropout(clean, SR).flagged
    gap = clean.copy()
    gap[:, SR:2 * SR] = 0.0
    found = audio_dropout.audio_dropout(gap, SR)
    assert found.flagged and found.statistic == pytest.approx(1000.0, abs=audio_dropout.WINDOW_MS)
    assert found.info["start_s"] == pytest.approx(1.0, abs=0.011)
    late_start = clean.copy()
    late_start[:, : SR // 2] = 0.0  # the sound starts at 0.5 s: no sound before the gap, not a dropout
    assert audio_dropout.audio_dropout(late_start, SR).statistic == 0.0


def test_planted_clicks_are_flagged_where_they_are():
    clean = _tone()
    assert not audio_clicks.audio_clicks(clean, SR).flagged
    clicked = clean.copy()
    at = int(1.7 * SR)
    clicked[:, at] += 0.5  # the calibrated threshold sits above the tiny's own clicks (bounce sounds)
    found = audio_clicks.audio_clicks(clicked, SR)
    assert found.flagged and found.info["at_s"] == pytest.approx(1.7, abs=0.001)
    # the residual is the third difference (numpy's reference)
    x = clicked.mean(axis=0)
    assert np.allclose(audio_clicks.residual(x), x[3:] - 3 * x[2:-1] + 3 * x[1:-2] - x[:-3], rtol=0, atol=1e-15)
