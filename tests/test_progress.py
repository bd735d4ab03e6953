"""Progress of the long commands and repeated warnings shown once (h3eval.progress), in-process against a planted
clock, and through real subprocess runs of the CLI on the trained tiny preset (a line per request or pair when stderr
is not a terminal; diffusers' LoRA warning, once per request, shown once with its count)."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from h3eval import progress as progmod
from h3eval.progress import PairSteps, Progress, clock_text, quiet_repeats

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^(?P<label>[\w ./-]+): (?P<done>\d+)/(?P<total>\d+) (?P<unit>\w+), (?P<what>.+?)"
                  r"(?: \((?P<note>[^)]*)\))?; elapsed (?P<elapsed>[\d:?]+), ETA (?P<eta>[\d:?]+)$")


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_clock_text():
    assert [clock_text(s) for s in (0, 59.4, 61, 3599, 3600, 3725, None, float("nan"), -1)] == [
        "0:00", "0:59", "1:01", "59:59", "1:00:00", "1:02:05", "?", "?", "?"]


def test_lines_off_a_terminal_one_per_item_with_an_eta_from_this_processes_items():
    out, clock = io.StringIO(), Clock()
    bar = Progress("ab", 10, done=2, stream=out, tty=False, clock=clock)  # 2 resumed: counted done, not timed
    clock.t += 30
    bar.advance("quality/baseline/p0-s0", "30.0 s")
    clock.t += 10
    bar.advance("quality/cand/p0-s0", "not made")
    clock.t += 20
    bar.advance("quality/baseline/p0-s1")
    assert bar.eta_s() == 15.0 * 5  # (60 - 30) s over the 2 items after the first, 5 left
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "ab: 8 requests to go (2 already done)"
    first, second = (LINE.match(line).groupdict() for line in lines[1:3])
    # The first item took 30 s, 7 left: 210 s; the second 10 s (the first, which paid the load, left out), 6 left.
    assert (first["done"], first["total"], first["what"], first["note"], first["elapsed"], first["eta"]) == (
        "3", "10", "quality/baseline/p0-s0", "30.0 s", "0:30", "3:30")
    assert (second["done"], second["note"], second["elapsed"], second["eta"]) == ("4", "not made", "0:40", "1:00")
    assert lines[3] == "ab: 5/10 requests, quality/baseline/p0-s1; elapsed 1:00, ETA 1:15"
    assert lines[4] == "ab: 5/10 requests in 1:00" and len(lines) == 5
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_on_a_terminal_one_line_rewritten_in_place():
    out, clock = io.StringIO(), Clock()
    bar = Progress("gates", 4, unit="pair", stream=out, tty=True, clock=clock, refresh_s=0)
    bar.now("fewer-steps/p0-s0")
    clock.t += 12
    bar.advance("fewer-steps/p0-s0")
    assert bar.line() == "gates [#####               ] 1/4 pairs elapsed 0:12 ETA 0:36  fewer-steps/p0-s0"
    bar.close()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, ended once
    assert text.count("\r") >= 3 and "ETA 0:36" in text
    assert len(bar.line(width=30)) == 29


def test_disabled_progress_prints_nothing_and_stage_prefixes_labels():
    out = io.StringIO()
    with Progress("ab", 3, stream=out, tty=False, enabled=False) as bar:
        bar.advance("x")
    assert out.getvalue() == ""
    with progmod.stage("demo 1/3"):
        assert Progress("ab", 1, stream=out, tty=False).label == "demo 1/3 ab"
    assert Progress("ab", 1, stream=out, tty=False, enabled=False).label == "ab"


def test_pair_steps_finish_a_pair_with_its_last_gate_result():
    """The gate runner's calls: a pair of 3 gates is one line after its third result; a pair with no gate for it is
    done at once; a pair cut short (an exception) is finished when the next one starts."""
    out = io.StringIO()
    with PairSteps("gates", 4, stream=out, tty=False) as bar:
        task = bar.add_task("", total=7)
        bar.update(task, pair="a/p0-s0", steps=3)
        bar.update(task, description="3 gates a/p0-s0")
        bar.advance(task)
        bar.advance(task)
        assert len(out.getvalue().splitlines()) == 1  # the "to go" line only
        bar.advance(task)
        bar.update(task, pair="b/p0-s0", steps=0)
        bar.update(task, pair="c/p0-s0", steps=4)
        bar.advance(task)
        bar.update(task, pair="d/p0-s0", steps=1)
        bar.advance(task)
    done = [LINE.match(line).group("what", "done", "note") for line in out.getvalue().splitlines()[1:-1]]
    assert re.fullmatch(r"\d+\.\d s", done[0][2])  # a's gates ran (its description): its seconds
    assert done == [("a/p0-s0", "1", done[0][2]), ("b/p0-s0", "2", "resumed"), ("c/p0-s0", "3", "resumed"),
                    ("d/p0-s0", "4", "resumed")]  # the others' results were all kept


def test_a_repeated_library_warning_is_shown_once_then_counted(capsys, monkeypatch):
    """A library logger made after the filter is installed, with its own handler and no propagation (diffusers'
    set-up), warns 13 times: shown once, 12 counted; another text and INFO records are not held back. A Python
    warning of the same text from two places is shown once."""
    shown: list[str] = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *args, **kwargs: shown.append(str(message)))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        restore = quiet_repeats()
        library = logging.getLogger("c2lib.loaders.lora")
        root = logging.getLogger("c2lib")
        handler = logging.StreamHandler(sys.stderr)
        root.addHandler(handler)
        root.propagate = False
        try:
            for _ in range(13):
                library.warning("Both partitions are loaded; going into `transformer`.")
            library.warning("another text")
            library.setLevel(logging.INFO)
            library.info("an info")
            library.info("an info")
            warnings.warn("a deprecated thing", FutureWarning, stacklevel=1)
            warnings.warn_explicit("a deprecated thing", FutureWarning, "elsewhere.py", 7)
            warnings.warn_explicit("another deprecated thing", FutureWarning, "elsewhere.py", 7)
        finally:
            root.removeHandler(handler)
            restore()  # prints the counts
    err = capsys.readouterr().err
    assert err.count("Both partitions are loaded") == 2  # shown once, and once in the count at the end
    assert err.count("another text") == 1 and err.count("an info") == 2
    assert shown == ["a deprecated thing", "another deprecated thing"]
    summary = err[err.index("warnings shown once above that repeated:"):].splitlines()
    assert summary[1:] == ["  12 more times: WARNING c2lib.loaders.lora: Both partitions are loaded; going into "
                           "`transformer`.", "  1 more time: FutureWarning: a deprecated thing"]


def test_the_filter_goes_away_with_the_command(capsys, caplog):
    before = (logging.getLoggerClass(), warnings.showwarning)
    restore = quiet_repeats()
    assert quiet_repeats()() is None  # a second install changes nothing
    log = logging.getLogger("c2lib.after")
    log.warning("twice")
    log.warning("twice")
    restore()
    log.warning("twice")
    assert [r.getMessage() for r in caplog.records] == ["twice", "twice"]  # once, then once after
    assert capsys.readouterr().err.splitlines() == ["warnings shown once above that repeated:",
                                                    "  1 more time: WARNING c2lib.after: twice"]
    assert (logging.getLoggerClass(), warnings.showwarning) == before


FAST_LORA = """name = "fast-lora"
description = "tests: the trained tiny's 4-step LoRA at 2 steps"
steps = 2
dtype = "float32"
[signoff]
kind = "resample"
reason = "tests"
[attention]
backend = "native"
[lora]
enabled = true
path = "@turbo4-tiny"
fuse = true
"""
FAST = """name = "fast"
description = "tests: 2 steps"
steps = 2
dtype = "float32"
[attention]
backend = "native"
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "h3eval.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_ab_and_gate_print_a_line_per_request_and_pair_and_the_lora_warning_once(tmp_path):
    """Real runs of the CLI with stderr a pipe: `h3eval ab` on the trained tiny preset (2 steps; a LoRA candidate,
    whose every request makes diffusers warn which partition the LoRA goes into) prints one line per request, in the
    order they ran, with their count and an ETA; the LoRA warning once and its count at the end; then `h3eval gate` a
    line per pair."""
    (tmp_path / "fast.toml").write_text(FAST)
    (tmp_path / "fast-lora.toml").write_text(FAST_LORA)
    (tmp_path / "p.jsonl").write_text('{"id": "a", "prompt": "a red circle moves left"}\n')
    ab = _cli("ab", "--baseline", "fast.toml", "--candidate", "fast-lora.toml", "--prompts", "p.jsonl",
              "--out", "run", "--seeds", "0,1", "--warmup", "0", "--speed-rounds", "0", "--device", "cpu",
              cwd=tmp_path)
    assert ab.returncode == 0, ab.stderr[-2000:]
    done = [m.groupdict() for m in map(LINE.match, ab.stderr.splitlines()) if m and m.group("label") == "ab"]
    # 2 recipes x 2 seeds, the baseline first in each pair (no warm-up: it is counted like any request).
    assert "ab: 4 requests to go" in ab.stderr.splitlines()
    assert [d["what"] for d in done] == ["quality/fast/a-s0", "quality/fast-lora/a-s0", "quality/fast/a-s1",
                                         "quality/fast-lora/a-s1"]
    assert [(int(d["done"]), int(d["total"])) for d in done] == [(i, 4) for i in range(1, 5)]
    assert all(re.fullmatch(r"\d+\.\d s", d["note"]) for d in done)
    assert done[0]["eta"] != "?" and done[-1]["eta"] == "0:00"
    warning = "Both MiniMax-H3 partitions are loaded"
    assert ab.stderr.count(warning) == 2, ab.stderr[-3000:]  # shown once, and in the count at the end
    assert re.search(r"^  1 more time: WARNING diffusers\.loaders\.lora_pipeline: " + warning, ab.stderr, re.M)
    assert "\r" not in ab.stderr and "\x1b[" not in ab.stderr

    gate = _cli("gate", "run", "--gates", "integrity", cwd=tmp_path)
    assert gate.returncode == 0, gate.stderr[-2000:]
    pairs = [m.group("what") for m in map(LINE.match, gate.stderr.splitlines()) if m and m.group("label") == "gates"]
    assert pairs == ["fast-lora/a-s0", "fast-lora/a-s1"]


