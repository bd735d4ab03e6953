"""Audio gate: distances against analytic values of a known gain, loudness of known tones, offset of a delayed copy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _gate_clips import NUM_FRAMES, RATE, SIZE, copy_clip, make_run, moving_square_frames, noise_pcm, pair_context, rewrite_clip

from gates import audio
from gates.base import get_gate
from gates.common import GateInputError
from h3.media import MediaError


def _noise(seconds=1.0, channels=2, seed=0, amplitude=0.1):
    return np.random.default_rng(seed).standard_normal((channels, int(seconds * RATE))) * amplitude


@pytest.mark.parametrize("gain", [0.5, 2.0])
def test_stft_distance_of_a_gain_is_analytic(gain):
    # cand = g * base: every magnitude scales by g, so spectral convergence is |1 - g| and the log-magnitude L1 is
    # |ln g| at every resolution for every bin above the clamp (80 dB under the loudest): white noise's STFT has a few
    # near-zero bins (Rayleigh's tail) under it, which move the value by ~3e-6 relative, hence the tolerance.
    x = _noise()
    assert audio.stft_distance(x, gain * x) == pytest.approx(abs(1 - gain) + abs(math.log(gain)), rel=1e-5)
    assert audio.stft_distance(x, x) == 0.0


@pytest.mark.parametrize("noise_db,expected_small", [(-120, True), (-40, False)])
def test_stft_log_term_ignores_bins_more_than_80_db_under_the_peak(noise_db, expected_small):
    """Two tracks of the same tone with independent noise: noise 120 dB under the tone (a codec's noise in empty bins)
    must not count; noise 40 dB under it must. The value equals a float64 evaluation of the definition."""
    t = np.arange(RATE) / RATE
    tone = 0.5 * np.sin(2 * np.pi * 440.0 * t)
    level = 0.5 * 10 ** (noise_db / 20)
    a = np.stack([tone, tone]) + _noise(seed=1, amplitude=level)
    b = np.stack([tone, tone]) + _noise(seed=2, amplitude=level)
    terms = []
    for ch in range(2):
        for n_fft, hop in audio.STFT_RESOLUTIONS:
            ma, mb = audio._stft_mag(a[ch], n_fft, hop), audio._stft_mag(b[ch], n_fft, hop)
            clamp = max(1e-7, max(ma.max(), mb.max()) * 1e-4)  # 80 dB
            terms.append(np.linalg.norm(ma - mb) / np.linalg.norm(ma)
                         + np.mean(np.abs(np.log(np.maximum(ma, clamp)) - np.log(np.maximum(mb, clamp)))))
    value = audio.stft_distance(a, b)
    assert value == pytest.approx(float(np.mean(terms)), rel=1e-12)
    assert (value < 0.01) == expected_small, value


def test_stft_magnitude_matches_a_plain_loop():
    x = _noise(seconds=0.1, channels=1)[0]
    n_fft, hop = 512, 128
    mag = audio._stft_mag(x, n_fft, hop)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    padded = np.pad(x, (0, n_fft + hop))
    for frame in (0, 3, len(mag) - 1):
        segment = padded[frame * hop : frame * hop + n_fft] * window
        expected = [abs(sum(segment[n] * np.exp(-2j * np.pi * k * n / n_fft) for n in range(n_fft))) for k in (0, 7, 256)]
        np.testing.assert_allclose(mag[frame, [0, 7, 256]], expected, rtol=1e-9, atol=1e-9)
    assert len(mag) == 1 + math.ceil((len(x) - n_fft) / hop)


def test_logmel_distance_of_a_gain_is_its_decibels():
    x = _noise()
    assert audio.logmel_distance(x, 0.5 * x, RATE) == pytest.approx(20 * math.log10(2), rel=1e-9)
    assert audio.logmel_distance(x, x, RATE) == 0.0
    bank = audio.mel_filterbank(RATE)
    assert bank.shape == (audio.MEL_BANDS, audio.MEL_FFT // 2 + 1)
    assert np.all(bank.max(axis=1) > 0.5)  # every band covers at least one bin near its centre


@pytest.mark.parametrize("amplitude_db", [-20.0, -6.0])
def test_loudness_of_known_tones(amplitude_db):
    # ITU-R BS.1770: a full-scale 997 Hz sine in one channel reads -3.01 LKFS, so one at A dBFS peak in both
    # channels reads A LUFS (K-weighting is ~0 dB at 1 kHz).
    t = np.arange(3 * RATE) / RATE
    tone = 10 ** (amplitude_db / 20) * np.sin(2 * np.pi * 997 * t)
    assert audio.integrated_loudness(np.stack([tone, tone]), RATE) == pytest.approx(amplitude_db, abs=0.1)
    assert audio.integrated_loudness(np.stack([tone, 0 * tone]), RATE) == pytest.approx(amplitude_db - 3.01, abs=0.1)
    assert audio.integrated_loudness(np.zeros((2, 3 * RATE)), RATE) is None


def test_offset_of_a_delayed_copy():
    x = _noise(seconds=2.0)
    delay = 160  # 5 ms at 32 kHz
    late = np.concatenate([np.zeros((2, delay)), x[:, :-delay]], axis=1)
    offset, peak = audio.find_offset(x, late, RATE, 500.0)
    assert offset == 5.0 and peak > 0.95
    early, _ = audio.find_offset(late, x, RATE, 500.0)
    assert early == -5.0
    assert audio.find_offset(x, np.zeros_like(x), RATE, 500.0) is None


def _metrics(result):
    return {k: v.value for k, v in result.metrics.items()}


def test_gate_on_a_delayed_quieter_track(tmp_path):
    store = make_run(tmp_path / "run")
    base = noise_pcm(seed=0).astype(np.float64)
    delay = 320  # 10 ms
    late = np.concatenate([np.zeros((delay, 2)), base[:-delay]]) * 0.5  # -6.02 dB, 10 ms late
    rewrite_clip(store, "candidate", "p0", 0, moving_square_frames(NUM_FRAMES, SIZE, 0), np.rint(late).astype(np.int16))
    result = get_gate("audio").evaluate(pair_context(store, gate="audio"))
    m = _metrics(result)
    assert m["offset_ms"] == pytest.approx(10.0, abs=1000 / RATE)
    assert result.info["offset_ms_signed"] > 0
    assert m["lufs_delta"] == pytest.approx(20 * math.log10(2), abs=0.15)
    assert m["logmel_distance"] > 3 and m["stft_distance"] > 0.5
    assert all(not metric.higher_is_better for metric in result.metrics.values())
    assert result.error is None


def test_gate_identical_decoded_tracks_give_exact_zero(tmp_path):
    # Different generations (no short cut by the runner) in byte-identical MP4s: the decoded tracks are equal.
    store = make_run(tmp_path / "run", frames_fn=lambda recipe, pid, seed: moving_square_frames(
        NUM_FRAMES, SIZE, 0 if recipe == "baseline" else 1))
    copy_clip(store, "baseline", "candidate")
    result = get_gate("audio").evaluate(pair_context(store, gate="audio"))
    assert _metrics(result) == {"stft_distance": 0.0, "logmel_distance": 0.0, "lufs_delta": 0.0, "offset_ms": 0.0,
                                "offset_excess_ms": 0.0}
    assert result.flagged is False


def test_gate_without_audio_stream_is_a_clear_error(tmp_path):
    store = make_run(tmp_path / "run")
    rewrite_clip(store, "candidate", "p0", 0, moving_square_frames(NUM_FRAMES, SIZE, 0), None)
    ctx = pair_context(store, gate="audio")
    with pytest.raises(MediaError, match=r"candidate/p0-s0\.mp4: no audio stream"):
        get_gate("audio").evaluate(ctx)


def test_gate_on_a_silent_track_leaves_loudness_undefined(tmp_path):
    store = make_run(tmp_path / "run")
    rewrite_clip(store, "candidate", "p0", 0, moving_square_frames(NUM_FRAMES, SIZE, 0), np.zeros((RATE, 2), np.int16))
    result = get_gate("audio").evaluate(pair_context(store, gate="audio"))
    assert result.metrics["lufs_delta"].value is None and result.flagged
    assert any("silent track (candidate)" in flag for flag in result.flags)


def test_short_track_is_a_clear_error():
    with pytest.raises(GateInputError, match="BS.1770 loudness needs more than one 0.4 s block"):
        audio.integrated_loudness(_noise(seconds=0.2), RATE)
