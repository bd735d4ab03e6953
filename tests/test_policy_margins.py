"""Resample margins on the mean (issue 50): a margin stated as a fraction of the baseline's mean score, and
non-inferiority that FAILs only when the whole CI is beyond the margin (``fail_beyond = "ci"``)."""

from __future__ import annotations

import numpy as np
import pytest

from h3eval.policy import PolicyError, load_policy
from h3eval.verdict import compute_verdict
from verdict_fixtures import make_run, pairs_of, write_result, write_text

HEAD = 'version = 1\nname = "margins"\nmin_pairs = 8\nn_resamples = 2000\n'


def _policy(tmp_path, margin: str, fail_beyond: str = "ci"):
    return load_policy(write_text(tmp_path / "m.toml", HEAD + f"""
[gates.vbench.metrics.overall_consistency]
compare = "sides"
direction = "higher_is_better"
margin = {margin}
fail_beyond = "{fail_beyond}"
"""))


def _run(tmp_path, base: np.ndarray, cand: np.ndarray):
    store = make_run(tmp_path / "run", n_prompts=len(base))
    for (pid, s), b, c in zip(pairs_of(store), base, cand):
        write_result(store, "vbench", "fast", pid, s, {"overall_consistency": (float(c), True),
                                                        "overall_consistency.baseline": (float(b), True)})
    return store


def _metric(verdict):
    return verdict.candidates[0].gates[0].metrics[0]


def test_a_margin_on_the_baseline_mean_is_resolved_from_the_run(tmp_path):
    rng = np.random.default_rng(3)
    base = rng.uniform(0.4, 0.6, 16)
    store = _run(tmp_path, base, base + rng.normal(0, 0.002, 16))
    m = _metric(compute_verdict(store.root, _policy(tmp_path, "{ fraction_of_baseline = 0.05 }")))
    assert m.threshold == pytest.approx(0.05 * base.mean(), rel=1e-12)
    assert m.threshold_source.startswith("0.05 x the baseline's mean") and m.outcome == "PASS"
    # at_least takes over where the baseline's mean is near 0.
    tiny = _run(tmp_path / "t", base * 1e-3, base * 1e-3)
    m = _metric(compute_verdict(tiny.root, _policy(tmp_path, "{ fraction_of_baseline = 0.05, at_least = 0.01 }")))
    assert m.threshold == 0.01 and m.threshold_source.startswith("at_least 0.01")


def test_inferiority_fails_only_when_the_whole_ci_is_beyond_the_margin(tmp_path):
    rng = np.random.default_rng(4)
    base = rng.uniform(0.4, 0.6, 16)
    z = rng.normal(size=16)
    z = (z - z.mean()) / z.std(ddof=1)
    # Clearly inferior: mean -0.05, sd 0.005 (CI about +-0.0027) against a margin of 0.02.
    store = _run(tmp_path / "a", base, base - 0.05 + 0.005 * z)
    m = _metric(compute_verdict(store.root, _policy(tmp_path, "0.02")))
    assert m.outcome == "FAIL" and m.ci_high < -0.02 and m.reasons[0].startswith("inferior: the whole 95% CI")
    # Beyond the margin on the mean but noisy (sd 0.04: CI about +-0.02 around -0.025): INCONCLUSIVE under "ci",
    # FAIL under "mean" (the point-estimate rule a benign run's noise can trip).
    store = _run(tmp_path / "b", base, base - 0.025 + 0.04 * z)
    m = _metric(compute_verdict(store.root, _policy(tmp_path, "0.02")))
    assert m.ci_low < -0.02 < m.ci_high and m.mean_value == pytest.approx(-0.025, abs=1e-12)
    assert m.outcome == "INCONCLUSIVE" and "but the CI's upper bound" in m.reasons[0]
    assert _metric(compute_verdict(store.root, _policy(tmp_path, "0.02", "mean"))).outcome == "FAIL"


def test_a_baseline_fraction_is_only_for_a_sides_margin(tmp_path):
    with pytest.raises(PolicyError, match="fraction_of_baseline"):
        load_policy(write_text(tmp_path / "p.toml", HEAD + """
[gates.fidelity.metrics.lpips_mean]
direction = "lower_is_better"
max = { fraction_of_baseline = 0.1 }
"""))
    with pytest.raises(PolicyError, match="fail_beyond"):
        load_policy(write_text(tmp_path / "q.toml", HEAD + """
[gates.fidelity.metrics.lpips_mean]
direction = "lower_is_better"
max = 0.1
fail_beyond = "ci"
"""))


def _record_cis(record: dict, candidate: str) -> dict[str, tuple[float, float, float]]:
    """metric -> (mean delta, CI low, CI high) of the candidate's non-PASS metrics, from a record's verdict lines."""
    import re

    out, inside = {}, False
    for line in record["verdict_lines"]:
        if line.startswith("  ") and not line.startswith("    "):
            inside = line.strip().startswith(f"{candidate}:")
            continue
        m = re.match(r"\s+- (\w+): (?:FAIL|INCONCLUSIVE): .*?95% CI \[([-\d.e]+), ([-\d.e]+)\]", line)
        mean = re.search(r"mean delta ([-\d.e]+)", line)
        if inside and m:
            low, high = float(m.group(2)), float(m.group(3))
            out[m.group(1)] = (float(mean.group(1)) if mean else float("nan"), low, high)
    return out


@pytest.mark.parametrize("candidate", ["fewer-steps", "turbo4-tiny-lora03"])
def test_the_shipped_margins_fail_fewer_steps_and_lora03_on_non_inferiority_itself(candidate):
    """signoff_proof_run23d200_seeds4567 judged both recipes under the earlier margins (1.5 x the per-pair floor):
    non-inferior on every dimension, failed only by the Wilcoxon regression rule. The CI of a mean delta does not
    depend on the margin, so the record's CIs decide them again under the shipped margins: the whole CI beyond the
    margin on dynamic degree, non-inferiority's own FAIL."""
    import json
    from pathlib import Path

    from h3eval.policy import NoiseFloor, resolve_threshold

    root = Path(__file__).resolve().parent.parent
    record = json.loads((root / "bench/results/signoff_proof_run23d200_seeds4567.json").read_text())
    floors = json.loads((root / "bench/results/signoff_false_fail_run23d200_seeds4567.json").read_text())["floor"]
    floor = NoiseFloor(path=Path("floor.json"), sha256="0" * 64, metrics=floors["metrics"])
    metrics = load_policy(root / "gates/policies/release.toml").policy.judges["resample"].gates["reference_free"].metrics
    cis = _record_cis(record, candidate)
    assert "dynamic_degree" in cis
    failed = []
    for name, (mean, low, high) in cis.items():
        if name not in metrics:  # prompt faithfulness: an absolute margin, unchanged
            continue
        mp = metrics[name]
        margin = resolve_threshold(mp.margin, f"reference_free.{name}", floor).value
        old = 1.5 * floor.metrics[f"reference_free.{name}"]
        assert mean > -old  # the earlier margin: non-inferiority alone passed it
        assert mp.fail_beyond == "ci"
        if high < -margin:
            failed.append(name)
    assert "dynamic_degree" in failed, (candidate, cis)
