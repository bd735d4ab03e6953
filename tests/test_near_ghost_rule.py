"""The shipped release policy's near judge FAILs seed 001's faint ghost by the run's pooled stale-copy evidence
(gates.metrics.ghost_run: the mean over the pairs of ``ghost_stale_evidence`` above THRESHOLD), and a NaN never
hides it. The values planted are of known size against the threshold the policy states."""

from pathlib import Path

import numpy as np
import pytest

from gates.metrics.ghost_run import THRESHOLD, run_fails
from h3eval.policy import load_policy
from h3eval.verdict import compute_verdict
from verdict_fixtures import make_run, pairs_of, write_result

RELEASE = Path(__file__).resolve().parents[1] / "gates" / "policies" / "release.toml"


def _near_run(tmp_path, stale: np.ndarray, name: str = "rung"):
    store = make_run(tmp_path / "run", candidates=(name,), n_prompts=16)
    manifest = store.read_manifest()
    manifest.recipes[name] = {"name": name, "signoff": {"kind": "near", "reason": "test"}}
    store.write_manifest(manifest)
    for i, (pid, seed) in enumerate(pairs_of(store)):
        write_result(store, "integrity", name, pid, seed, {"candidate_problems": (0.0, False)})
        write_result(store, "fidelity", name, pid, seed, {"lpips_mean": (0.0, False), "lpips_worst": (0.0, False)},
                     identical=True)
        write_result(store, "audio", name, pid, seed, {"stft_distance": (0.0, False)}, identical=True)
        write_result(store, "ghosting", name, pid, seed,
                     {"ghost_p_value": (0.5, False), "ghost_score_max": (0.0, False),
                      "ghost_stale_evidence": (float(stale[i]), False)})
    return compute_verdict(store.root, load_policy(RELEASE))


def _stale(v, name="rung"):
    c = next(c for c in v.candidates if c.candidate == name)
    g = next(g for g in c.gates if g.gate == "ghosting")
    return c, g, next(m for m in g.metrics if m.metric == "ghost_stale_evidence")


def test_the_policy_states_the_fitted_threshold():
    text = RELEASE.read_text(encoding="utf-8")
    assert "[judges.near.gates.ghosting.metrics.ghost_stale_evidence]" in text
    assert f"max = {THRESHOLD}" in text


def test_a_faint_ghost_in_every_pair_fails_and_clean_pairs_pass(tmp_path):
    rng = np.random.default_rng(5)
    ghosted = rng.uniform(0.03, 0.05, 16)   # C's held-out ghosted pairs: median 0.037-0.047
    assert run_fails(ghosted)
    _, g, m = _stale(_near_run(tmp_path / "g", ghosted))
    assert m.outcome == "FAIL" and g.outcome == "FAIL"
    assert m.mean_value == pytest.approx(float(np.mean(ghosted)), abs=1e-12)
    clean = rng.uniform(0.0, 0.0095, 16)    # benign pairs peak at 0.0095
    assert not run_fails(clean)
    _, g2, m2 = _stale(_near_run(tmp_path / "c", clean))
    assert m2.outcome == "PASS"


def test_a_nan_pair_never_turns_the_ghost_into_a_pass(tmp_path):
    ghosted = np.full(16, 0.04)
    ghosted[3] = np.nan
    c, _, m = _stale(_near_run(tmp_path / "n", ghosted))
    assert m.outcome != "PASS" and c.outcome != "PASS"
