"""The release policy's artifact-detector rules (issue 50): a resampled candidate with a clip-level defect FAILs.

The per-clip statistics are the real detectors' (gates/metrics/) on clips with planted defects of known size (flicker
of the last 12 frames, a repeated frame, a blur from a frame on, a 1 s dropout), written as the reference_free gate
writes them (``<name>`` and ``<name>.baseline``); the rules are the shipped release policy's (``compare = "flag"``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage

from gates.metrics import audio_dropout, frozen_frames, sharpness_drop, tail_flicker
from h3eval.policy import LoadedPolicy, MetricPolicy, PolicyError, load_policy, parse_policy
from h3eval.verdict import compute_verdict
from verdict_fixtures import make_run, pairs_of, write_result

POLICIES = Path(__file__).resolve().parents[1] / "gates" / "policies"

RELEASE = load_policy(POLICIES / "release.toml")
FLAGS = {name: mp for name, mp in RELEASE.policy.judges["resample"].gates["reference_free"].metrics.items()
         if mp.compare == "flag"}
T, SIDE, RATE = 48, 48, 8000


def clip(seed: int) -> np.ndarray:
    """A textured square drifting over a textured background: uint8 (T, SIDE, SIDE, 3)."""
    rng = np.random.default_rng(seed)
    bg = ndimage.gaussian_filter(rng.uniform(0, 255, (SIDE * 2, SIDE * 2)), 1.5)
    fg = ndimage.gaussian_filter(rng.uniform(0, 255, (16, 16)), 1.0)
    out = np.empty((T, SIDE, SIDE, 3), np.uint8)
    for t in range(T):
        frame = bg[t // 2: t // 2 + SIDE, :SIDE].copy()
        x = 4 + (t * 3 % 28)
        frame[16:32, x:x + 16] = fg
        out[t] = np.clip(frame, 0, 255)[..., None].repeat(3, axis=2)
    return out


def flicker(frames: np.ndarray, levels: float = 8.0) -> np.ndarray:
    """The last 12 frames alternately brighter and darker by ``levels`` (3 % of full scale)."""
    out = frames.astype(np.float64)
    out[-12:] += levels * np.where(np.arange(12) % 2, 1.0, -1.0)[:, None, None, None]
    return np.clip(out, 0, 255).astype(np.uint8)


def freeze(frames: np.ndarray, at: int = 20) -> np.ndarray:
    out = frames.copy()
    out[at] = out[at - 1]
    return out


def blur(frames: np.ndarray, at: int = 24, sigma: float = 1.5) -> np.ndarray:
    out = frames.copy()
    for t in range(at, len(out)):
        out[t] = ndimage.gaussian_filter(out[t].astype(np.float64), (sigma, sigma, 0)).astype(np.uint8)
    return out


def tone(seed: int, gap_s: float = 0.0) -> np.ndarray:
    t = np.arange(2 * RATE) / RATE
    x = 0.3 * np.sin(2 * np.pi * (220 + 20 * seed) * t)
    if gap_s:
        x[int(0.5 * RATE): int((0.5 + gap_s) * RATE)] = 0.0
    return np.stack([x, x])


def statistics(frames: np.ndarray, audio: np.ndarray) -> dict[str, float]:
    return {"tail_flicker": tail_flicker.tail_flicker(frames).statistic,
            "frozen_frames": frozen_frames.frozen_frames(frames).statistic,
            "sharpness_drop": sharpness_drop.sharpness_drop(frames).statistic,
            "dropout_ms": audio_dropout.audio_dropout(audio, RATE).statistic}


def detector_run(tmp_path, planted: dict[int, str], nan_at: int | None = None, resample: bool = True):
    """16 pairs: the baseline clip of seed i and a candidate clip (a fresh render, seed 100 + i) with the defect
    ``planted[i]`` (``flicker``, ``freeze``, ``blur``, ``dropout``); returns (store, candidate statistics)."""
    store = make_run(tmp_path / "run", candidates=("turbo",), n_prompts=16)
    if resample:
        m = store.read_manifest()
        recipes = {**m.recipes, "turbo": {"name": "turbo", "signoff": {"kind": "resample"}}}
        store.write_manifest(m.model_copy(update={"recipes": recipes}))
    written = {}
    for i, (pid, seed) in enumerate(pairs_of(store)):
        base = statistics(clip(i), tone(i))
        frames, audio = clip(100 + i), tone(100 + i)
        defect = planted.get(i)
        if defect == "flicker":
            frames = flicker(frames)
        elif defect == "freeze":
            frames = freeze(frames)
        elif defect == "blur":
            frames = blur(frames)
        elif defect == "dropout":
            audio = tone(100 + i, gap_s=1.0)
        cand = statistics(frames, audio)
        if nan_at == i:
            cand["tail_flicker"] = math.nan
        written[i] = cand
        metrics = {k: (v, False) for k, v in cand.items()}
        metrics.update({f"{k}.baseline": (v, False) for k, v in base.items()})
        write_result(store, "reference_free", "turbo", pid, seed, metrics)
    return store, written


def flags_only(tmp_path) -> LoadedPolicy:
    """The release policy's flag rules as the only gate of a policy (no floor, no other dimension)."""
    text = 'version = 1\nname = "flags"\nmin_pairs = 16\n'
    for name, mp in FLAGS.items():
        rule = mp.flag
        spec = (f"above = {rule.above}" if rule.above is not None else f"at_least = {rule.at_least}"
                if rule.at_least is not None else "above_baseline = true")
        text += (f"\n[gates.reference_free.metrics.{name}]\ncompare = \"flag\"\ndirection = \"lower_is_better\"\n"
                 f"flag = {{ {spec} }}\nmax_flagged_pairs = {mp.max_flagged_pairs}\n"
                 + (f"flag_alpha = {mp.flag_alpha}\n" if mp.flag_alpha is not None else ""))
    path = tmp_path / "flags.toml"
    path.write_text(text)
    return load_policy(path)


