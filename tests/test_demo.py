"""`h3eval demo`'s set-up, without running it (bench/demo_cpu/demo_time.py times the whole demo): the trained tiny preset on
captions of its world, enough pairs for the release policy, the content check among its gates, and the content
summary it prints counted from the gate's per-pair results."""

from __future__ import annotations

from gates.base import GateResult, PairRef
from h3.atomic import atomic_write_json
from h3.runtime import canonical_model
from h3.world.detect import parse_caption
from h3eval.demo import CPU_GATES, DEMO_MODEL, DEMO_PROMPTS, DEMO_RECIPES, DEMO_SEEDS, content_summary, policy_path
from h3eval.policy import load_policy
from h3eval.prompts import load_prompts
from h3eval.store import RunStore


def test_the_demo_runs_the_trained_preset_on_captions_it_learned():
    assert canonical_model(DEMO_MODEL) == "tiny-trained"
    suite = load_prompts(DEMO_PROMPTS)
    for prompt in suite.prompts:
        assert parse_caption(prompt.prompt)  # a caption of the world: the content check has its ground truth
    # 16 pairs per candidate: the release policy's sample size (seed 002's decisive 16-clip paired test).
    assert len(suite.ids) * len(DEMO_SEEDS) >= load_policy(policy_path("release")).policy.min_pairs == 16
    assert "prompt_faithfulness" in CPU_GATES and DEMO_RECIPES[0] == "baseline"


def _result(candidate: str, prompt_id: str, seed: int, baseline: dict, cand: dict, status: str = "ok"):
    return GateResult(gate="prompt_faithfulness", pair=PairRef(baseline="baseline", candidate=candidate,
                                                                prompt_id=prompt_id, seed=seed),
                      status=status, info={"baseline": {"aspects": baseline}, "candidate": {"aspects": cand}})


def test_content_summary_counts_each_clip_once_and_leaves_unscored_pairs_out(tmp_path):
    store = RunStore(tmp_path)
    right, wrong = {"colour": True, "pitch": True}, {"colour": False, "pitch": True}
    results = [_result("fewer-steps", "p0", 0, right, wrong), _result("fewer-steps", "p1", 0, wrong, wrong),
               _result("identity", "p0", 0, right, right), _result("identity", "p1", 0, wrong, wrong),
               _result("identity", "p2", 0, {}, {}, status="not_applicable")]
    for r in results:
        atomic_write_json(store.gate_result_path(r.gate, r.pair.candidate, r.pair.prompt_id, r.pair.seed),
                          r.model_dump(mode="json"))
    summary = content_summary(tmp_path)
    # The baseline's two clips are in both candidates' pair results: counted once.
    assert summary["baseline"] == {"colour": (1, 2), "pitch": (2, 2)}
    assert summary["fewer-steps"] == {"colour": (0, 2), "pitch": (2, 2)}
    assert summary["identity"] == {"colour": (1, 2), "pitch": (2, 2)}


def _floor_gates_from_the_toml(path, kind) -> set[str]:
    """Reference: the gates of the shared table and of ``kind``'s judge under which the raw TOML has a
    ``fraction_of_floor`` anywhere."""
    import tomllib

    data = tomllib.loads(path.read_text(encoding="utf-8"))

    def mentions(node) -> bool:
        if isinstance(node, dict):
            return "fraction_of_floor" in node or any(mentions(v) for v in node.values())
        return False

    tables = {**data.get("gates", {}), **data.get("judges", {}).get(kind, {}).get("gates", {})}
    return {name for name, table in tables.items() if mentions(table)}


def test_the_demo_floor_measures_what_its_candidates_judges_read():
    """The demo's floor runs only the gates whose thresholds for its candidates' judges (identity exact; turbo4-tiny
    resample as declared; turbo4-tiny-sparse near against its parent turbo4-tiny and resample against
    the baseline as the ladder's top) are fractions of the floor; each kind's set equals a walk over the raw policy
    file."""
    from h3.recipe import lever_differences, lineage_kind, load_recipe
    from h3eval.demo import DEMO_CANDIDATES, DEMO_LADDER, floor_gates

    path = policy_path("release")
    policy = load_policy(path).policy
    for kind in ("exact", "near", "resample"):
        assert set(policy.floor_gates([kind])) == _floor_gates_from_the_toml(path, kind), kind
    assert [load_recipe(name).signoff.kind for name in DEMO_CANDIDATES] == ["exact", "resample", "resample"]
    below, top = (load_recipe(name) for name in DEMO_LADDER[1:])
    assert top.parent == below.name and below.parent is None
    assert lineage_kind(lever_differences(below.resolved(), top.resolved())) == "near"
    expected = ({g for kind in ("exact", "near", "resample") for g in _floor_gates_from_the_toml(path, kind)}
                & set(CPU_GATES))
    assert expected == {"fidelity", "audio", "reference_free", "ghosting", "trajectory"}
    # The demo's policy leaves out the near judge's advisory ghost_score_max and trajectory gate, the only near
    # readings against the ghosting and trajectory floors: its floor runs the rest.
    demo_path = policy_path("demo")
    demo_expected = ({g for kind in ("exact", "near", "resample") for g in _floor_gates_from_the_toml(demo_path, kind)}
                     & set(CPU_GATES))
    assert set(floor_gates()) == demo_expected == expected - {"ghosting", "trajectory"}