@pytest.mark.slow
def test_floor_prints_a_line_per_clip_and_per_pair(tmp_path, fast_recipe_file):
    """`h3eval floor` (in-process, stderr not a terminal): a line per clip it generates, then a line per pair its
    gates score, each with the count and an ETA."""
    from typer.testing import CliRunner

    from h3eval.cli import app

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "a cat"}\n')
    result = CliRunner().invoke(app, ["floor", "--recipe", str(fast_recipe_file), "--prompts", str(prompts),
                                      "--seeds", "0,1", "--gates", "audio", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    found = [m.groupdict() for m in map(LINE.match, lines) if m]
    clips = [d for d in found if d["label"] == "clips"]
    assert sorted(d["what"] for d in clips) == ["fast-repeat/a-s0", "fast-repeat/a-s1", "fast/a-s0", "fast/a-s1"]
    assert [(d["done"], d["total"]) for d in clips] == [("1", "4"), ("2", "4"), ("3", "4"), ("4", "4")]
    pairs = [d["what"] for d in found if d["label"] == "gates"]
    assert sorted(pairs) == ["fast-newseed/a-s0", "fast-newseed/a-s1", "fast-repeat/a-s0", "fast-repeat/a-s1"]
    assert "clips: 4 clips to go" in lines and "gates: 4 pairs to go" in lines
    assert all(d["eta"] != "?" for d in found)