def metric(verdict, name):
    gate = next(g for g in verdict.candidates[0].gates if g.gate == "reference_free")
    return next(m for m in gate.metrics if m.metric == name)


def test_release_resample_judge_carries_the_detector_rules():
    assert {n: (mp.flag.describe(), mp.max_flagged_pairs, mp.flag_alpha, mp.required) for n, mp in FLAGS.items()} == {
        "tail_flicker": ("> 1.5", 1, 0.05, True), "sharpness_drop": ("> 1.3", 1, 0.05, True),
        "blocking": ("> 2", 1, 0.05, True),
        # advisory: both fire on clean clips whose subject appears late (release.toml says why)
        "frozen_frames": ("above its baseline twin's", 4, None, False), "dropout_ms": (">= 250", 0, None, False)}
    echo = RELEASE.policy.judges["resample"].gates["reference_free"].metrics["echo_score"]
    assert echo.compare == "sides" and echo.margin.fraction_of_floor == 1.5
    for kind in ("exact", "near"):  # a near / exact candidate has a same-seed parent: the paired gates judge it
        assert "reference_free" not in RELEASE.policy.judges[kind].gates


def test_clean_run_passes_and_planted_defects_fail(tmp_path):
    clean, stats = detector_run(tmp_path / "clean", {})
    assert max(s["tail_flicker"] for s in stats.values()) < 1.5  # the synthetic clips are clean by the detectors
    v = compute_verdict(clean.root, flags_only(tmp_path))
    assert {n: metric(v, n).outcome for n in FLAGS if n != "blocking"} == dict.fromkeys(
        ["tail_flicker", "sharpness_drop", "frozen_frames", "dropout_ms"], "PASS")

    # flag_alpha 0.05: with no baseline-only pair, 5 candidate-only pairs (McNemar p 1/32) FAIL, 4 (1/16) do not
    five = detector_run(tmp_path / "flicker", {i: "flicker" for i in (3, 5, 7, 9, 11)})[0]
    v = compute_verdict(five.root, flags_only(tmp_path))
    m = metric(v, "tail_flicker")
    assert (m.outcome, m.stats["candidate_flagged"], m.stats["baseline_flagged"]) == ("FAIL", 5, 0)
    assert m.stats["mcnemar_p"] == pytest.approx(0.5 ** 5)
    assert "p03-s0" in m.reasons[0] and v.candidates[0].outcome == "FAIL"
    four = detector_run(tmp_path / "flicker4", {i: "flicker" for i in (3, 5, 7, 9)})[0]
    m = metric(compute_verdict(four.root, flags_only(tmp_path)), "tail_flicker")
    assert (m.outcome, m.stats["candidate_flagged"]) == ("PASS", 4) and m.stats["mcnemar_p"] == pytest.approx(1 / 16)
    assert "no more often than the baseline's own clips beyond chance" in m.reasons[0]
    once = detector_run(tmp_path / "flicker1", {3: "flicker"})[0]  # one flickering clip: within max_flagged_pairs 1
    assert metric(compute_verdict(once.root, flags_only(tmp_path)), "tail_flicker").outcome == "PASS"

    blurred = detector_run(tmp_path / "blur", {i: "blur" for i in range(1, 16, 2)})[0]
    m = metric(compute_verdict(blurred.root, flags_only(tmp_path)), "sharpness_drop")
    assert (m.outcome, m.stats["candidate_flagged"]) == ("FAIL", 8)
    once = detector_run(tmp_path / "blur1", {1: "blur"})[0]  # one blurred clip: within max_flagged_pairs 1
    assert metric(compute_verdict(once.root, flags_only(tmp_path)), "sharpness_drop").outcome == "PASS"

    frozen = detector_run(tmp_path / "frozen", {i: "freeze" for i in range(16)})[0]
    m = metric(compute_verdict(frozen.root, flags_only(tmp_path)), "frozen_frames")
    assert (m.outcome, m.stats["candidate_flagged"]) == ("FAIL", 16)
    assert m.stats["mcnemar_p"] == pytest.approx(0.5 ** 16)
    few = detector_run(tmp_path / "frozen4", {i: "freeze" for i in range(4)})[0]
    assert metric(compute_verdict(few.root, flags_only(tmp_path)), "frozen_frames").outcome == "PASS"

    gap = detector_run(tmp_path / "gap", {7: "dropout"})[0]
    m = metric(compute_verdict(gap.root, flags_only(tmp_path)), "dropout_ms")
    assert m.outcome == "FAIL" and m.worst[0].value == pytest.approx(1000.0, abs=20)


