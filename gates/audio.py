"""The audio gate: paired comparison of the candidate's soundtrack with the baseline's of the same seed.

The field reports checked audio only for presence and format (seed 002: "we know no good paired metric for
generated audio"); this gate scores the pair on the decoded tracks (float, full scale [-1, 1]), over their common
length:

- ``stft_distance``: multi-resolution STFT distance (Yamamoto et al. 2020, Parallel WaveGAN, eqs. 4-6): for each
  resolution, spectral convergence ``||S_b - S_c||_F / ||S_b||_F`` plus the mean absolute difference of the log
  magnitudes, averaged over resolutions and channels. Resolutions for 32 kHz: FFT 512 / 1024 / 2048, hop a quarter
  of that, Hann window of the FFT's length. The log magnitudes are clamped at ``STFT_TOP_DB`` (80 dB, librosa's
  ``amplitude_to_db`` default) below the pair's loudest bin at that resolution, and never below 1e-7 (the paper's
  code). Until 2026-12-01 the clamp was 1e-7 alone: the log term then compared the AAC codec's noise in bins 100 dB
  under the signal, so a kernel swap (math SDPA for the fused kernel) scored a mean 0.215 on the trained tiny, a
  quarter of two seeds' distance, and the near judge failed every near-exact recipe; with the clamp 0.027, 5.7% of
  it (bench/audio_stft_clamp/results/audio_stft_clamp_math_attn.md, signoff_false_fail_run10.md).
- ``logmel_distance``: mean absolute difference, in dB, of 80-band log-mel power spectrograms (HTK mel scale,
  triangular filters of unit peak, 0-16 kHz, FFT 2048, hop 320 = 10 ms), power floored at 1e-10 (-100 dBFS).
  A pure gain change of g dB gives g.
- ``lufs_delta``: absolute difference of the integrated loudness (ITU-R BS.1770-4 with gating, ``pyloudnorm``),
  in LU. Undefined (None, flagged) when a track is silent.
- ``offset_ms``: absolute lag of the cross-correlation peak of the two mono mixes, within ``max_offset_ms``
  (default 500 ms); the signed value (positive: candidate late) and the normalised peak are in ``info``.

- ``offset_excess_ms``: how far the signed offset lies outside the lip-sync tolerance of ITU-R BT.1359-1
  (detectability: sound at most ``lead_ms`` = 45 ms early or ``lag_ms`` = 125 ms late;
  :mod:`gates.metrics.audio_offset`), 0 inside it; the pair is flagged when it is positive (a 200 ms offset: 75 ms beyond, flagged).

All five are lower-is-better; an identical pair gives exactly zero.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from pydantic import Field

from gates.base import Gate, GateInputError, GateOptions, GateResult, MetricSpec, PairContext, register_gate
from gates.common import metric, new_result
from gates.metrics import audio_offset

logger = logging.getLogger(__name__)

STFT_RESOLUTIONS = ((512, 128), (1024, 256), (2048, 512))
"""(FFT size, hop) pairs of the multi-resolution STFT distance."""
STFT_MAG_FLOOR = 1e-7
STFT_TOP_DB = 80.0
"""Log magnitudes are clamped this far below the pair's loudest bin (per channel and resolution)."""
MEL_BANDS, MEL_FFT, MEL_HOP = 80, 2048, 320
MEL_POWER_FLOOR = 1e-10
DEFAULT_MAX_OFFSET_MS = 500.0


def _stft_mag(x: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """Magnitude STFT (frames, bins) of a 1-D float64 signal, Hann window, zero-padded to full frames."""
    window = np.hanning(n_fft + 1)[:-1]  # periodic Hann
    if len(x) < n_fft:
        x = np.pad(x, (0, n_fft - len(x)))
    count = 1 + (len(x) - n_fft + hop - 1) // hop
    x = np.pad(x, (0, (count - 1) * hop + n_fft - len(x)))
    frames = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop]
    return np.abs(np.fft.rfft(frames * window, axis=1))


def stft_distance(base: np.ndarray, cand: np.ndarray, resolutions=STFT_RESOLUTIONS) -> float:
    """Multi-resolution STFT distance of two (channels, N) tracks of equal shape (module docstring)."""
    total = []
    for channel in range(base.shape[0]):
        b, c = base[channel].astype(np.float64), cand[channel].astype(np.float64)
        for n_fft, hop in resolutions:
            mb, mc = _stft_mag(b, n_fft, hop), _stft_mag(c, n_fft, hop)
            norm = np.linalg.norm(mb)
            diff = np.linalg.norm(mb - mc)
            sc = diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)
            clamp = max(STFT_MAG_FLOOR, max(float(mb.max()), float(mc.max())) * 10.0 ** (-STFT_TOP_DB / 20.0))
            log_l1 = np.mean(np.abs(np.log(np.maximum(mb, clamp)) - np.log(np.maximum(mc, clamp))))
            total.append(sc + log_l1)
    return float(np.mean(total))


