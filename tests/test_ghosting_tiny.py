"""The ghosting calibration's trained-tiny hook (bench/lib/ghosting.py): its renders are the trained tiny
preset's, deterministic, and its kinds are what they claim: the exact kind equals the baseline, the step cache's ghost
kind does not. The clip is the shortest the pipeline generates (5 s, 124 frames: diffusers' MiniMax-H3 blocks refuse
fewer), on a 64x64 canvas (a quarter of the preset's pixels) to keep it short on the CPU; 29 steps, the kinds' own
(at 4 steps the cache kind's clip did not differ from the baseline's by the margin asserted below)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.lib import ghosting as corpus

STEPS = None  # the recipes' own 29
SIZE = 64
FRAMES = None  # the runtime's default, 124 frames

pytestmark = pytest.mark.skipif(not corpus.tiny_clips(), reason="trained tiny preset (h3/assets/tiny) absent")


@pytest.fixture()
def short_clips(monkeypatch, tmp_path):
    """Keep every render out of the user's cache; load the models afresh."""
    monkeypatch.setenv("H3_GHOST_CACHE", str(tmp_path))
    corpus._TINY_RUNTIMES.clear()
    yield
    corpus._TINY_RUNTIMES.clear()


def render(candidate: str, cache: bool = False) -> np.ndarray:
    return corpus.render_tiny("tiny-0", candidate, num_frames=FRAMES, steps=STEPS, cache=cache, size=SIZE)


def test_tiny_clips_name_prompts_of_the_suite_and_split_by_prompt():
    from bench.lib.ghosting import tiny_split

    names = corpus.tiny_clips()
    assert names and len(names) == corpus.TINY_PROMPTS * len(corpus.TINY_SEEDS)
    specs = [corpus.tiny_spec(n) for n in names]
    assert len(set(specs)) == len(specs)
    fit, publish = tiny_split()
    assert sorted(fit + publish) == sorted(names)
    assert not {corpus.tiny_spec(n)[0] for n in fit} & {corpus.tiny_spec(n)[0] for n in publish}


# 3 renders of 124 frames at 64x64: 12 s on the idle 2-core CPU, 8 min while two other jobs held both cores
def test_hook_renders_the_trained_tiny_deterministically(short_clips, tmp_path):
    a = render("baseline")
    corpus._TINY_RUNTIMES.clear()  # a fresh load: the same bytes again
    b = render("baseline")
    assert a.dtype == np.uint8 and a.shape == (124, SIZE, SIZE, 3)
    assert a.std() > 1.0  # a picture, not a constant frame
    assert a.tobytes() == b.tobytes()
    cached = render("baseline", cache=True)
    assert cached.tobytes() == a.tobytes()
    assert list(tmp_path.glob(f"{corpus.tiny_key()}/baseline-*.npy"))
    assert corpus.render_tiny("tiny-0", "baseline", num_frames=FRAMES, steps=STEPS, size=SIZE).tobytes() == a.tobytes()


# 3 renders: 6 s idle
def test_cache_ghost_kind_differs_where_the_exact_kind_does_not(short_clips):
    base = render("baseline")
    exact = render("tiny_identity")
    ghost = render("tiny_fbc")
    assert exact.tobytes() == base.tobytes()
    assert not np.array_equal(ghost, base)
    assert np.abs(ghost.astype(np.int16) - base).mean() > 0.5  # not a rounding difference


def test_no_tiny_sources_without_the_checkpoint(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(corpus, "tiny_dir", lambda: tmp_path / "absent")
    with caplog.at_level("WARNING", logger="ghosting_corpus.tiny"):
        assert corpus.tiny_clips() == []
    assert "absent" in caplog.text
    assert corpus.source_names()["tiny"] == []
