"""Integrity gate: planted defects of known size in real MP4s (black frames, frozen runs, silence, clipping...)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _gate_clips import FPS, NUM_FRAMES, RATE, SIZE, make_run, moving_square_frames, noise_pcm, pair_context, rewrite_clip

from gates.base import get_gate
from gates.integrity import IntegrityThresholds, check_clip
from h3.media import decode_audio, encode_mp4


def _clip(tmp_path, frames=None, pcm="noise", name="clip.mp4"):
    frames = moving_square_frames(NUM_FRAMES, SIZE, 0) if frames is None else frames
    pcm = noise_pcm() if isinstance(pcm, str) else pcm
    path = tmp_path / name
    encode_mp4(path, frames, pcm)
    return path


def test_good_clip_has_no_problems(tmp_path):
    result = check_clip(_clip(tmp_path))
    assert result.ok, result.problems
    assert (result.num_frames, result.height, result.width, result.fps) == (NUM_FRAMES, SIZE, SIZE, FPS)
    assert (result.audio_sample_rate, result.audio_channels) == (RATE, 2)
    assert abs(result.num_audio_samples - RATE * NUM_FRAMES / FPS) <= RATE / FPS
    assert result.black_frames == [] and result.frozen_runs == [] and result.nonfinite_samples == 0


def test_black_frames_are_found_by_index(tmp_path):
    frames = moving_square_frames(NUM_FRAMES, SIZE, 0).copy()
    frames[[5, 6, 17]] = 0
    result = check_clip(_clip(tmp_path, frames))
    assert result.black_frames == [5, 6, 17]
    assert any("3 all-black frame(s)" in p for p in result.problems)


def test_frozen_run_is_found_with_its_length(tmp_path):
    frames = moving_square_frames(NUM_FRAMES, SIZE, 0).copy()
    frames[8:22] = frames[8]  # frames 8..21 show the same picture: 14 frames
    result = check_clip(_clip(tmp_path, frames))
    assert result.frozen_runs == [[8, 14]]
    assert result.frame_diff[0] is None and max(result.frame_diff[9:22]) <= 0.25
    # A shorter still than the threshold is not a frozen run.
    assert check_clip(_clip(tmp_path, frames, name="b.mp4"), thresholds=IntegrityThresholds(frozen_min_frames=15)).frozen_runs == []


def test_silent_track_and_silent_channel(tmp_path):
    silent = check_clip(_clip(tmp_path, pcm=np.zeros((RATE, 2), np.int16)))
    assert any(p.startswith("silent audio track") for p in silent.problems)
    pcm = noise_pcm()
    pcm[:, 1] = 0
    one = check_clip(_clip(tmp_path, pcm=pcm, name="one.mp4"))
    assert [p for p in one.problems if "silent" in p] == ["silent audio channel 1 (RMS -inf dBFS < -60.0 dBFS)"]
    assert one.audio_rms_dbfs[0] == pytest.approx(20 * np.log10(0.1), abs=0.5)


def test_clipping_fraction_matches_the_decoded_samples(tmp_path):
    t = np.arange(RATE) / RATE
    x = np.clip(1.6 * np.sin(2 * np.pi * 220 * t), -1, 1)
    pcm = np.rint(np.stack([x, x], 1) * 32767).astype(np.int16)
    path = _clip(tmp_path, pcm=pcm)
    result = check_clip(path)
    decoded, _ = decode_audio(path)
    assert result.clipped_fraction == pytest.approx(float(np.mean(np.abs(decoded) >= 0.99)), rel=1e-12)
    assert result.clipped_fraction > 0.2  # a sine driven 4 dB over full scale sits at full scale a third of the time
    assert any(p.startswith("clipping") for p in result.problems)
    quiet = check_clip(_clip(tmp_path, name="quiet.mp4"))
    assert quiet.clipped_fraction == 0.0


def test_no_audio_and_short_audio(tmp_path):
    none = check_clip(_clip(tmp_path, pcm=None))
    assert "no audio stream" in none.problems and none.decode_error is None
    short = check_clip(_clip(tmp_path, pcm=noise_pcm(seconds=0.5), name="short.mp4"))
    assert any("more than one frame apart" in p for p in short.problems)


def test_truncated_mp4_is_a_decode_error_naming_the_file(tmp_path):
    path = _clip(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    result = check_clip(path)
    assert result.decode_error is not None and str(path) in result.decode_error


def test_record_mismatch_is_reported(tmp_path):
    path = _clip(tmp_path)
    record = {"shape": {"num_frames": 30, "height": SIZE, "width": 2 * SIZE, "fps": 25, "audio_sample_rate": RATE,
                        "duration_s": 1.25, "num_audio_samples": 40000}}
    problems = check_clip(path, record).problems
    assert "duration 1.000 s in the MP4, 1.250 s in its record" in problems
    decoded = decode_audio(path)[0].shape[1]
    assert f"{decoded} audio samples in the MP4, 40000 in its record ({(40000 - decoded) / 32:.1f} ms apart, more than one frame)" in problems
    assert "num_frames 24 in the MP4, 30 in its record" in problems
    assert "width 64 in the MP4, 128 in its record" in problems
    assert "fps 24 in the MP4, 25 in its record" in problems


def test_gate_judges_both_sides(tmp_path):
    store = make_run(tmp_path / "run")
    frames = moving_square_frames(NUM_FRAMES, SIZE, 0).copy()
    frames[3] = 0
    rewrite_clip(store, "candidate", "p0", 0, frames, noise_pcm())
    result = get_gate("integrity").evaluate(pair_context(store, gate="integrity"))
    m = {k: v.value for k, v in result.metrics.items()}
    assert m["candidate_black_frames"] == 1 and m["baseline_black_frames"] == 0
    assert m["candidate_problems"] == 1 and m["baseline_problems"] == 0
    assert result.flagged and result.flags == ["candidate: 1 all-black frame(s) (mean luma <= 4.0): 3"]
    assert result.error is None and result.status == "ok"
    assert json.loads(result.model_dump_json())["info"]["candidate"]["black_frames"] == [3]


def test_gate_flags_a_stall_but_not_a_still_opening_or_a_still_both_clips_hold(tmp_path):
    """A planted 14-frame stall mid-clip in the candidate alone is flagged with its frames; the same still in both
    clips, a still opening (frames 0-11), and the baseline's own still are reported in info, not flagged (a byte-
    identical candidate of a baseline that opens still must not FAIL integrity)."""
    store = make_run(tmp_path / "run")
    baseline = store.read_manifest().baseline
    moving = moving_square_frames(NUM_FRAMES, SIZE, 0)
    stall = moving.copy()
    stall[8:22] = stall[8]                          # frames 8..21: one picture, 14 frames
    opening = moving.copy()
    opening[0:12] = opening[0]                      # frames 0..11: a still opening, 12 frames

    def evaluate(base_frames, cand_frames):
        rewrite_clip(store, baseline, "p0", 0, base_frames, noise_pcm())
        rewrite_clip(store, "candidate", "p0", 0, cand_frames, noise_pcm())
        return get_gate("integrity").evaluate(pair_context(store, gate="integrity"))

    alone = evaluate(moving, stall)
    assert alone.flagged and alone.flags == ["candidate: frozen run of 14 frames from frame 8 (mean |change| <= 0.25 levels)"]
    assert alone.metrics["candidate_frozen_frames"].value == 14
    both = evaluate(stall, stall)
    assert not both.flagged and both.flags == []
    assert both.info["frozen_not_flagged"] == [
        "baseline: frozen run of 14 frames from frame 8 (the baseline's own)",
        "candidate: frozen run of 14 frames from frame 8 (mean |change| <= 0.25 levels): the baseline holds the same still"]
    still_open = evaluate(moving, opening)
    assert not still_open.flagged and still_open.info["frozen_not_flagged"][0].endswith(": a still opening")
    assert still_open.metrics["candidate_frozen_frames"].value == 12   # measured and reported all the same
    base_only = evaluate(stall, moving)
    assert not base_only.flagged and base_only.metrics["baseline_frozen_frames"].value == 14
    # A stall that starts after the baseline's still opening ends is a stall: the two runs share no frame.
    late = moving.copy()
    late[12:24] = late[12]
    assert evaluate(opening, late).flags == ["candidate: frozen run of 12 frames from frame 12 (mean |change| <= 0.25 levels)"]


def test_a_still_opening_split_by_a_faint_blip_is_an_opening_and_a_stall_after_motion_is_not(tmp_path):
    """Session 28's false FAIL, planted: the clip is still for its first 17 frames but a faint blip at frame 4 (about
    0.4 levels of mean change, as the tiny's VAE adds every 4 frames) splits that still, so the frozen run starts at
    frame 5, past ``frozen_opening_frames``. No frame changed by more than ``opening_max_diff`` before it: a still
    opening, reported, not flagged. The same run after the subject has moved is a stall, flagged; with
    ``opening_max_diff`` below the blip, the opening is a stall too (the rule, not the run's start, decides)."""
    from _gate_clips import blip_split_opening_frames
    from gates.integrity import OPENING, frozen_runs_in, pair_flags

    moving = moving_square_frames(NUM_FRAMES, SIZE, 0)
    still = blip_split_opening_frames()                 # still 0-16, half of frame 4 one level up
    clip = check_clip(_clip(tmp_path, still, name="opening.mp4"))
    diffs = [d for d in clip.frame_diff[1:]]
    assert 0.25 < max(diffs[3:5]) < 1.0 and max(diffs[5:16]) <= 0.25  # the blip splits the still; it is not motion
    assert [5, 12] in clip.frozen_runs and clip.first_motion is not None and clip.first_motion >= 17
    line = next(p for p in clip.problems if p.startswith("frozen run of 12 frames from frame 5 "))
    assert OPENING in line
    info: dict = {}
    assert pair_flags([], [], clip.problems, frozen_runs_in(clip.problems), IntegrityThresholds(), info) == []
    assert info["frozen_not_flagged"][-1].endswith(": a still opening")
    stall = moving.copy()
    stall[10:22] = moving[10]                           # the subject moved before frame 10: a stall
    stalled = check_clip(_clip(tmp_path, stall, name="stall.mp4"))
    assert stalled.first_motion is not None and stalled.first_motion < 10
    assert pair_flags([], [], stalled.problems, frozen_runs_in(stalled.problems), IntegrityThresholds(), {}) == [
        "candidate: frozen run of 12 frames from frame 10 (mean |change| <= 0.25 levels)"]
    strict = IntegrityThresholds(opening_max_diff=0.2)
    clip = check_clip(_clip(tmp_path, still, name="opening2.mp4"), thresholds=strict)
    assert [5, 12] in clip.frozen_runs and clip.first_motion is not None and clip.first_motion < 5
    assert pair_flags([], [], clip.problems, frozen_runs_in(clip.problems), strict, {}) == [
        "candidate: frozen run of 12 frames from frame 5 (mean |change| <= 0.25 levels)"]


def test_frozen_runs_read_back_from_a_clips_problem_lines(tmp_path):
    """Callers that kept only a clip's problem lines (bench/recipe_signoff's per-clip scores) recover its frozen runs
    exactly, and pair_flags on them gives the gate's own flags."""
    from gates.integrity import frozen_runs_in, pair_flags

    frames = moving_square_frames(NUM_FRAMES, SIZE, 0).copy()
    frames[0:12] = frames[0]
    frames[13:24] = frames[13]                       # 11 frames: shorter than a frozen run
    result = check_clip(_clip(tmp_path, frames))
    assert result.frozen_runs == [[0, 12]] and frozen_runs_in(result.problems) == result.frozen_runs
    stall = moving_square_frames(NUM_FRAMES, SIZE, 0).copy()
    stall[6:20] = stall[6]
    stalled = check_clip(_clip(tmp_path, stall, name="stall.mp4"))
    info: dict = {}
    flags = pair_flags(result.problems, frozen_runs_in(result.problems), stalled.problems,
                       frozen_runs_in(stalled.problems), IntegrityThresholds(), info)
    assert flags == []  # the stall (frames 6-19) overlaps the baseline's still opening (0-11): the same still
    assert pair_flags([], [], stalled.problems, frozen_runs_in(stalled.problems), IntegrityThresholds(), {}) == [
        "candidate: frozen run of 14 frames from frame 6 (mean |change| <= 0.25 levels)"]


def test_gate_flags_a_pair_mismatch_and_errors_on_undecodable_side(tmp_path):
    store = make_run(tmp_path / "run")
    rewrite_clip(store, "candidate", "p0", 0, moving_square_frames(NUM_FRAMES + 3, SIZE, 0), noise_pcm())
    result = get_gate("integrity").evaluate(pair_context(store, gate="integrity"))
    assert "pair: num_frames differs (baseline 24, candidate 27)" in result.flags
    assert "candidate: num_frames 27 in the MP4, 24 in its record" in result.flags

    mp4 = store.clip_path("candidate", "p0", 0)
    mp4.write_bytes(mp4.read_bytes()[:200])
    broken = get_gate("integrity").evaluate(pair_context(store, gate="integrity"))
    assert broken.status == "error" and broken.error.startswith("candidate: ") and str(mp4) in broken.error
    assert broken.metrics["candidate_black_frames"].value is None  # not measured, never zero-filled
    assert broken.metrics["baseline_problems"].value == 0


def test_frame_levels_on_a_torch_device_match_the_numpy_path():
    """The GPU path's frame statistics (torch; here on the CPU) against the numpy path: a planted black frame and a
    frozen run read the same, and every level agrees to float32 rounding."""
    import torch

    from gates.integrity import _frame_levels

    rng = np.random.default_rng(5)
    frames = rng.integers(0, 256, size=(20, 36, 50, 3), dtype=np.uint8)
    frames[4] = 0
    frames[10:16] = frames[9]
    means, diffs = _frame_levels(frames)
    t_means, t_diffs = _frame_levels(torch.from_numpy(frames.copy()))
    assert np.allclose(t_means, means, rtol=1e-6) and np.allclose(t_diffs, diffs, rtol=1e-6, atol=1e-9)
    assert means[4] == 0.0 and t_means[4] == 0.0 and (t_diffs[9:15] == 0).all() and (diffs[9:15] == 0).all()
    ref = (0.299 * frames[..., 0] + 0.587 * frames[..., 1] + 0.114 * frames[..., 2])[:, ::2, ::2].mean(axis=(1, 2))
    assert np.allclose(t_means, ref, rtol=1e-6)  # float64 reference