def _hz_to_mel(f):
    return 2595.0 * np.log10(1.0 + np.asarray(f, dtype=np.float64) / 700.0)


def _mel_to_hz(m):
    return 700.0 * (10.0 ** (np.asarray(m, dtype=np.float64) / 2595.0) - 1.0)


def mel_filterbank(sample_rate: int, n_fft: int = MEL_FFT, bands: int = MEL_BANDS) -> np.ndarray:
    """(bands, n_fft // 2 + 1) triangular filters of unit peak, centres equally spaced on the HTK mel scale."""
    freqs = np.fft.rfftfreq(n_fft, 1.0 / sample_rate)
    edges = _mel_to_hz(np.linspace(0.0, _hz_to_mel(sample_rate / 2.0), bands + 2))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs[None] - lower) / (centre - lower)
    falling = (upper - freqs[None]) / (upper - centre)
    return np.maximum(0.0, np.minimum(rising, falling))


def logmel_db(x: np.ndarray, sample_rate: int) -> np.ndarray:
    """(frames, bands) mel power spectrogram in dB (power floored at MEL_POWER_FLOOR) of a 1-D signal."""
    power = _stft_mag(x.astype(np.float64), MEL_FFT, MEL_HOP) ** 2
    mel = power @ mel_filterbank(sample_rate).T
    return 10.0 * np.log10(np.maximum(mel, MEL_POWER_FLOOR))


def logmel_distance(base: np.ndarray, cand: np.ndarray, sample_rate: int) -> float:
    """Mean |dB difference| of the log-mel spectrograms of two (channels, N) tracks of equal shape."""
    per_channel = [
        np.mean(np.abs(logmel_db(base[ch], sample_rate) - logmel_db(cand[ch], sample_rate)))
        for ch in range(base.shape[0])
    ]
    return float(np.mean(per_channel))


def integrated_loudness(audio: np.ndarray, sample_rate: int) -> float | None:
    """BS.1770-4 integrated loudness (LUFS) of a (channels, N) track with pyloudnorm; None when silent (gated out)."""
    import pyloudnorm

    meter = pyloudnorm.Meter(sample_rate)
    data = audio.T.astype(np.float64)
    if data.shape[0] <= int(meter.block_size * sample_rate):
        raise GateInputError(
            f"the track is {data.shape[0] / sample_rate:.3f} s long: BS.1770 loudness needs more than one "
            f"{meter.block_size} s block"
        )
    value = float(meter.integrated_loudness(data))
    return value if math.isfinite(value) else None


def find_offset(base: np.ndarray, cand: np.ndarray, sample_rate: int, max_offset_ms: float) -> tuple[float, float] | None:
    """(signed offset in ms, positive when the candidate is late; normalised peak) of the mono mixes, or None."""
    from scipy.signal import correlate, correlation_lags

    a, b = base.astype(np.float64).mean(axis=0), cand.astype(np.float64).mean(axis=0)
    energy = math.sqrt(float(np.dot(a, a)) * float(np.dot(b, b)))
    if energy == 0.0:
        return None
    corr = correlate(b, a, mode="full", method="fft")
    lags = correlation_lags(len(b), len(a), mode="full")
    window = np.abs(lags) <= int(round(max_offset_ms * sample_rate / 1000.0))
    best = int(np.argmax(np.where(window, corr, -np.inf)))
    return lags[best] * 1000.0 / sample_rate, float(corr[best] / energy)


class AudioOptions(GateOptions):
    max_offset_ms: float = DEFAULT_MAX_OFFSET_MS
    """Largest offset between the two tracks the cross-correlation searches (ms)."""
    lead_ms: float = Field(default=audio_offset.LEAD_MS, ge=0)
    """Tolerated offset with the candidate's sound early (ms): ITU-R BT.1359-1's detectability threshold."""
    lag_ms: float = Field(default=audio_offset.LAG_MS, ge=0)
    """Tolerated offset with the candidate's sound late (ms): ITU-R BT.1359-1's detectability threshold."""


