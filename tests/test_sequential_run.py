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
    (out / "sequential.json").write_text(json.dumps({"schema": "h3eval.sequential", "version": 2, "baseline": "fast",
                                                     "candidates": ["x"], "design": {"design": "pocock"},
                                                     "status": "running"}))
    with pytest.raises(SequentialError, match="differs in: candidates"):
        run_sequential(out=out, **setup)
    # a run begun under the stop rules before session 32 (version 1) is not resumed under today's
    (out / "sequential.json").write_text(json.dumps({"schema": "h3eval.sequential", "version": 1, "baseline": "fast",
                                                     "candidates": ["x"], "design": {"design": "pocock"},
                                                     "status": "running"}))
    with pytest.raises(SequentialError, match="differs in: version"):
        run_sequential(out=out, **setup)
    with pytest.raises(SequentialError, match="needs 2 seeds"):
        run_sequential(out=tmp_path / "other", **{**setup, "seeds": [5]})


LADDER_POLICY = """\
version = 1
name = "laddertest"
description = "sequential ladder test: integrity; resample: sharpness non-inferior within 0.5; near: STFT distance"
confidence = 0.95
min_pairs = 2
n_resamples = 999

[gates.integrity]
max_flagged = 0

[judges.resample]
why = "another sample"

[judges.resample.gates.reference_free.metrics.sharpness]
compare = "sides"
direction = "higher_is_better"
margin = 0.5

[judges.near]
why = "the same sample, nearly"

[judges.near.gates.audio.metrics.stft_distance]
direction = "lower_is_better"
max = 10.0
identical_value = 0.0
"""


def test_a_ladder_gates_each_comparison_with_its_judges_gates_and_warms_each_recipe_once(tmp_path, setup):
    """A two-rung ladder signed off in two looks (2 and 3 pairs of one prompt): ``fast1`` (one step, declared resample) over the baseline and
    ``fast1-vae`` (another VAE tile overlap: a near lever) over ``fast1``. Each comparison gets the gates of its
    judgement under the policy (h3eval.verdict.lineage.pairing_gates, read from the policy file here): the near rung's
    audio gate only against its parent, its reference_free gate only against the baseline (as the ladder's top).
    Each recipe is warmed up once, in look 1, not again in look 2 (h3eval.sequential.round_warmups). Then
    ``h3eval gate --policy`` on the same run, its gates folder removed, gates the same comparisons the same way."""
    import tomllib

    from h3eval.sequential import run_sequential
    from h3eval.store import RunStore

    fewer = {**FAST_RECIPE, "name": "fast1", "description": "one step", "steps": 1,
             "signoff": {"kind": "resample", "reason": "fewer steps"}}
    (tmp_path / "fast1.toml").write_text(toml_dumps(fewer))
    child = {**fewer, "name": "fast1-vae", "description": "one step, another VAE tile overlap", "parent": "fast1",
             "vae": {**FAST_RECIPE["vae"], "tile_overlap": 32}}
    (tmp_path / "fast1-vae.toml").write_text(toml_dumps(child))
    policy = tmp_path / "ladder.toml"
    policy.write_text(LADDER_POLICY)
    out = tmp_path / "ladder"
    prompts = tmp_path / "one.jsonl"
    prompts.write_text('{"id": "a", "prompt": "a cat"}\n')  # one prompt: looks of 2 and 3 pairs (seeds)
    args = {**setup, "candidates": [str(tmp_path / "fast1.toml"), str(tmp_path / "fast1-vae.toml")],
            "prompts": str(prompts), "max_pairs": 3, "looks": (2, 3), "off_identity": False, "policy": str(policy),
            "warmup": 1}
    state = run_sequential(out=out, **args)
    assert [r["look"] for r in state["rounds"]] == [1, 2] and state["status"] == "complete", state["stopped"]
    # the parent is counted at least as long as its rung ran (the rung's reference clips)
    assert state["parents"] == {"fast1-vae": "fast1"}
    used = {k: v["pairs_used"] for k, v in state["savings"]["recipes"].items()}
    assert used["fast1"] >= state["stopped"]["fast1-vae"]["n_pairs"] and used["fast"] == max(
        s["n_pairs"] for s in state["stopped"].values())

    # The reference: each judgement's gates read from the policy file itself (shared table and the judge's).
    data = tomllib.loads(LADDER_POLICY)
    gates_of = {kind: set(data["gates"]) | set(data["judges"][kind]["gates"]) for kind in ("near", "resample")}
    expected = {("fast", "fast1"): gates_of["resample"], ("fast1", "fast1-vae"): gates_of["near"],
                ("fast", "fast1-vae"): gates_of["resample"]}
    gates = out / "gates"
    found: dict[tuple[str, str], set[str]] = {}
    for path in gates.rglob("*.json"):
        rel = path.relative_to(gates).parts  # gate/candidate/[vs-parent/]pair.json
        reference = rel[2].removeprefix("vs-") if len(rel) == 4 else "fast"
        found.setdefault((reference, rel[1]), set()).add(rel[0])
    assert found == expected
    # Every comparison has all its pairs: 1 prompt x 3 seeds (the second look) for each gate.
    for (reference, candidate), names in expected.items():
        for gate in names:
            folder = gates / gate / candidate / (f"vs-{reference}" if reference != "fast" else "")
            assert len(list(folder.glob("*.json"))) == 3, (gate, candidate, reference)

    # Warm-ups: one per recipe, all in look 1's session (the process's first), none in look 2's.
    warm = sorted(p.parent.name for p in (out / "warmup").rglob("*.mp4"))
    assert warm == ["fast", "fast1", "fast1-vae"]
    sessions = RunStore(out).read_manifest().extra["ab"]["sessions"]
    assert len(sessions) == 2
    assert {p.name.split("-w")[0] for p in (out / "warmup").rglob("*.mp4")} == {sessions[0]["id"]}

    # `h3eval gate RUN --policy P` on the same run gates the same comparisons with the same gates (gateplan's pairing).
    import shutil

    from h3eval.commands.gate import gate_command

    shutil.rmtree(gates)
    assert gate_command(out, None, policy=str(policy), progress=False) == 0
    again: dict[tuple[str, str], set[str]] = {}
    for path in gates.rglob("*.json"):
        rel = path.relative_to(gates).parts
        again.setdefault((rel[2].removeprefix("vs-") if len(rel) == 4 else "fast", rel[1]), set()).add(rel[0])
    assert again == expected