def test_a_flagged_baseline_twin_is_not_the_candidates_defect(tmp_path):
    store, _ = detector_run(tmp_path, {})
    pid, seed = pairs_of(store)[0]
    write_result(store, "reference_free", "turbo", pid, seed, {
        "tail_flicker": (9.0, False), "tail_flicker.baseline": (8.0, False)})
    m = metric(compute_verdict(store.root, flags_only(tmp_path)), "tail_flicker")
    assert (m.stats["candidate_flagged"], m.stats["both_flagged"], m.outcome) == (0, 1, "PASS")


def test_nan_never_turns_a_fail_into_a_pass(tmp_path):
    flagged, _ = detector_run(tmp_path / "a", {i: "flicker" for i in (3, 7, 9, 11, 13)}, nan_at=5)
    m = metric(compute_verdict(flagged.root, flags_only(tmp_path)), "tail_flicker")
    assert m.outcome == "FAIL" and any("NaN" in r for r in m.reasons)
    few, _ = detector_run(tmp_path / "a2", {3: "flicker", 11: "flicker"}, nan_at=5)  # over the count, p > flag_alpha
    m = metric(compute_verdict(few.root, flags_only(tmp_path)), "tail_flicker")
    assert m.outcome == "INCONCLUSIVE" and any("NaN" in r for r in m.reasons)
    clean_nan, _ = detector_run(tmp_path / "b", {}, nan_at=5)
    m = metric(compute_verdict(clean_nan.root, flags_only(tmp_path)), "tail_flicker")
    assert m.outcome == "INCONCLUSIVE" and any("NaN" in r for r in m.reasons)
    store, _ = detector_run(tmp_path / "c", {})  # a NaN baseline twin beside a flagged candidate: not a pass
    pid, seed = pairs_of(store)[2]
    write_result(store, "reference_free", "turbo", pid, seed, {
        "tail_flicker": (9.0, False), "tail_flicker.baseline": (math.nan, False)})
    assert metric(compute_verdict(store.root, flags_only(tmp_path)), "tail_flicker").outcome == "INCONCLUSIVE"


def test_release_policy_fails_a_resampled_candidate_on_a_detector(tmp_path):
    """Under the shipped release policy (no floor: its floor-relative dimensions are INCONCLUSIVE), a defect the
    detectors flag makes the resample candidate FAIL, and a clean one does not."""
    flagged, _ = detector_run(tmp_path / "a", {i: "flicker" for i in (0, 3, 6, 9, 12)})
    v = compute_verdict(flagged.root, RELEASE)
    c = v.candidates[0]
    assert (c.judge, c.outcome) == ("resample", "FAIL")
    assert any("tail_flicker: FAIL" in r for g in c.gates for r in g.reasons)
    clean, _ = detector_run(tmp_path / "b", {})
    assert compute_verdict(clean.root, RELEASE).candidates[0].outcome == "INCONCLUSIVE"


