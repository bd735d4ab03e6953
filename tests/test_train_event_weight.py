"""The DiT's event-weighted flow-matching loss (TrainConfig.dit_event_weight, h3.train.dit.event_weights): the weights
of the latent frames and audio steps around each clip's events (from the world's ground truth, the pool's event
table) against an independent float64 reference, planted events, clips without events, and the loss off
(bit-identical to the plain loss) and on (the reference-weighted loss)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from h3.train.common import TrainConfig
from h3.train.packing import PATCH, audio_rows, patchify
from h3.tiny_trained import TRANSFORMER_CONFIG

NAN = float("nan")


def reference_weights(times: list[float], duration: float, count: int, window: float, lam: float) -> np.ndarray:
    """One clip's weights over ``count`` latent positions, by loops in float64."""
    raw = np.ones(count)
    for k in range(count):
        for t in times:
            if not math.isnan(t) and abs(t / duration * (count - 1) - k) <= window + 1e-6:
                raw[k] = 1 + lam
    return raw / raw.mean()


def reference_rows(table: np.ndarray, duration: float, frames: int, steps: int, lam: float, groups: int, pt: int):
    """(B, E) event times -> the weights of patchify's rows and audio_rows' rows, by loops."""
    from h3.train.dit import EVENT_WINDOW

    b = table.shape[0]
    wv = np.zeros((b, frames // pt * groups))
    wa = np.zeros((b, 2 * steps))
    for i in range(b):
        per_frame = reference_weights(list(table[i]), duration, frames, EVENT_WINDOW, lam)
        for row in range(wv.shape[1]):
            g = row // groups
            wv[i, row] = np.mean(per_frame[g * pt:(g + 1) * pt])
        per_step = reference_weights(list(table[i]), duration, steps, EVENT_WINDOW * (steps - 1) / (frames - 1), lam)
        for row in range(2 * steps):
            wa[i, row] = per_step[row % steps]
    return wv, wa


@pytest.mark.parametrize("pt", [PATCH[0], 2])
def test_weights_equal_a_float64_reference(pt):
    from h3.train.dit import event_weights

    gen = torch.Generator().manual_seed(3)
    table = torch.rand(4, 5, generator=gen) * 5.0
    table[1, 2:] = NAN  # fewer events
    table[2, :] = NAN  # none
    wv, wa = event_weights(table, 5.0, 10, 41, 2.5, 6, pt=pt)
    ref_v, ref_a = reference_rows(table.double().numpy(), 5.0, 10, 41, 2.5, 6, pt)
    assert wv.shape == ref_v.shape and wa.shape == ref_a.shape
    np.testing.assert_allclose(wv.numpy(), ref_v, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(wa.numpy(), ref_a, rtol=1e-6, atol=1e-6)
    assert np.ptp(ref_v) > 0.5 and np.ptp(ref_a) > 0.5  # the weights do vary: the comparison means something


def test_a_planted_event_weighs_its_three_frames_and_its_audio_steps():
    from h3.train.dit import event_weights

    duration, frames, steps, groups = 5.0, 37, 207, 16
    t = 2.5  # latent frame 18 exactly, audio step 103
    wv, wa = event_weights(torch.tensor([[t, NAN]]), duration, frames, steps, 3.0, groups, pt=1)
    per_frame = wv[0].reshape(frames, groups)
    assert (per_frame == per_frame[:, :1]).all()  # every row of a frame carries its frame's weight
    heavy = [f for f in range(frames) if per_frame[f, 0] > 1]
    assert heavy == [17, 18, 19]
    # 3 frames at 4 against 34 at 1: the mean is (12 + 34) / 37
    assert float(per_frame[18, 0]) == pytest.approx(4 * 37 / 46, rel=1e-6)
    assert float(per_frame[0, 0]) == pytest.approx(37 / 46, rel=1e-6)
    per_step = wa[0].reshape(2, steps)
    assert (per_step[0] == per_step[1]).all()
    steps_heavy = [s for s in range(steps) if per_step[0, s] > per_step[0, 0]]
    # the same +-0.139 s: +-5.72 audio steps around 103
    assert steps_heavy == list(range(98, 109))


def test_a_clip_without_events_weighs_one_everywhere():
    from h3.train.dit import event_weights

    wv, wa = event_weights(torch.full((2, 3), NAN), 5.0, 9, 11, 3.0, 4)
    assert torch.isfinite(wv).all() and torch.isfinite(wa).all()
    assert (wv == 1).all() and (wa == 1).all()


def test_the_weights_of_a_clip_average_one():
    from h3.train.dit import event_weights

    table = torch.rand(6, 4, generator=torch.Generator().manual_seed(5)) * 5.0
    for lam in (0.5, 2.0, 10.0):
        wv, wa = event_weights(table, 5.0, 37, 207, lam, 16, pt=1)
        np.testing.assert_allclose(wv.double().mean(dim=1).numpy(), 1.0, atol=1e-6)
        np.testing.assert_allclose(wa.double().mean(dim=1).numpy(), 1.0, atol=1e-6)
        assert wv.std() > 0.05 and wa.std() > 0.05


def test_the_pool_records_the_world_events():
    from h3.train.pool import event_table
    from h3.world.scene import sample_scenes

    scenes = sample_scenes(7, 12)
    table = event_table(scenes, "cpu")
    for row, scene in zip(table, scenes):
        times = [e["t"] for e in scene.events()]
        assert row[:len(times)].tolist() == pytest.approx(times)
        assert torch.isnan(row[len(times):]).all()
    assert table.shape[1] == max(1, max(len(s.events()) for s in scenes))
    assert any(len(s.events()) for s in scenes)


# --- the loss, on a real tiny DiT batch ---------------------------------------------------------------------------

SMALL_DIT = {**TRANSFORMER_CONFIG, "num_layers": 1, "hidden_size": 64, "ffn_dim": 96, "time_embed_dim": 32,
             "time_embed_hidden_dim": 64}


@pytest.fixture(scope="module")
def tiny_setup():
    from diffusers import MiniMaxH3Transformer3DModel

    from h3.train.pool import Pool

    gen = torch.Generator().manual_seed(1)
    n = 3
    f = torch.arange(37, dtype=torch.float)[None, None, :, None, None]
    # moving clips with one turn each; their events (below) make the weights far from 1
    video = torch.randn(n, 24, 1, 8, 8, generator=gen) * torch.where(f < 20, f, 40 - f) / 10
    audio = torch.randn(n, 2, 32, 207, generator=gen) * 0.5
    keyframes = torch.zeros(0, 24, 1, 8, 8)
    pool = Pool(video=video.to(torch.bfloat16), audio=audio.to(torch.bfloat16), keyframe_first=keyframes,
                keyframe_last=keyframes, reference=keyframes, duration=5.0,
                event_times=torch.tensor([[1.0, 3.2], [2.5, NAN], [0.4, 4.9]]),
                texts=[(torch.randn(7, 32, generator=gen) * 0.1).to(torch.bfloat16) for _ in range(n)],
                tags=[(1,) * 7] * n, clips=list(range(n)), tasks=["t2va"] * n)
    torch.manual_seed(0)
    model = MiniMaxH3Transformer3DModel(**SMALL_DIT)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    model.eval()
    return pool, model


def _run(monkeypatch, pool, model, lam):
    """flow_loss at ``dit_event_weight = lam`` on step 0's draw; also the model's outputs and the draw's noise."""
    import h3.train.dit as dit

    cfg = TrainConfig.smoke(dit_batch=2, dit_task_mix=(1.0, 0.0, 0.0), dit_event_weight=lam)
    batches = dit.Batches(pool, cfg)
    seen = {}
    real = dit.packed_forward

    def recording(*args, **kwargs):
        seen["pv"], seen["pa"] = real(*args, **kwargs)
        return seen["pv"], seen["pa"]

    monkeypatch.setattr(dit, "packed_forward", recording)
    with torch.no_grad():
        loss, metrics = dit.flow_loss(model, batches, batches.draw(0), cfg)
    draw = batches.draw(0)  # the same draw again: its generator replays the noise flow_loss drew
    x0_v = patchify(pool.video[draw["clips"]].float())
    x0_a = audio_rows(pool.audio[draw["clips"]].float())
    gen = draw["gen"]
    torch.rand(x0_v.shape[0], generator=gen)  # the noise levels u, drawn first
    noise_v, noise_a = torch.randn(x0_v.shape, generator=gen), torch.randn(x0_a.shape, generator=gen)
    return loss, metrics, seen, draw, x0_v, x0_a, noise_v, noise_a, cfg


def test_weight_zero_is_the_plain_loss_bit_for_bit(monkeypatch, tiny_setup):
    import h3.train.dit as dit

    pool, model = tiny_setup

    def never(*a, **k):
        raise AssertionError("event_weights ran with dit_event_weight = 0")

    monkeypatch.setattr(dit, "event_weights", never)
    loss, metrics, seen, _, x0_v, x0_a, noise_v, noise_a, cfg = _run(monkeypatch, pool, model, 0.0)
    assert TrainConfig().dit_event_weight == 0.0
    # the lines before the knob, on the same outputs
    loss_v = (seen["pv"].float() - (x0_v - noise_v)).pow(2).mean()
    loss_a = (seen["pa"].float() - (x0_a - noise_a)).pow(2).mean()
    assert torch.equal(metrics["video"], loss_v) and torch.equal(metrics["audio"], loss_a)
    assert torch.equal(loss, loss_v + cfg.dit_audio_weight * loss_a)


def test_weighted_loss_equals_the_reference_weighted_loss(monkeypatch, tiny_setup):
    pool, model = tiny_setup
    plain, *_ = _run(monkeypatch, pool, model, 0.0)
    loss, metrics, seen, draw, x0_v, x0_a, noise_v, noise_a, cfg = _run(monkeypatch, pool, model, 2.0)
    clips = draw["clips"]
    groups = (8 // PATCH[1]) * (8 // PATCH[2])
    ref_wv, ref_wa = map(torch.from_numpy, reference_rows(pool.event_times[clips].double().numpy(), 5.0, 37, 207, 2.0,
                                                          groups, PATCH[0]))
    err_v = (seen["pv"].double() - (x0_v - noise_v).double()).pow(2)
    err_a = (seen["pa"].double() - (x0_a - noise_a).double()).pow(2)
    loss_v = (ref_wv[:, :, None] * err_v).mean()
    loss_a = (ref_wa[:, :, None] * err_a).mean()
    assert ref_wv.max() > 2  # the planted events weigh: the weighted loss is not the plain one by accident
    assert float(metrics["video"]) == pytest.approx(float(loss_v), rel=1e-5)
    assert float(metrics["audio"]) == pytest.approx(float(loss_a), rel=1e-5)
    assert float(loss) == pytest.approx(float(loss_v + cfg.dit_audio_weight * loss_a), rel=1e-5)
    assert abs(float(loss) - float(plain)) > 1e-4 * float(plain)


def test_the_knob_is_set_from_the_command_line():
    from h3.train.__main__ import _parse_set

    cfg = _parse_set(["dit_event_weight=2"], TrainConfig.smoke())
    assert cfg.dit_event_weight == 2 and TrainConfig.smoke().dit_event_weight == 0


def test_a_negative_weight_is_refused():
    from h3.train.dit import event_weights

    with pytest.raises(ValueError, match="dit_event_weight must be 0 or more, got -1"):
        event_weights(torch.tensor([[1.0]]), 5.0, 9, 11, -1.0, 4)


def test_a_pool_without_event_times_is_refused(monkeypatch, tiny_setup):
    import dataclasses

    pool, model = tiny_setup
    with pytest.raises(ValueError, match="needs a pool with its clips' event times"):
        _run(monkeypatch, dataclasses.replace(pool, event_times=None), model, 1.0)


def test_the_count_probe_rewrites_only_the_bounce_clause():
    """bench.lib.tiny.with_bounces: every one-shape held-out caption at every count parses back (h3.world.detect's
    caption grammar) to the same shape with that count; nothing else of the caption changes."""
    from bench.lib.tiny import COUNT_WORDS, with_bounces
    from h3.world.detect import parse_caption
    from h3.world.suites import suite_lines

    lines = [ln["prompt"] for ln in suite_lines("world-heldout") if len(parse_caption(ln["prompt"])) == 1]
    assert len(lines) >= 8
    for caption in lines:
        (shape,) = parse_caption(caption)
        for count in COUNT_WORDS:
            (again,) = parse_caption(with_bounces(caption, count))
            assert again == {**shape, "bounces": count}
        assert with_bounces(caption, shape["bounces"]) == caption


def test_the_sync_probe_reads_a_render_in_sync_and_its_sound_moved_four_frames_out():
    """bench.lib.tiny.sync_reading on the world's own render of a held-out one-shape scene with bounces: both readings
    in sync, as many soft events as the scene's ground truth has, every onset within a frame of one; the same picture
    with its sound 4 frames late (a planted defect of known size): out of sync by both, the onsets 4 frames off."""
    from bench.lib.tiny import sync_reading
    from h3.world.detect import FPS, parse_caption
    from h3.world.render import SAMPLE_RATE, render_audio, render_video
    from h3.world.scene import caption, sample_scene
    from h3.world.suites import SUITES

    split, seed, _, _ = SUITES["world-heldout"]
    scene = next(s for s in (sample_scene(seed, i, split) for i in range(200))
                 if len(s.shapes) == 1 and s.shapes[0].bounces >= 1 and not s.shapes[0].appears)
    frames, audio = render_video([scene])[0].numpy(), render_audio([scene])[0].numpy()
    expected = parse_caption(caption(scene))
    ok = sync_reading(frames, audio, SAMPLE_RATE, expected)
    assert ok["sync"] and ok["sync_soft"]
    assert ok["soft_events"] == ok["events_named"] == scene.shapes[0].bounces
    assert max(ok["onset_gap_frames"]) <= 1.0
    shift = round(4 * SAMPLE_RATE / FPS)
    late = np.zeros_like(audio)
    late[..., shift:] = audio[..., :-shift]
    off = sync_reading(frames, late, SAMPLE_RATE, expected)
    assert not off["sync"] and not off["sync_soft"] and off["soft_matched"] == 0
    assert all(3.0 <= g <= 5.0 for g in off["onset_gap_frames"]), off["onset_gap_frames"]


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_free_audio_levels_follow_their_own_draws(monkeypatch, tiny_setup, share):
    """TrainConfig.dit_audio_level_free: the audio timestep flow_loss gives the model is, per request, 1 - the paired
    level (share 0: every run so far, the generator's stream untouched) or, where the share's coin falls, 1 - the
    audio shift of its own base level; replayed from the draw's generator in the documented order."""
    import h3.train.dit as dit
    from h3.train.packing import AUDIO_SHIFT, shifted_sigma

    pool, model = tiny_setup
    cfg = TrainConfig.smoke(dit_batch=8, dit_task_mix=(1.0, 0.0, 0.0), dit_audio_level_free=share)
    batches = dit.Batches(pool, cfg)
    seen = {}
    real = dit.packed_forward

    def recording(transformer, layout, video, audio, text, tv, ta):
        seen["ta"] = ta
        return real(transformer, layout, video, audio, text, tv, ta)

    monkeypatch.setattr(dit, "packed_forward", recording)
    with torch.no_grad():
        dit.flow_loss(model, batches, batches.draw(0), cfg)
    draw = batches.draw(0)
    gen, b = draw["gen"], len(draw["clips"])
    u = torch.rand(b, generator=gen)
    x0_v = patchify(pool.video[draw["clips"]].float())
    torch.randn(x0_v.shape, generator=gen), torch.randn(audio_rows(pool.audio[draw["clips"]].float()).shape, generator=gen)
    paired = shifted_sigma(u, AUDIO_SHIFT)
    if share:
        coins, own = torch.rand(b, generator=gen), shifted_sigma(torch.rand(b, generator=gen), AUDIO_SHIFT)
        expected = torch.where(coins < share, own, paired)
        assert share == 1.0 or 0 < int((coins < share).sum()) < b  # both kinds in the batch at 0.5
    else:
        expected = paired
    assert torch.equal(seen["ta"], 1 - expected)
    assert torch.equal(seen["ta"], 1 - paired) == (share == 0.0)


def test_a_free_audio_share_outside_0_1_is_refused():
    from h3.train.dit import free_audio_levels

    with pytest.raises(ValueError, match=r"dit_audio_level_free must be a share in \[0, 1\], got 1.5"):
        free_audio_levels(torch.zeros(2), 1.5, torch.Generator().manual_seed(0))


def test_colour_misses_counts_a_planted_record():
    """bench.lib.tiny.colour_misses on a planted content-check record of two held-out captions: a clip that draws red
    for a yellow shape counts one miss of that pair and one unnamed red; a clip with every named colour counts none."""
    from bench.lib.tiny import colour_key, colour_misses
    from h3.world.detect import parse_caption
    from h3.world.suites import suite_lines

    lines = suite_lines("world-heldout")
    one = next(ln for ln in lines if len(parse_caption(ln["prompt"])) == 1)
    two = next(ln for ln in lines if len(parse_caption(ln["prompt"])) == 2)
    (a,) = parse_caption(one["prompt"])
    b1, b2 = parse_caption(two["prompt"])
    wrong = next(c for c in ("red", "green", "blue") if c not in (a["colour"], b1["colour"], b2["colour"]))
    clips = [{"prompt_id": one["id"], "details": {"colours_seen": [wrong]}},
             {"prompt_id": one["id"], "details": {"colours_seen": [a["colour"]]}},
             {"prompt_id": two["id"], "details": {"colours_seen": [b1["colour"], b2["colour"]]}}]
    r = colour_misses({"prompts": "world-heldout", "rows": {"baseline": {"clips": clips}}})
    key_a, key_b1, key_b2 = colour_key(a), colour_key(b1), colour_key(b2)
    assert key_b2.endswith("(appears)") and key_a != key_b2
    assert r["named"][key_a] == 2 + (key_a == key_b1)
    assert r["missed"][key_a] == 1 and r["missed"][key_b2] == 0 and sum(r["missed"].values()) == 1
    assert r["extra_colours"] == {wrong: 1}
