"""End to end: `h3eval dashboard`'s server on loopback, every page loaded in headless Chromium (Debian's
`chromium`, driven by playwright-python with executable_path; never `playwright install`). Checks the rendered
text of each page and that no error element is on it; screenshots go to test-artifacts/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dashboard.demo import make_review_run
from h3eval.store import RunStore
from tests._serving import streamlit_dashboard

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
ERROR_SELECTOR = '[data-testid="stException"], [data-testid="stAlertContentError"]'
NUM_FRAMES, FPS = 96, 24
PAGES = {"overview": "Overview", "anatomy": "Anatomy", "viewer": "Clip viewer", "gates": "Gates",
         "trajectory": "Trajectory", "verdict": "Verdict"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright-python is not installed")
    root = tmp_path_factory.mktemp("browser") / "review"
    # 96 frames at 24 fps: 4 s clips, so the players can be watched for 3 s without reaching the end.
    make_review_run(root, prompt_ids=("p-cat", "p-car"), seeds=(0, 1), error_pair=("fast", "p-cat", 0),
                    num_frames=NUM_FRAMES)
    broken = tmp_path_factory.mktemp("browser") / "broken"
    make_review_run(broken, candidates=("fast",), prompt_ids=("p-cat",), seeds=(0,), gates=False, verdict=False)
    RunStore(broken).clip_path("fast", "p-cat", 0).write_bytes(b"not an mp4")
    imported = import_without_timing(tmp_path_factory.mktemp("browser"))
    with streamlit_dashboard([root, broken, imported], tmp_path_factory.mktemp("log") / "streamlit.log") as base:
        yield base


def import_without_timing(root: Path) -> Path:
    """Clips from another stack brought in with `h3eval import` and no manifest: the run has no timing at all."""
    from typer.testing import CliRunner

    from dashboard.demo import make_import_folders
    from h3eval.cli import app as cli

    base, cand = make_import_folders(root / "src", prompt_ids=("p-cat",), seeds=(0, 1))
    out = root / "imported"
    result = CliRunner().invoke(cli, ["import", "--baseline-dir", f"sglang-base={base}", "--candidate-dir",
                                      f"sglang-fp8={cand}", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM,
                              args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                                    "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


def load(browser, url: str, title: str, name: str):
    # Tall viewport: Streamlit scrolls inside its own container, so full_page alone would cut the page off.
    page = browser.new_page(viewport={"width": 1400, "height": 2600})
    page.goto(url)
    page.wait_for_selector(f"h1:has-text('{title}')", timeout=30000)
    # The page's footer is its last element (the script has finished), nothing is running, and every element has
    # replaced its loading skeleton.
    page.get_by_text(f"{title} page rendered in").wait_for(timeout=30000)
    page.wait_for_function(
        """() => !document.querySelector('[data-testid="stStatusWidget"]') &&
                 !document.querySelector('[data-testid="stSkeleton"], [data-testid="stElementSkeleton"]')""",
        timeout=30000,
    )
    page.wait_for_timeout(500)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"dashboard-{name}.png"), full_page=True)
    return page


def cells(page, row: int, columns: int) -> list[str]:
    return [page.locator(f'[data-testid="glide-cell-{c}-{row}"]').first.inner_text() for c in range(1, columns + 1)]


def test_every_page_renders_without_error(server, browser):
    expect = {
        "overview": ("Overview", ["Speed versus quality", "lpips_mean: lower is better"]),
        "anatomy": ("Anatomy", ["Mean seconds per stage over warm requests"]),
        "viewer": ("Clip viewer", ["baseline · frame 3", "ghosting heatmap · p-cat-s0_heatmap_f0000.png",
                                   "Audio difference"]),
        "gates": ("Gates", ["worst pairs first"]),
        "trajectory": ("Trajectory", ["One line per pair"]),
        "verdict": ("Verdict", ["Overall", "FAIL"]),
    }
    for key, (title, texts) in expect.items():
        page = load(browser, f"{server}/?page={key}&candidate=faster&prompt=p-cat&seed=0", title, key)
        body = page.inner_text("body")
        for text in texts:
            assert text in body, f"{key}: {text!r} not on the page"
        assert page.locator(ERROR_SELECTOR).count() == 0, f"{key}: error element on the page"
        if key in ("overview", "anatomy", "trajectory"):
            assert page.locator('[data-testid="stVegaLiteChart"]').count() >= 1, f"{key}: no chart drawn"
        if key == "viewer":
            assert page.locator('[data-testid="stImage"] img').count() >= 4
            assert page.locator('iframe').count() == 1  # the synchronized players (tested below)
        if key == "overview":
            # the table's third row: the `faster` candidate, 4x faster, failing its verdict
            row = cells(page, 2, 10)
            assert row[0] == "faster" and row[4].startswith("[3.") and row[9] == "FAIL"
            assert float(row[3]) == pytest.approx(4.0, rel=0.01)
        page.close()


def test_every_page_renders_an_imported_run_without_timing(server, browser):
    """Run 2: `h3eval import` of clips with no latencies. Every page loads with no exception or error element, and
    the speed pages say that the run has no timing data."""
    for key, title in PAGES.items():
        page = load(browser, f"{server}/?page={key}&run=2", title, f"imported-{key}")
        body = page.inner_text("body")
        assert page.locator(ERROR_SELECTOR).count() == 0, f"{key}: error element on the page"
        assert "Traceback" not in body and "StatsInputError" not in body, key
        if key in ("overview", "anatomy"):
            assert "imported: no timing data for this run" in body, key
        if key == "viewer":
            assert "Pair sglang-base vs sglang-fp8" in body and page.locator("iframe").count() == 1
        page.close()


SAMPLE = """async (ms) => {
  const s = window.h3sync, out = [];
  const t0 = performance.now();
  while (performance.now() - t0 < ms) {
    out.push([s.A.currentTime, s.B.currentTime, s.A.paused, s.B.paused, performance.now() - t0]);
    await new Promise((r) => setTimeout(r, 20));
  }
  return out;
}"""


def _players(page):
    frame = page.locator("iframe").first.element_handle().content_frame()
    frame.wait_for_function("() => window.h3sync && h3sync.A.readyState >= 2 && h3sync.B.readyState >= 2",
                            timeout=30000)
    return frame


def _frames_now(frame) -> tuple[int, int]:
    frame.wait_for_function("() => !h3sync.A.seeking && !h3sync.B.seeking", timeout=10000)
    return tuple(frame.evaluate("() => [h3sync.frameOf(h3sync.A.currentTime), h3sync.frameOf(h3sync.B.currentTime)]"))


STALL_S, SETTLE_S = 0.05, 0.25


def _play_and_sample(frame, seconds: float):
    """Press play and read both clocks for SETTLE_S (the start) plus ``seconds``."""
    frame.click("#play")  # one button plays both
    return frame.evaluate(SAMPLE, int((seconds + SETTLE_S) * 1000))


def _assert_in_sync(samples, seconds: float) -> None:
    """Both clocks, read in one script task every 20 ms, within one frame of each other for ``seconds`` after a
    start of SETTLE_S (the follower starts when the leader's clock moves, then is steered). The controller is page
    script: when the page's main thread did not run for STALL_S (two samples more than that apart: the machine was
    starved), the samples of the next SETTLE_S are not held to the bound either; most must still be checked."""
    a = [x[0] for x in samples]
    assert a[-1] - a[0] >= 0.8 * seconds, f"the baseline played {a[-1] - a[0]:.2f} s of {seconds} s"
    assert not any(x[2] or x[3] for x in samples if x[4] > 100), "a player paused while playing"
    checked, last_stall = [], None
    for prev, cur in zip(samples, samples[1:]):
        if cur[4] - prev[4] > STALL_S * 1000:
            last_stall = cur[4]
        if cur[4] > SETTLE_S * 1000 and (last_stall is None or cur[4] - last_stall > SETTLE_S * 1000):
            checked.append(cur)
    span = (checked[-1][4] - checked[0][4]) / 1000 if len(checked) > 1 else 0.0
    assert span >= 0.6 * seconds and len(checked) >= 0.6 * len(samples), (
        f"the page's script was starved too often to check the sync ({len(checked)} of {len(samples)} samples)")
    worst = max(checked, key=lambda x: abs(x[0] - x[1]))
    i = samples.index(worst)
    trace = ", ".join(f"{x[4]:.0f} ms: A {x[0]:.3f} B {x[1]:.3f}" for x in samples[max(0, i - 6):i + 3])
    assert abs(worst[0] - worst[1]) <= 1 / FPS, (
        f"the players drifted {abs(worst[0] - worst[1]) * FPS:.2f} frames apart ({trace})")


def test_clip_viewer_players_play_seek_and_step_in_sync(server, browser):
    page = load(browser, f"{server}/?page=viewer&candidate=faster&prompt=p-cat&seed=0", "Clip viewer",
                "viewer-players")
    frame = _players(page)
    assert frame.evaluate("() => [h3sync.fps, h3sync.frames, h3sync.A.duration > 3.9, h3sync.B.duration > 3.9]") == [
        FPS, NUM_FRAMES, True, True]
    _assert_in_sync(_play_and_sample(frame, 3.0), 3.0)
    frame.click("#play")  # ... and pauses both
    frame.wait_for_function("() => h3sync.A.paused && h3sync.B.paused", timeout=5000)

    # Seek with the one seek bar: both players land on the frame, then play on together.
    frame.evaluate("() => { const s = document.getElementById('seek'); s.value = 12; "
                   "s.dispatchEvent(new Event('input')); }")
    assert _frames_now(frame) == (12, 12)
    frame.click("#fwd")
    assert _frames_now(frame) == (13, 13)
    frame.click("#back")
    frame.click("#back")
    assert _frames_now(frame) == (11, 11)
    _assert_in_sync(_play_and_sample(frame, 1.5), 1.5)
    frame.click("#play")

    # A/B wipe: the candidate over the baseline, cut at the line; A/B flicker: the candidate shown and hidden in turn.
    frame.select_option("#mode", "wipe")
    assert frame.evaluate("() => getComputedStyle(document.getElementById('sideB')).clipPath") == (
        "inset(0px 0px 0px 50%)")
    box_a = frame.locator("#videoA").bounding_box()
    box_b = frame.locator("#videoB").bounding_box()
    assert box_a == box_b  # the two players exactly overlap
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "dashboard-viewer-wipe.png"))
    frame.select_option("#mode", "flicker")
    seen = frame.evaluate("""async () => { const out = new Set();
        for (let i = 0; i < 30; i++) { out.add(document.getElementById('sideB').style.visibility);
                                        await new Promise((r) => setTimeout(r, 50)); }
        return [...out].sort(); }""")
    assert seen == ["hidden", "visible"]
    frame.select_option("#mode", "side")
    assert frame.locator("#videoA").bounding_box()["x"] < frame.locator("#videoB").bounding_box()["x"]
    page.screenshot(path=str(ARTIFACTS / "dashboard-viewer-players.png"))
    page.close()


def test_error_detector_sees_a_broken_clip(server, browser):
    # The negative control for the check above: a corrupt MP4 must show up as an error element.
    page = load(browser, f"{server}/?page=viewer&run=1", "Clip viewer", "viewer-broken-clip")
    assert page.locator(ERROR_SELECTOR).count() == 1
    assert "Could not decode the clips" in page.inner_text("body")
    page.close()


def test_wait_until_healthy_gives_up_when_the_server_process_has_exited():
    """A server process that exited (nothing listens on the port) ends the wait at once with False, not at the
    timeout; the browser tests above cover the True path."""
    import subprocess
    import sys
    import time

    from tests._serving import free_port
    from h3eval.commands.dashboard import wait_until_healthy

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    started = time.monotonic()
    assert wait_until_healthy(f"http://127.0.0.1:{free_port()}", proc, timeout=60) is False
    assert time.monotonic() - started < 10
