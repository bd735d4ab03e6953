"""Issue 53: `h3eval ab --sequential` on the CPU's smallest model and shape: a run killed (SIGKILL) after its first
look resumes at its round and ends with the verdict of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FAST_RECIPE, toml_dumps

ROOT = Path(__file__).resolve().parent.parent

POLICY = """\
version = 1
name = "seqtest"
description = "sequential test: integrity, and sharpness non-inferior within 0.5"
confidence = 0.95
min_pairs = 2
n_resamples = 999

[gates.integrity]
max_flagged = 0

[gates.reference_free.metrics.sharpness]
compare = "sides"
direction = "higher_is_better"
margin = 0.5
"""


@pytest.fixture
def setup(tmp_path):
    base = tmp_path / "fast.toml"
    base.write_text(toml_dumps(FAST_RECIPE))
    fewer = tmp_path / "fast1.toml"
    fewer.write_text(toml_dumps({**FAST_RECIPE, "name": "fast1", "description": "one step", "steps": 1}))
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "a cat"}\n{"id": "b", "prompt": "a red ball"}\n')
    return dict(baseline=str(base), candidates=[str(fewer)], prompts=str(prompts), seeds=[0], max_pairs=4,
                looks=(2, 4), design="pocock", policy=str(policy), off_identity=True, progress=False,
                model="tiny-random", warmup=0, speed_rounds=0, device="cpu")


def _decisions(out: Path) -> tuple[dict, list, list]:
    state = json.loads((out / "sequential.json").read_text())
    verdict = json.loads((out / "verdict.json").read_text())
    return state["stopped"], state["rounds"], verdict["candidates"]


def _start(tmp_path: Path, out: Path, setup: dict) -> subprocess.Popen:
    """`run_sequential` in a child process of one thread; it writes its return value beside its run folder."""
    script = tmp_path / f"run_seq_{out.name}.py"
    script.write_text("import json\nfrom h3eval.sequential import run_sequential\n"
                      f"result = run_sequential(out={str(out)!r}, **{setup!r})\n"
                      f"open({str(out) + '.result.json'!r}, 'w').write(json.dumps(result, default=str))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with open(str(out) + ".stderr.txt", "w") as err:  # a file, not a pipe: a full pipe would stall the child
        return subprocess.Popen([sys.executable, str(script)], env=env, stderr=err, stdout=subprocess.DEVNULL)


def _finish(proc: subprocess.Popen, out: Path) -> dict:
    assert proc.wait(timeout=900) == 0, Path(str(out) + ".stderr.txt").read_text()[-3000:]
    return json.loads(Path(str(out) + ".result.json").read_text())


def test_killed_between_rounds_resumes_to_the_uninterrupted_verdict(tmp_path, setup):

    killed = tmp_path / "killed"
    proc = _start(tmp_path, killed, setup)
    deadline = time.time() + 600
    while not (killed / "sequential.json").is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)  # after look 1's record, inside round 2
    assert proc.wait() == -signal.SIGKILL, "the run ended before the kill"
    first = json.loads((killed / "sequential.json").read_text())
    assert [r["look"] for r in first["rounds"]] == [1] and first["status"] == "running"
    assert not (killed / "verdict.json").exists()
    # The off-identity candidate is decided at the first look (identical clips), the one-step candidate is not.
    assert first["stopped"] == {"fast-identity": {"look": 1, "n_pairs": 2, "outcome": "PASS",
                                                  "why": "decided: PASS at look 1 of 2 at the look's nominal levels"}}

    # Every session runs in a process of one thread: the clips' floats depend on the thread count, so the resumed run
    # and the uninterrupted one are computed alike.
    resumed, whole = (_finish(_start(tmp_path, out, setup), out) for out in (killed, tmp_path / "whole"))
    assert resumed["status"] == whole["status"] == "complete"
    a, b = _decisions(killed), _decisions(tmp_path / "whole")
    assert a == b
    stopped, rounds, candidates = a
    assert stopped["fast1"]["look"] == 2 and [r["active"] for r in rounds] == [["fast1", "fast-identity"], ["fast1"]]
    # The identity candidate stopped at 2 pairs: 2 requests of the fixed design's 12 saved; its verdict (at look 1)
    # still states its effect and CI.
    assert whole["savings"]["requests"] == 10 and whole["savings"]["fixed_requests"] == 12
    ident = next(c for c in candidates if c["candidate"] == "fast-identity")
    sharp = ident["gates"][1]["metrics"][0]
    assert sharp["n_pairs"] == 2 and sharp["mean_value"] == 0.0 and sharp["ci_low"] == 0.0
    assert "stopped at look 1 of 2" in ident["warnings"][0]
    # The second session of the killed run generated only round 2's clips: one seed more of fast1 and the baseline.
    assert len(list((killed / "clips" / "fast-identity").glob("*.mp4"))) == 2
    assert len(list((killed / "clips" / "fast1").glob("*.mp4"))) == 4


def test_a_rerun_with_other_parameters_is_refused(tmp_path, setup):
    from h3eval.sequential import SequentialError, run_sequential

    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"created_at": "2026-12-06", "updated_at": "2026-12-06",
                                              "model": "tiny-random", "kind": "ab"}))
    (out / "sequential.json").write_text(json.dumps({"schema": "h3eval.sequential", "baseline": "fast",
                                                     "candidates": ["x"], "design": {"design": "pocock"},
                                                     "status": "running"}))
    with pytest.raises(SequentialError, match="differs in: candidates"):
        run_sequential(out=out, **setup)
    with pytest.raises(SequentialError, match="needs 2 seeds"):
        run_sequential(out=tmp_path / "other", **{**setup, "seeds": [5]})
