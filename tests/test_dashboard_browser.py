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


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright-python is not installed")
    root = tmp_path_factory.mktemp("browser") / "review"
    make_review_run(root, prompt_ids=("p-cat", "p-car"), seeds=(0, 1), error_pair=("fast", "p-cat", 0))
    broken = tmp_path_factory.mktemp("browser") / "broken"
    make_review_run(broken, candidates=("fast",), prompt_ids=("p-cat",), seeds=(0,), gates=False, verdict=False)
    RunStore(broken).clip_path("fast", "p-cat", 0).write_bytes(b"not an mp4")
    with streamlit_dashboard([root, broken], tmp_path_factory.mktemp("log") / "streamlit.log") as base:
        yield base


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
