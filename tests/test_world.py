"""The procedural world (h3.world): deterministic scenes, the caption grammar and its held-out split, the renderer
against slow references, and the detector against the generator's ground truth (and planted defects)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from h3.world.detect import (
    describe_clip, detected_pitches, match_events, onset_times, parse_caption, score_clip, track_colours,
)
from h3.world.render import click_kernel, reference_image, render_audio, render_video
from h3.world.scene import (
    COLOURS, FPS, HELD_OUT_PAIRS, MIN_EVENT_GAP_S, PITCHES, SAMPLE_RATE, Scene, sample_scene, sample_scenes,
    scene_from_ground_truth,
)


@pytest.fixture(scope="module")
def clips():
    """16 scenes (8 training, 8 held-out) rendered once: frames, audio, scenes."""
    scenes = sample_scenes(123, 8, "train") + sample_scenes(123, 8, "heldout")
    return scenes, render_video(scenes).numpy(), render_audio(scenes).numpy()


def test_scenes_are_a_function_of_seed_and_index():
    a = sample_scenes(5, 6)
    assert [s.caption() for s in a] == [s.caption() for s in sample_scenes(5, 6)]
    # Scene 4 drawn alone is scene 4 of the stream: no draw depends on the scenes before it.
    assert sample_scene(5, 4).ground_truth() == a[4].ground_truth()
    assert a[0].caption() != sample_scene(6, 0).caption()
    assert scene_from_ground_truth(a[2].ground_truth()).ground_truth() == a[2].ground_truth()


def test_held_out_pairs_never_reach_a_training_caption():
    for scene in sample_scenes(0, 300, "train"):
        assert not {(s["colour"], s["shape"]) for s in parse_caption(scene.caption())} & HELD_OUT_PAIRS
    for scene in sample_scenes(0, 100, "heldout"):
        assert {(s["colour"], s["shape"]) for s in parse_caption(scene.caption())} <= HELD_OUT_PAIRS


def test_caption_grammar_round_trips():
    for scene in sample_scenes(1, 200) + sample_scenes(1, 50, "heldout"):
        named = parse_caption(scene.caption())
        assert named == [{"colour": s.colour, "shape": s.shape, "direction": s.direction, "pitch": s.pitch,
                          "appears": s.appears, "bounces": s.bounces} for s in scene.shapes]
        first = scene.shapes[0]
        assert parse_caption(scene.caption(refer_first=True), reference=(first.colour, first.shape)) == named
    with pytest.raises(ValueError, match="reference image"):
        parse_caption(sample_scene(1, 0).caption(refer_first=True))
    with pytest.raises(ValueError, match="not a world caption"):
        parse_caption("A person is squat")


def _reference_positions(scene: Scene, spec, times: np.ndarray) -> np.ndarray:
    """A slow reference: walk the shape at 1/2000 s steps, reflecting at the walls."""
    lo, hi = scene.axis_range(spec)
    dx, dy = {"left to right": (1, 0), "right to left": (-1, 0), "top to bottom": (0, 1), "bottom to top": (0, -1)}[
        spec.direction]
    sign = dx + dy
    speed = spec.distance / (scene.duration - spec.appear_t)
    pos = lo + spec.start_offset if sign > 0 else hi - spec.start_offset
    vel, t, dt, out = sign * speed, spec.appear_t, 1 / 2000, []
    for target in times:
        while t + dt <= target:
            pos += vel * dt
            if pos > hi:
                pos, vel = 2 * hi - pos, -vel
            elif pos < lo:
                pos, vel = 2 * lo - pos, -vel
            t += dt
        out.append(pos)
    return np.array(out)


def test_trajectories_and_bounces_match_a_stepped_reference():
    for scene in sample_scenes(2, 12):
        for spec in scene.shapes:
            times = spec.appear_t + np.linspace(0, scene.duration - spec.appear_t, 37)[1:]
            axis = 0 if spec.direction in ("left to right", "right to left") else 1
            got = scene.positions(spec, times)[:, axis]
            np.testing.assert_allclose(got, _reference_positions(scene, spec, times), atol=spec.distance / 1000)
            lo, hi = scene.axis_range(spec)
            for t in scene.bounce_times(spec):  # the centre is at a wall at every bounce
                p = scene.positions(spec, np.array([t]))[0, axis]
                assert min(abs(p - lo), abs(p - hi)) < 1e-6
            assert len(scene.bounce_times(spec)) == spec.bounces
        times = [e["t"] for e in scene.events()]
        assert all(b - a >= MIN_EVENT_GAP_S for a, b in zip(times, times[1:]))


def test_rendered_frame_matches_a_supersampled_reference(clips):
    scenes, frames, _ = clips
    scene = next(s for s in scenes if s.background == "plain" and len(s.shapes) == 1)
    f = 70
    spec = scene.shapes[0]
    cx, cy = scene.positions(spec, np.array([f / FPS]))[0]
    ss = 8  # 8x8 samples per pixel
    grid = (np.arange(scene.width * ss) + 0.5) / ss
    x, y = np.meshgrid(grid, grid[: scene.height * ss])
    r = spec.size
    if spec.shape == "circle":
        inside = (x - cx) ** 2 + (y - cy) ** 2 <= r * r
    elif spec.shape == "square":
        inside = (np.abs(x - cx) <= r) & (np.abs(y - cy) <= r)
    else:  # upward equilateral triangle of half side 1.15 r, bounding box centred on (cx, cy)
        half, h = 1.15 * r, 1.15 * r * math.sqrt(3)
        top, bottom = cy - h / 2, cy + h / 2
        inside = (y >= top) & (y <= bottom) & (np.abs(x - cx) <= half * (y - top) / h)
    cover = inside.reshape(scene.height, ss, scene.width, ss).mean((1, 3))
    expected = np.array(scene.background_rgb) + cover[..., None] * (np.array(COLOURS[spec.colour]) -
                                                                    np.array(scene.background_rgb))
    got = frames[scenes.index(scene), f] / 255.0
    err = np.abs(got - expected)
    assert err.mean() < 0.004, err.mean()  # edges: 1-px SDF anti-aliasing vs box-filtered coverage
    assert (err > 0.5).sum() == 0


def test_rendered_audio_is_tones_plus_clicks_at_the_events(clips):
    """The soundtrack equals a float64 numpy reference: per shape a phase-continuous tone (10 ms attack at its
    appearance), plus a 3 kHz click (4 ms decay) starting at the 800-sample grid point nearest every event."""
    from h3.world.scene import (
        CLICK_AMPLITUDE, CLICK_DECAY_S, CLICK_FREQUENCY, CLICK_GRID, TONE_AMPLITUDE, TONE_ATTACK_S,
    )

    scenes, _, audio = clips
    n = audio.shape[-1]
    t = np.arange(n) / SAMPLE_RATE
    k = np.arange(int(0.02 * SAMPLE_RATE)) / SAMPLE_RATE
    click = CLICK_AMPLITUDE * np.exp(-k / CLICK_DECAY_S) * np.sin(2 * np.pi * CLICK_FREQUENCY * k)
    for scene, track in zip(scenes, audio):
        expected = np.zeros(n)
        for spec in scene.shapes:
            envelope = np.clip((t - spec.appear_t) / TONE_ATTACK_S, 0, 1)
            expected += TONE_AMPLITUDE * envelope * np.sin(2 * np.pi * PITCHES[spec.pitch] * t)
        for event in scene.events():
            start = int(round(event["t"] * SAMPLE_RATE / CLICK_GRID)) * CLICK_GRID
            assert abs(start / SAMPLE_RATE - event["t"]) <= 0.0125 + 1e-9
            stop = min(n, start + len(click))
            expected[start:stop] += click[: stop - start]
        np.testing.assert_allclose(track[0], np.clip(expected, -1, 1), atol=2e-6)
        assert np.array_equal(track[0], track[1])
    np.testing.assert_allclose(click_kernel().numpy(), click, atol=1e-7)


def test_reference_image_shows_the_first_shape_centred():
    scene = sample_scene(3, 1)
    image = reference_image(scene).numpy()
    tracks = track_colours(image[None].repeat(4, 0))
    assert list(tracks) == [scene.shapes[0].colour]
    centre = tracks[scene.shapes[0].colour].centroids[0]
    np.testing.assert_allclose(centre, [scene.width / 2, scene.height / 2], atol=1.0)


def test_detector_reads_the_ground_truth(clips):
    scenes, frames, audio = clips
    for scene, f, a in zip(scenes, frames, audio):
        result = score_clip(describe_clip(f, a, SAMPLE_RATE), parse_caption(scene.caption()))
        assert (result.colour, result.shape, result.direction, result.pitch, result.bounces) == (True,) * 5, \
            (scene.caption(), result.details)
        assert result.sync in (None, True), (scene.caption(), result.details)
        onsets = onset_times(a, SAMPLE_RATE)
        # a click starts at most 12.5 ms from its event (the 25 ms grid), the onset detector adds at most 3 ms
        np.testing.assert_allclose(onsets, [e["t"] for e in scene.events()], atol=0.0125 + 0.003)


def test_detector_through_the_mp4_codec(clips, tmp_path):
    from h3.media import decode_audio, decode_video, encode_mp4, pcm_to_int16

    scenes, frames, audio = clips
    for i in (0, 9):
        path = tmp_path / f"{i}.mp4"
        encode_mp4(path, frames[i], pcm_to_int16(audio[i]))
        f, _ = decode_video(path)
        a, rate = decode_audio(path)
        result = score_clip(describe_clip(f, a, rate), parse_caption(scenes[i].caption()))
        assert (result.colour, result.shape, result.direction, result.pitch, result.bounces) == (True,) * 5
        assert result.sync in (None, True)


def test_detector_negative_controls(clips):
    scenes, frames, audio = clips
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, frames[0].shape, dtype=np.uint8)
    gray = np.full_like(frames[0], 90)
    assert track_colours(gray) == {}
    assert len(track_colours(noise)) <= 6  # noise may hit colours, but never a steady track that moves
    silence = np.zeros_like(audio[0])
    assert detected_pitches(silence, SAMPLE_RATE) == set() and onset_times(silence, SAMPLE_RATE) == []
    # Planted desync: the soundtrack 5 frames late fails the 2-frame sync check.
    scene_i = next(i for i, s in enumerate(scenes) if s.events())
    late = np.roll(audio[scene_i], int(5 / FPS * SAMPLE_RATE), axis=-1)
    result = score_clip(describe_clip(frames[scene_i], late, SAMPLE_RATE), parse_caption(scenes[scene_i].caption()))
    assert result.sync is False and result.pitch is True
    # A wrong caption is scored wrong.
    caption = scenes[0].caption()
    wrong = parse_caption(caption)
    wrong[0]["colour"] = next(c for c in COLOURS if c != wrong[0]["colour"] and all(c != s["colour"] for s in wrong))
    assert score_clip(describe_clip(frames[0], audio[0], SAMPLE_RATE), wrong).colour is False


def test_match_events_is_one_to_one():
    assert match_events([1.0, 1.05], [1.02], 0.1) == (1, 1, 0)
    assert match_events([1.0], [1.0, 1.01], 0.1) == (1, 0, 1)
    assert match_events([], [], 0.1) == (0, 0, 0)


def test_shipped_world_suites_are_what_the_generator_writes():
    import json
    from pathlib import Path

    from h3.world.suites import SUITES, suite_lines

    root = Path(__file__).resolve().parents[1] / "prompts"
    for name in SUITES:
        shipped = [json.loads(line) for line in (root / f"{name}.jsonl").read_text().splitlines()]
        assert shipped == json.loads(json.dumps(suite_lines(name))), name
    for line in suite_lines("world-heldout"):
        assert {(s["colour"], s["shape"]) for s in parse_caption(line["prompt"])} <= HELD_OUT_PAIRS
        assert line["ground_truth"]["caption"] == line["prompt"]
    # The keyframe and reference suites' PNGs are the scenes' frames and reference stills, pixel for pixel.
    from PIL import Image

    from h3.world.suites import suite_images

    for name in ("world-fl2va", "world-ref2va"):
        lines = suite_lines(name)
        assert lines and all({(s["colour"], s["shape"]) for s in line["ground_truth"]["shapes"]} <= HELD_OUT_PAIRS
                             for line in lines)
        for line in lines:
            images = suite_images(line)
            assert len(images) == (2 if name == "world-fl2va" else 1)
            for rel, pixels in images.items():
                assert np.array_equal(np.asarray(Image.open(root / rel).convert("RGB")), pixels), rel