def test_the_demo_policy_is_the_release_policy_without_vbench():
    """gates/policies/demo.toml is release.toml with the resample judge's VBench tables removed (and its own name and
    description): generated from it, and its data equal to release's without VBench, so the two cannot drift apart; the
    demo's gates are every gate its candidates' judges read under
    it, whereas under release the resample judge also reads VBench, which the demo cannot run on a fresh machine."""
    import tomllib

    from h3.recipe import load_recipe
    from h3eval.demo import DEMO_POLICY, demo_policy_text

    text = policy_path("release").read_text(encoding="utf-8")
    assert policy_path(DEMO_POLICY).read_text(encoding="utf-8") == demo_policy_text(text), (
        "gates/policies/demo.toml is not release.toml without VBench: regenerate it with "
        "python -c 'from h3eval.demo import write_demo_policy; write_demo_policy()'")
    release = tomllib.loads(text)
    demo = tomllib.loads(demo_policy_text(text))
    assert demo["name"] == "demo" and "without VBench" in demo["description"]
    near = release["judges"]["near"]["gates"]
    left_out = [near["ghosting"]["metrics"].pop("ghost_score_max"), near.pop("trajectory")]
    assert all(table["required"] is False for table in left_out)  # advisory under release: they decide nothing
    del release["judges"]["resample"]["gates"]["vbench"]
    for data in (release, demo):
        del data["name"], data["description"]
    assert demo == release
    kinds = [load_recipe(name).signoff.kind for name in DEMO_RECIPES[1:]] + ["near"]  # the sparse rung's judge
    needed = {g for kind in kinds for g in load_policy(policy_path(DEMO_POLICY)).policy.gates_for(kind)}
    assert needed <= set(CPU_GATES)
    needed_release = {g for kind in kinds for g in load_policy(policy_path("release")).policy.gates_for(kind)}
    assert needed_release - set(CPU_GATES) == {"vbench"}


def test_the_policy_note_says_what_is_left_out_and_how_to_get_it(monkeypatch):
    import h3eval.gateplan as gateplan
    from h3eval.demo import policy_note

    asked = []

    def blocked(gate, **kwargs):
        asked.append((gate, kwargs["dims"]))
        return gateplan.Blocked(gate, "not set up", "`h3eval vbench setup --dimensions temporal_flickering`")

    monkeypatch.setattr(gateplan, "blocker", blocked)
    assert policy_note() == ("judged under the demo policy: release without VBench (not set up here: `h3eval vbench "
                             "setup --dimensions temporal_flickering`)")
    assert asked == [("vbench", ["temporal_flickering"])]  # the dimensions release's VBench metrics name
    monkeypatch.setattr(gateplan, "blocker", lambda gate, **kwargs: None)
    assert "set up here: judge the run under release with" in policy_note()
    assert policy_note("release") == "judged under policy 'release'"


def _fake_demo(tmp_path, outcomes):
    from h3eval.demo import DemoResult

    run = tmp_path / "demo-run" / "run"
    return DemoResult(run_dir=run, floor_dir=tmp_path / "demo-run" / "floor", overall="FAIL",
                      lines=["FAIL  policy 'demo', baseline 'baseline'"], identical={"identity": True},
                      lpips_trunk="rand", reports={"verdict": run / "verdict.json", "html": run / "report.html"},
                      seconds=100.0, prompts=4, outcomes=outcomes, ladder=["  baseline -> turbo4-tiny: PASS"],
                      sequential=["  identity: PASS at look 1 of 3"], saved="40 of 80 requests", determinism=(16, 16))


def test_the_demo_command_closes_with_the_outcome_the_report_and_the_next_command(tmp_path, monkeypatch):
    """The closing lines (run_demo replaced by its result): the ladder, where each candidate stopped and the requests
    saved, the outcome per candidate against the intended one, the report and the next command; the policy and the
    LPIPS fallback are said before the work starts; an outcome other than the intended one exits 1."""
    from typer.testing import CliRunner

    import h3eval.demo as demo
    from h3eval.cli import app

    monkeypatch.setattr(demo, "lpips_trunk", lambda: "rand")
    intended = dict(demo.DEMO_INTENDED)
    assert list(intended) == list(demo.DEMO_CANDIDATES) and intended["identity"] == "PASS"
    missed = {**intended, "fewer-steps": "INCONCLUSIVE"}
    said = ", ".join(f"{name} {outcome}" for name, outcome in intended.items())
    for outcomes, code in ((intended, 0), (missed, 1)):
        monkeypatch.setattr(demo, "run_demo", lambda out, outcomes=outcomes, **kw: _fake_demo(tmp_path, outcomes))
        result = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "demo-run")])
        assert result.exit_code == code, result.output
        lines = result.stdout.splitlines()
        run = tmp_path / "demo-run" / "run"
        assert lines[-2:] == [f"report: {run / 'report.html'}", f"next: h3eval dashboard {run}"]
        got = ", ".join(f"{name} {outcome}" for name, outcome in outcomes.items())
        assert lines[-3] == (f"outcome: {said} - as intended ({demo.intended_note()}); {run / 'verdict.json'}"
                             if code == 0 else
                             f"outcome: {got} - NOT the demo's intended outcome ({said}); {run / 'verdict.json'}")
        ladder = lines.index("the ladder, each rung against the rung below (and the top against the baseline):")
        assert lines[ladder + 1:ladder + 5] == [
            "  baseline -> turbo4-tiny: PASS",
            "sequential signoff (h3eval ab --sequential): where each candidate stopped",
            "  identity: PASS at look 1 of 3", "requests saved: 40 of 80 requests"]
        assert "  baseline: 16 of 16 clips byte-identical in the floor's run and the signoff run (the same request " \
               "made twice)" in lines
        err = result.stderr.splitlines()
        assert err[0].startswith("h3eval demo: judged under the demo policy: release without VBench")
        assert err[1].startswith("note: LPIPS (the fidelity gate) uses the lpips package's random trunk")


