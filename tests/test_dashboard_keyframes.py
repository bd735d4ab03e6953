"""The clip viewer of an fl2va run in headless Chromium (issue 25): each keyframe is shown beside the baseline's and
the candidate's frame it anchors, exactly as the run keeps it, with the keyframe gate's scores of both sides."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from h3.conditioning import image_from_array
from h3eval.gaterun import run_gates
from h3eval.synth import make_synthetic_run, tone_pcm
from tests._serving import streamlit_dashboard
from tests.test_dashboard_browser import CHROMIUM, ERROR_SELECTOR, browser, load  # noqa: F401

pytestmark = pytest.mark.slow
N = 24


def keyframe(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    image = np.full((128, 128, 3), 40, np.uint8)
    y, x = rng.integers(16, 80, 2)
    image[y:y + 32, x:x + 32] = rng.integers(80, 255, 3)
    return image


@pytest.fixture(scope="module")
def keyframe_server(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright-python is not installed")
    root = tmp_path_factory.mktemp("keyframes") / "run"
    first, last = keyframe(1), keyframe(2)

    def frames(recipe, pid, seed):
        clip = np.repeat(first[None], N, axis=0)
        clip[N // 2:] = last
        if recipe == "candidate":
            clip[0, :16] = 0  # the candidate's first frame leaves its keyframe: a 16-row black band
        return clip

    store = make_synthetic_run(root, frames_fn=frames, audio_fn=lambda *a: tone_pcm(N / 24),
                               images_fn=lambda pid: {"first_frame": image_from_array(first),
                                                      "last_frame": image_from_array(last)})
    summary = run_gates(store.root, ["keyframe"], options={"lpips_trunk": "rand"}, progress=False)
    assert not summary.errors
    with streamlit_dashboard([root], tmp_path_factory.mktemp("log") / "streamlit.log") as base:
        yield base, store, first, last


def test_viewer_shows_each_keyframe_beside_its_frames_and_the_gate_scores(keyframe_server, browser):  # noqa: F811
    from PIL import Image

    base, store, first, last = keyframe_server
    page = load(browser, f"{base}/?page=viewer&candidate=candidate&prompt=p0&seed=0", "Clip viewer",
                "viewer-keyframes")
    body = page.inner_text("body")
    assert page.locator(ERROR_SELECTOR).count() == 0
    assert "Conditioning (fl2va)" in body
    assert f"last_frame · sha256 {image_from_array(last).sha256[:12]}" in body
    assert f"candidate · frame {N - 1}" in body
    result = json.loads(store.gate_result_path("keyframe", "candidate", "p0", 0).read_text())
    assert result["metrics"]["keyframe_psnr"]["value"] < result["metrics"]["keyframe_psnr.baseline"]["value"]
    for role, pixels in (("first_frame", first), ("last_frame", last)):
        image = page.locator(f'[data-testid="stImage"]:has-text("{role} · sha256")').locator("img").first
        src = image.get_attribute("src")
        data = page.request.get(src if src.startswith("http") else base + src).body()
        # Shown as the run keeps it, pixel for pixel (PNG, no re-compression).
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")), pixels), role
    page.close()
