"""Reports: verdict.json round-trips, report.md, self-contained report.html with real images, junit.xml parses."""

from __future__ import annotations

import base64
import datetime as dt
import io
import re
import xml.etree.ElementTree as ET

import junitparser  # test dependency: an independent JUnit XML reader
import numpy as np
import pytest
import typer
from PIL import Image
from typer.testing import CliRunner

from h3.media import decode_video
from h3eval.commands import report as report_cmd
from h3eval.commands.report import run_report
from h3eval.report import DIFF_GAIN, STRIP_FRAMES, STRIP_HEIGHT, decoded_strip, render_junit
from h3eval.synth import make_synthetic_run, moving_square_frames
from h3eval.verdict import Verdict

from verdict_fixtures import TEST_POLICY, write_clean_results, write_text

TODAY = dt.date(2026, 11, 29)
OFFSET = 12  # planted brightness change of the "dim" candidate, in 8-bit levels
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _frames(recipe, prompt_id, seed):
    frames = moving_square_frames(num_frames=12, size=64, seed=int(prompt_id[1:]))
    if recipe == "dim":
        frames = np.clip(frames.astype(np.int16) - OFFSET, 0, 255).astype(np.uint8)
    return frames


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """8 pairs with real MP4s; `fast` faithful, `dim` regressed in VBench overall consistency."""
    root = tmp_path_factory.mktemp("report") / "run"
    store = make_synthetic_run(
        root, candidates=("fast", "dim"), prompt_ids=[f"p{i}" for i in range(8)], seeds=(0,), frames_fn=_frames,
        latency_fn=lambda r, p, s: {"baseline": 2.0, "fast": 1.0, "dim": 1.25}[r] * (1 + 0.01 * int(p[1:])),
    )
    write_clean_results(store, "fast", seed=1)
    write_clean_results(store, "dim", seed=2, consistency_shift=-0.05)
    policy = write_text(root.parent / "test.toml", TEST_POLICY)
    verdict, paths = run_report(store.root, policy, today=TODAY)
    return store, verdict, paths


def test_all_files_written_and_verdict_round_trips(reported):
    store, verdict, paths = reported
    assert {p.name for p in paths.values()} == {"verdict.json", "report.md", "report.html", "junit.xml"}
    assert all(p.is_file() and p.parent == store.root for p in paths.values())
    again = Verdict.model_validate_json(paths["verdict"].read_text())
    assert again == verdict
    assert verdict.outcome == "FAIL"
    assert {c.candidate: c.outcome for c in verdict.candidates} == {"fast": "PASS", "dim": "FAIL"}


def test_junit_parses_with_one_case_per_candidate_and_gate(reported):
    _, verdict, paths = reported
    xml = junitparser.JUnitXml.fromfile(str(paths["junit"]))
    suites = {s.name: s for s in xml}
    assert set(suites) == {"h3eval.test.fast", "h3eval.test.dim"}
    for c in verdict.candidates:
        suite = suites[f"h3eval.test.{c.candidate}"]
        cases = {case.name: case for case in suite}
        assert set(cases) == {g.gate for g in c.gates} | {"speed"}
        for g in c.gates:
            results = cases[g.gate].result
            if g.outcome == "PASS":
                assert cases[g.gate].is_passed
            elif g.outcome == "FAIL":
                assert isinstance(results[0], junitparser.Failure) and g.reasons[0][:40] in results[0].message
    dim = suites["h3eval.test.dim"]
    assert dim.failures == 1 and dim.tests == 4 and dim.errors == 0
    assert suites["h3eval.test.fast"].failures == 0