@pytest.mark.parametrize("table, why", [
    ('compare = "flag"\ndirection = "lower_is_better"', "go together"),
    ('compare = "flag"\ndirection = "higher_is_better"\nflag = { above = 1.0 }', "lower_is_better"),
    ('compare = "flag"\ndirection = "lower_is_better"\nflag = { above = 1.0, at_least = 2.0 }', "exactly one"),
    ('compare = "flag"\ndirection = "lower_is_better"\nflag = { above = 1.0 }\nmargin = 0.1', "not margin"),
    ('compare = "sides"\ndirection = "lower_is_better"\nmargin = 0.1\nmax_flagged_pairs = 2', "max_flagged_pairs"),
])
def test_flag_rules_are_validated(table, why):
    import tomllib

    text = f'version = 1\nname = "x"\n[gates.reference_free.metrics.tail_flicker]\n{table}\n'
    with pytest.raises(PolicyError, match=why):
        parse_policy(tomllib.loads(text))
    assert MetricPolicy  # the model the errors come from


def test_the_reference_free_gates_detector_values_reach_the_verdict(tmp_path, monkeypatch):
    """End to end on encoded clips: imported folders (2 prompts; both candidate clips flicker in their last 12 frames,
    the baseline's do not), the real reference_free gate, then the flag rules: the gate's per-clip statistics are
    what the verdict counts: two flickering pairs, more than the one tolerated, FAIL tail_flicker by the count alone,
    and PASS under the release rule's flag_alpha (2 of 2 discordant pairs is McNemar p 0.25)."""
    import json

    from h3.media import encode_mp4
    from h3eval.cli import app
    from h3eval.commands.import_ import run_import
    from h3eval.synth import tone_pcm
    from typer.testing import CliRunner

    monkeypatch.setenv("H3EVAL_VBENCH_ENV", str(tmp_path / "no-vbench-env"))
    base, cand = tmp_path / "base", tmp_path / "cand"
    base.mkdir(), cand.mkdir()
    for i, pid in enumerate(("a", "b")):
        encode_mp4(base / f"{pid}-s0.mp4", clip(i), tone_pcm(T / 24), fps=24)
        frames = clip(100 + i)
        encode_mp4(cand / f"{pid}-s0.mp4", flicker(frames), tone_pcm(T / 24), fps=24)
    run = tmp_path / "run"
    run_import(baseline_dir=f"ref={base}", candidate_dirs=[f"turbo={cand}"], out=run, kinds=["turbo=resample"])
    result = CliRunner().invoke(app, ["gate", str(run), "--gates", "reference_free", "--no-progress"])
    assert result.exit_code == 0, result.output
    written = {pid: json.loads((run / "gates" / "reference_free" / "turbo" / f"{pid}-s0.json").read_text())["metrics"]
               for pid in ("a", "b")}
    for pid in ("a", "b"):
        assert written[pid]["tail_flicker"]["value"] > 1.5 > written[pid]["tail_flicker.baseline"]["value"]
    loaded = flags_only(tmp_path)
    policy = loaded.policy.model_copy(update={"min_pairs": 2})
    v = compute_verdict(run, LoadedPolicy(policy=policy, path=loaded.path, sha256=loaded.sha256))
    m = metric(v, "tail_flicker")
    # 2 of 2 flagged: over max_flagged_pairs, but McNemar p 0.25 > flag_alpha: a PASS, stated so; the count alone
    # (no flag_alpha) FAILs
    assert (m.outcome, m.stats["candidate_flagged"], m.n_pairs) == ("PASS", 2, 2)
    assert m.stats["mcnemar_p"] == pytest.approx(0.25) and "beyond chance" in m.reasons[0]
    rules = dict(policy.gates["reference_free"].metrics)
    rules["tail_flicker"] = rules["tail_flicker"].model_copy(update={"flag_alpha": None})
    gates = {**policy.gates, "reference_free": policy.gates["reference_free"].model_copy(update={"metrics": rules})}
    count_only = policy.model_copy(update={"gates": gates})
    m = metric(compute_verdict(run, LoadedPolicy(policy=count_only, path=loaded.path, sha256=loaded.sha256)),
               "tail_flicker")
    assert (m.outcome, m.stats["candidate_flagged"], m.n_pairs) == ("FAIL", 2, 2)
    top = max(("a", "b"), key=lambda pid: written[pid]["tail_flicker"]["value"])
    assert m.worst[0].value == written[top]["tail_flicker"]["value"] and m.worst[0].prompt_id == top
    assert metric(v, "frozen_frames").outcome == "PASS" and metric(v, "dropout_ms").outcome == "PASS"