def _candidate(name, outcome, judge, against=None, source="declared", levers=(), gates=(), top=None, own=None):
    from h3eval.verdict.schema import CandidateVerdict, GateVerdict

    return CandidateVerdict(
        candidate=name, outcome=outcome, judge=judge, judged_against=against, judge_source=source,
        lever_differences=[{"lever": lever, "kind": kind, "why": "w"} for lever, kind in levers],
        gates=[GateVerdict(gate=g, candidate=name, required=True, outcome=o, raw_outcome=o) for g, o in gates],
        against_baseline=top, own_outcome=own)


def test_the_ladder_lines_say_which_judge_decided_each_rung_and_why():
    """A rung judged as its recipe declares, a rung judged by the lever that differs from its parent, and the top's
    judgement against the baseline with the gates that FAILed it (built from verdict records of known content)."""
    from types import SimpleNamespace

    from h3eval.demo import ladder_lines

    top = _candidate("turbo4-tiny-sparse", "FAIL", "resample", source="ladder top",
                     levers=[("lora", "resample"), ("sparse_attention", "near"), ("steps", "resample")],
                     gates=[("integrity", "PASS"), ("reference_free", "FAIL")])
    verdict = SimpleNamespace(candidates=[
        _candidate("identity", "PASS", "exact"),
        _candidate("turbo4-tiny", "PASS", "resample", gates=[("reference_free", "PASS")]),
        _candidate("turbo4-tiny-sparse", "FAIL", "near", against="turbo4-tiny", source="lineage",
                   levers=[("sparse_attention", "near")], gates=[("fidelity", "FAIL"), ("ghosting", "PASS")],
                   top=top, own="FAIL")])
    assert ladder_lines(verdict) == [
        "  baseline -> turbo4-tiny: PASS, decided by the resample judge against baseline (its recipe declares "
        "[signoff] kind = 'resample')",
        "  turbo4-tiny -> turbo4-tiny-sparse: FAIL, decided by the near judge against turbo4-tiny (the lever that "
        "differs: sparse_attention (near)); FAILed by fidelity",
        "    ladder top baseline -> turbo4-tiny-sparse: FAIL, by the resample judge (the levers that differ: "
        "lora (resample), sparse_attention (near), steps (resample)); FAILed by reference_free; turbo4-tiny-sparse "
        "is FAIL",
    ]
    verdict.candidates = verdict.candidates[:1]  # a rung the verdict does not hold is said to be unjudged
    assert ladder_lines(verdict)[0] == "  baseline -> turbo4-tiny: not judged"


def test_the_sequential_lines_say_where_each_candidate_stopped():
    from h3eval.demo import sequential_lines

    state = {"candidates": ["identity", "turbo4-tiny", "late"], "looks": [4, 8, 16], "max_pairs": 16,
             "stopped": {"identity": {"look": 1, "n_pairs": 4, "outcome": "PASS", "why": "decided"},
                         "turbo4-tiny": {"look": 3, "n_pairs": 16, "outcome": "PASS", "why": "last look"}}}
    assert sequential_lines(state) == ["  identity: PASS at look 1 of 3 (4 of 16 pairs): decided",
                                       "  turbo4-tiny: PASS at look 3 of 3 (16 of 16 pairs): last look",
                                       "  late: not stopped"]


def test_baseline_determinism_compares_the_two_runs_clip_by_clip():
    """Planted records: equal hashes count as identical, a differing one does not, a clip missing on either side is not
    compared."""
    from types import SimpleNamespace

    from h3eval.demo import baseline_determinism

    def store(hashes):
        return SimpleNamespace(read_record=lambda recipe, pid, seed: (
            SimpleNamespace(mp4_sha256=hashes[(pid, seed)]) if recipe == "baseline" and (pid, seed) in hashes
            else None))

    floor = store({("a", 0): "x", ("a", 1): "y", ("b", 0): "z", ("b", 1): "w"})
    run = store({("a", 0): "x", ("a", 1): "y", ("b", 0): "other"})
    assert baseline_determinism(floor, run, ["a", "b"], [0, 1]) == (2, 3)