@register_gate
class AudioGate(Gate):
    name = "audio"
    needs = ("audio",)
    description = "Paired audio: multi-resolution STFT and log-mel distance, loudness difference, offset."
    Options = AudioOptions
    metrics = {"stft_distance": MetricSpec(higher_is_better=False),
               "logmel_distance": MetricSpec(higher_is_better=False, unit="dB"),
               "lufs_delta": MetricSpec(higher_is_better=False, unit="LU"),
               "offset_ms": MetricSpec(higher_is_better=False, unit="ms"),
               "offset_excess_ms": MetricSpec(higher_is_better=False, unit="ms")}

    def evaluate(self, ctx: PairContext) -> GateResult:
        from gates.media_cache import load_audio

        options = self.parse_options(ctx.options)
        max_offset_ms = options.max_offset_ms
        base, base_rate = load_audio(ctx.baseline.mp4)
        cand, cand_rate = load_audio(ctx.candidate.mp4)
        if base_rate != cand_rate:
            raise GateInputError(
                f"sample rates differ: {ctx.baseline.mp4} {base_rate} Hz, {ctx.candidate.mp4} {cand_rate} Hz"
            )
        if base.shape[0] != cand.shape[0]:
            raise GateInputError(
                f"channel counts differ: {ctx.baseline.mp4} {base.shape[0]}, {ctx.candidate.mp4} {cand.shape[0]}"
            )
        for side, track in (("baseline", base), ("candidate", cand)):
            if not np.isfinite(track).all():
                raise GateInputError(f"{side} audio ({getattr(ctx, side).mp4}) has NaN/Inf samples")
        rate = int(base_rate)
        result = new_result(self.name, ctx)
        common = min(base.shape[1], cand.shape[1])
        fps = float((ctx.baseline.record.get("shape") or {}).get("fps") or 24)
        length_gap_ms = abs(base.shape[1] - cand.shape[1]) * 1000.0 / rate
        result.info.update(
            sample_rate=rate,
            channels=int(base.shape[0]),
            samples=[int(base.shape[1]), int(cand.shape[1])],
            compared_samples=int(common),
            stft_resolutions=[list(r) for r in STFT_RESOLUTIONS],
            mel=dict(bands=MEL_BANDS, n_fft=MEL_FFT, hop=MEL_HOP, scale="htk"),
            max_offset_ms=max_offset_ms,
        )
        if length_gap_ms > 1000.0 / fps:
            result.flags.append(f"track lengths differ by {length_gap_ms:.1f} ms (more than one frame)")
        b, c = base[:, :common], cand[:, :common]

        lufs_b, lufs_c = integrated_loudness(base, rate), integrated_loudness(cand, rate)
        result.info.update(lufs_baseline=lufs_b, lufs_candidate=lufs_c)
        if np.array_equal(b, c):
            result.info["identical_samples"] = True
            stft = logmel = 0.0
            offset: tuple[float, float] | None = (0.0, 1.0) if np.any(b) else None
        else:
            stft = stft_distance(b, c)
            logmel = logmel_distance(b, c, rate)
            offset = find_offset(b, c, rate, max_offset_ms)
        if lufs_b is None or lufs_c is None:
            lufs_delta = None
            silent = [s for s, v in (("baseline", lufs_b), ("candidate", lufs_c)) if v is None]
            result.flags.append(f"loudness undefined: silent track ({', '.join(silent)})")
        else:
            lufs_delta = abs(lufs_c - lufs_b)
        excess = None
        if offset is None:
            result.flags.append("offset undefined: a track is digital silence")
        else:
            result.info.update(offset_ms_signed=offset[0], offset_peak=offset[1])
            sync = audio_offset.offset_flag(offset[0], options.lead_ms, options.lag_ms)
            excess = max(0.0, abs(sync.statistic) - sync.threshold)
            result.info["offset_tolerance_ms"] = {"lead": options.lead_ms, "lag": options.lag_ms,
                                                  "standard": "ITU-R BT.1359-1 detectability"}
            if sync.flagged:
                side = "late" if offset[0] > 0 else "early"
                result.flags.append(f"audio offset {offset[0]:+.1f} ms (sound {side}) outside the lip-sync tolerance "
                                    f"(+{options.lag_ms:g} / -{options.lead_ms:g} ms, ITU-R BT.1359-1)")
        result.metrics = {
            "stft_distance": metric(stft, False),
            "logmel_distance": metric(logmel, False, "dB"),
            "lufs_delta": metric(lufs_delta, False, "LU"),
            "offset_ms": metric(None if offset is None else abs(offset[0]), False, "ms"),
            "offset_excess_ms": metric(excess, False, "ms"),
        }
        result.flagged = bool(result.flags)
        return result

    def identical_result(self, ctx: PairContext) -> GateResult:
        """A bit-identical pair (same raw PCM): every distance is zero, without decoding."""
        result = new_result(self.name, ctx)
        result.identical = True
        result.metrics = {
            "stft_distance": metric(0.0, False),
            "logmel_distance": metric(0.0, False, "dB"),
            "lufs_delta": metric(0.0, False, "LU"),
            "offset_ms": metric(0.0, False, "ms"),
            "offset_excess_ms": metric(0.0, False, "ms"),
        }
        result.info["short_circuit"] = "frames_sha256 and pcm_sha256 equal"
        return result
