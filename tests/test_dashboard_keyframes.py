"""The clip viewer of an fl2va run in headless Chromium (issue 25): each keyframe is shown beside the baseline's and
the candidate's frame it anchors, exactly as the run keeps it, with the keyframe gate's scores of both sides."""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from h3.conditioning import image_from_array
from h3eval.commands.dashboard import streamlit_argv
from h3eval.gaterun import run_gates
from h3eval.synth import make_synthetic_run, tone_pcm
from tests.test_dashboard_browser import CHROMIUM, ERROR_SELECTOR, _free_port, browser, load  # noqa: F401

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
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "H3EVAL_DASHBOARD_RUNS"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    log = open(tmp_path_factory.mktemp("log") / "streamlit.log", "w+")
    proc = subprocess.Popen(streamlit_argv([root], port=port), stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            proc.kill()
            pytest.fail(f"dashboard server did not come up on {base}:\n{log.read()}")
        time.sleep(0.3)
    yield base, store, first, last
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


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