def test_junit_inconclusive_is_an_error_not_a_pass(reported):
    _, verdict, _ = reported
    inconclusive = verdict.model_copy(deep=True)
    g = inconclusive.candidates[0].gates[0]
    g.outcome, g.reasons = "INCONCLUSIVE", ["only 3 usable pair(s); the policy needs at least 8"]
    root = ET.fromstring(render_junit(inconclusive))
    case = root.find(f"testsuite/testcase[@name='{g.gate}']")
    error = case.find("error")
    assert error is not None and error.get("type") == "INCONCLUSIVE" and "only 3 usable" in error.get("message")
    assert int(root.get("errors")) == 1


def test_markdown_names_outcomes_reasons_and_evidence(reported):
    _, verdict, paths = reported
    md = paths["markdown"].read_text()
    assert md.startswith("# h3eval signoff: FAIL")
    assert re.search(r"\| dim \| \*\*FAIL\*\* \|", md) and re.search(r"\| fast \| \*\*PASS\*\* \|", md)
    assert "worse than the margin -0.01" in md and "worse on 8" in md
    assert "(gates/vbench/dim/p" in md  # link to a worst pair's result file


def _images(html_text):
    return re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html_text)


def test_html_is_self_contained_with_real_images(reported):
    store, verdict, paths = reported
    html_text = paths["html"].read_text()
    assert not re.search(r"(src|href)=['\"](https?:)?//", html_text)  # nothing fetched from elsewhere
    images = _images(html_text)
    # speed-vs-quality chart, stage anatomy, and one strip per distinct worst pair (at least one per candidate)
    assert len(images) >= 4
    for data in images:
        raw = base64.b64decode(data)
        assert raw.startswith(PNG_MAGIC)
    assert "worse than the margin" in html_text and "class='FAIL'" in html_text


def test_decoded_strip_matches_independent_decode(reported):
    store, _, _ = reported
    data = decoded_strip(store.root, "baseline", "dim", "p2", 0)
    strip = np.asarray(Image.open(io.BytesIO(base64.b64decode(data))))
    base, _ = decode_video(store.clip_path("baseline", "p2", 0))
    cand, _ = decode_video(store.clip_path("dim", "p2", 0))
    idx = np.linspace(0, len(base) - 1, STRIP_FRAMES).round().astype(int)

    def row(frames):
        return np.concatenate([np.asarray(Image.fromarray(f).resize((STRIP_HEIGHT, STRIP_HEIGHT))) for f in frames], 1)

    diff = [np.clip(np.abs(base[i].astype(np.float32) - cand[i].astype(np.float32)) * DIFF_GAIN, 0, 255)
            .astype(np.uint8) for i in idx]
    expected = np.concatenate([row(base[idx]), row(cand[idx]), row(diff)], axis=0)
    assert strip.shape == (3 * STRIP_HEIGHT, STRIP_FRAMES * STRIP_HEIGHT, 3)
    np.testing.assert_array_equal(strip, expected)
    # The planted -12 levels show up amplified in the difference row (H.264 is lossy: roughly, not exactly).
    assert 0.5 * OFFSET * DIFF_GAIN < strip[2 * STRIP_HEIGHT :].mean() < 1.5 * OFFSET * DIFF_GAIN
    same = decoded_strip(store.root, "baseline", "fast", "p2", 0)
    same_arr = np.asarray(Image.open(io.BytesIO(base64.b64decode(same))))
    # Same frames on both sides: only encoder noise remains (h3.media's MP4s with audio are not bit-reproducible).
    assert same_arr[2 * STRIP_HEIGHT :].mean() < 0.25 * strip[2 * STRIP_HEIGHT :].mean()


def test_report_command_exit_codes(reported, tmp_path):
    store, verdict, _ = reported
    app = typer.Typer()
    report_cmd.register(app)
    runner = CliRunner()
    # Without --policy it renders the verdict.json already in the run.
    res = runner.invoke(app, [str(store.root)])
    assert res.exit_code == 1 and res.output.startswith("FAIL")
    assert runner.invoke(app, [str(store.root), "--exit-zero"]).exit_code == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    res = runner.invoke(app, [str(empty)])
    assert res.exit_code == 3 and "pass --policy" in res.output
