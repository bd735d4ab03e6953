"""`h3eval demo`: the main job on the embedded default, end to end on a CPU.

The trained tiny preset (``tiny``: h3.tiny_trained, issue 17) generates the world-demo prompts (captions of its
procedural world, with bounces and their clicks, each with its ground truth) at four seeds (16 pairs, the sample size
seed 002 found decisive) for the baseline and two candidates — ``identity`` (every lever named and off: the
off-identity check, it must come out byte-identical) and ``fewer-steps`` (8 instead of 29 steps without distillation:
it must not) — with latent trajectories recorded. Every gate that runs on the CPU scores the pairs, the prompt
faithfulness gate among them (the world's detector reads colour, shape, direction, pitch, bounces and sync from each
clip and scores it against its caption); the baseline's own clips at other seeds give the new-seed noise floor the
policy states its thresholds against; the verdict and the reports are written; and the demo prints what it found, the
content the clips show, where to look and what to run next.

The demo is judged under the ``demo`` policy (gates/policies/demo.toml): the release policy without VBench, whose
pinned scoring environment a fresh machine does not have (``h3eval vbench setup``); under release itself the resample
candidate would be INCONCLUSIVE for want of VBench on every fresh machine. Each long part shows its progress
(h3eval.progress: ``demo 1/3 ab``, ``demo 2/3 gates``, ``demo 3/3 floor gates``; the report takes a second).
Without the AlexNet weights LPIPS falls back to the lpips package's random trunk; the demo says so before it starts,
at the end, and in the verdict's warnings.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEMO_MODEL = "tiny"
"""The trained tiny preset: its clips show the caption's shapes moving, with their tones and clicks."""
DEMO_PROMPTS = "world-demo"
"""Four captions of the world the preset was trained on (prompts/world-demo.jsonl), each with bounces."""
DEMO_RECIPES = ("baseline", "identity", "fewer-steps")
DEMO_INTENDED = {"identity": "PASS", "fewer-steps": "FAIL"}
"""What the demo is for: an identical candidate passes, a lossy one (8 steps without distillation) fails."""
DEMO_POLICY = "demo"
"""gates/policies/demo.toml: the release policy without VBench (tests/test_demo.py holds the two together)."""
DEMO_SEEDS = (0, 1, 2, 3)
CPU_GATES = ("integrity", "fidelity", "ghosting", "audio", "trajectory", "reference_free", "prompt_faithfulness")
ALEXNET_FILE = "alexnet-owt-7be5be79.pth"


class DemoError(RuntimeError):
    """The demo could not produce its run (a generation failed or a recipe did not run as configured)."""


@dataclass
class DemoResult:
    run_dir: Path
    floor_dir: Path
    overall: str
    lines: list[str] = field(default_factory=list)
    identical: dict[str, bool] = field(default_factory=dict)
    lpips_trunk: str = "alexnet"
    reports: dict[str, Path] = field(default_factory=dict)
    seconds: float = 0.0
    gate_errors: list[Any] = field(default_factory=list)
    model: str = DEMO_MODEL
    prompts: int = 0
    """How many prompts the suite has."""
    seeds: tuple[int, ...] = DEMO_SEEDS
    content: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    """Recipe -> aspect -> (clips right, clips scored), from the prompt faithfulness gate (:func:`content_summary`)."""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    """Wall seconds of each part: ab (clips, warm-ups, speed requests), gates, floor, report."""
    policy: str = DEMO_POLICY
    outcomes: dict[str, str] = field(default_factory=dict)
    """Candidate -> its outcome (PASS, FAIL, INCONCLUSIVE), as verdict.json has it."""


def lpips_trunk() -> str:
    """The real AlexNet trunk when its weights are in the torch hub cache, else the package's random trunk."""
    import torch

    return "alexnet" if (Path(torch.hub.get_dir()) / "checkpoints" / ALEXNET_FILE).is_file() else "rand"


def lpips_note() -> str:
    """What the demo says when LPIPS falls back to the random trunk (before it starts, at the end, in the verdict)."""
    import torch

    where = Path(torch.hub.get_dir()) / "checkpoints" / ALEXNET_FILE
    return (f"LPIPS (the fidelity gate) uses the lpips package's random trunk: the AlexNet weights {ALEXNET_FILE} are "
            f"not at {where}; its values are for the demo only (put the file there for the real metric)")


def policy_note(policy: str = DEMO_POLICY) -> str:
    """The line that says which policy judges the demo and, for the demo policy, what it leaves out and why."""
    if policy != DEMO_POLICY:
        return f"judged under policy {policy!r}"
    from h3eval.gateplan import blocker, vbench_dimensions
    from h3eval.policy import load_policy

    dims = vbench_dimensions(load_policy(policy_path("release")).policy)
    blocked = blocker("vbench", options={}, dims=dims)
    why = (f"not set up here: {blocked.fix}" if blocked is not None else
           "set up here: judge the run under release with `h3eval floor --from-run RUN --recipe baseline --policy "
           "release --out FLOOR`, `h3eval gate RUN --policy release` and `h3eval verdict RUN --policy release --floor "
           "FLOOR/floor.json`")
    return f"judged under the demo policy: release without VBench ({why})"


def content_summary(run_dir: str | Path) -> dict[str, dict[str, tuple[int, int]]]:
    """What the prompt faithfulness gate read from each recipe's clips: recipe -> aspect (colour, shape, direction,
    pitch, bounces, sync) -> (clips right, clips scored). Every pair result scores both sides, so the baseline's clips
    are counted once, from the first candidate's pairs; pairs the gate did not score (an error, a prompt without
    ground truth) are not counted."""
    from gates.base import GateResult
    from gates.prompt_faithfulness import GATE_NAME
    from h3eval.store import RunStore

    store = RunStore(run_dir)
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for index, candidate in enumerate(store.gate_candidates(GATE_NAME)):
        for path in store.gate_result_files(GATE_NAME, candidate):
            result = GateResult.model_validate_json(path.read_text(encoding="utf-8"))
            if result.status != "ok":
                continue
            sides = [("candidate", candidate)] + ([("baseline", result.pair.baseline)] if index == 0 else [])
            for side, recipe in sides:
                for aspect, ok in (result.info.get(side) or {}).get("aspects", {}).items():
                    right, scored = out.setdefault(recipe, {}).get(aspect, (0, 0))
                    out[recipe][aspect] = (right + bool(ok), scored + 1)
    return out


def run_demo(out: str | Path = "demo-run", progress: bool = True, seeds=DEMO_SEEDS, prompts: str = DEMO_PROMPTS,
             policy: str = DEMO_POLICY, model: str = DEMO_MODEL) -> DemoResult:
    from h3eval.ab import off_identity, run_ab_from_args
    from h3eval.floor import newseed_floor_from_run
    from h3eval.gaterun import run_gates
    from h3eval.progress import stage
    from h3eval.prompts import load_prompts
    from h3eval.report import write_reports
    from h3eval.store import RunStore
    from h3eval.verdict import run_verdict

    started = time.perf_counter()
    stages: dict[str, float] = {}
    out = Path(out)
    run_dir, floor_dir = out / "run", out / "floor"
    suite = load_prompts(prompts)
    # identity (every lever named and off) must come out byte-identical — h3eval ab checks it as an off-identity
    # candidate; fewer-steps must not. One warm-up request per recipe. No separate speed round: the verdict's speed
    # check pairs the 16 quality requests (each pair's recipes run back to back), and the demo's prompts all have one
    # length, so a mixed-prompt round would only repeat 12 of those requests (bench/demo_cpu/results/demo_cpu_s13_amd.md).
    with stage("demo 1/3"):
        run_ab_from_args(baseline="baseline", candidates=["identity", "fewer-steps"], prompts=prompts, out=run_dir,
                         model=model, seeds=",".join(str(s) for s in seeds), off_identity=False, trajectory=True,
                         warmup=1, speed_protocol="mixed", speed_rounds=0, device="cpu", progress=progress)
    stages["ab"] = time.perf_counter() - started
    manifest = RunStore(run_dir).read_manifest()
    if manifest.status != "complete":
        problems = [f"{e.recipe}/{e.prompt_id}-s{e.seed}: {e.error}" for e in manifest.errors[:5]]
        mismatches = manifest.extra.get("ab", {}).get("executed_mismatches", {})
        raise DemoError(f"the demo's A/B run ended {manifest.status}: " + "; ".join(
            problems + [f"{k}: {v}" for k, v in mismatches.items()]))
    trunk = lpips_trunk()
    options = {"fidelity.lpips_trunk": trunk}
    mark = time.perf_counter()
    with stage("demo 2/3"):
        summary = run_gates(run_dir, list(CPU_GATES), device="cpu", options=options, progress=progress)
    stages["gates"] = time.perf_counter() - mark

    mark = time.perf_counter()
    store = RunStore(run_dir)
    identical = {cand: off_identity(store, DEMO_RECIPES[0], cand, suite.ids, list(seeds))["passed"]
                 for cand in DEMO_RECIPES[1:]}
    with stage("demo 3/3 floor"):
        floor = newseed_floor_from_run(run_dir, DEMO_RECIPES[0], floor_dir, gates=floor_gates(policy), device="cpu",
                                       gate_options=options, progress=progress,
                                       determinism={"pairs": len(suite.ids) * len(seeds),
                                                    "identical": identical.get("identity", False),
                                                    "checked_by": "identity recipe vs baseline"})
    stages["floor"] = time.perf_counter() - mark
    mark = time.perf_counter()
    verdict = run_verdict(run_dir, policy_path(policy), floor=RunStore(floor_dir).floor_path)
    if trunk != "alexnet":
        verdict.warnings.append(lpips_note())  # in verdict.json and the reports, not only on the terminal
    paths = write_reports(verdict, run_dir)
    stages["report"] = time.perf_counter() - mark
    from h3eval.verdict import summary_lines

    return DemoResult(run_dir=run_dir, floor_dir=floor_dir, overall=str(verdict.outcome), identical=identical,
                      lpips_trunk=trunk, reports=dict(paths), seconds=time.perf_counter() - started,
                      gate_errors=list(summary.errors) + list(floor["gate_errors"]), lines=summary_lines(verdict),
                      model=manifest.model, prompts=len(suite.ids), seeds=tuple(seeds),
                      content=content_summary(run_dir), stage_seconds=stages, policy=policy,
                      outcomes={c.candidate: str(c.outcome) for c in verdict.candidates})


def floor_gates(policy: str = DEMO_POLICY) -> list[str]:
    """The gates the demo's floor measures: those of its CPU gates whose thresholds for the demo candidates' signoff
    kinds (identity: exact, fewer-steps: resample) the policy states against the new-seed floor (under the demo and
    release policies fidelity, audio and reference_free; ghosting's and trajectory's floors are read by the near judge
    only)."""
    from h3.recipe import load_recipe
    from h3eval.policy import load_policy

    kinds = [recipe.signoff.kind if recipe.signoff else None for recipe in map(load_recipe, DEMO_RECIPES[1:])]
    return [g for g in load_policy(policy_path(policy)).policy.floor_gates(kinds) if g in CPU_GATES]


DEMO_POLICY_HEADER = """\
# The demo's policy: the release policy (gates/policies/release.toml) WITHOUT VBench, and nothing else changed.
#
# `h3eval demo` runs on any CPU, where VBench's pinned scoring environment is not set up (`h3eval vbench setup`
# builds it). Judged under release, the demo's resample candidate would be INCONCLUSIVE for want of VBench
# temporal_flickering on every fresh machine; under this policy it is judged by what the demo runs: reference-free
# non-inferiority and prompt faithfulness. For a real signoff use the release policy, with VBench set up.
#
# GENERATED from release.toml: `python -c "from h3eval.demo import write_demo_policy; write_demo_policy()"` after any
# change to it (tests/test_demo.py fails until then). The release policy's own notes follow.
#
"""
VBENCH_TABLE = "[judges.resample.gates.vbench"


def demo_policy_text(release: str) -> str:
    """gates/policies/demo.toml's text from release.toml's: the header above, the tables under
    ``[judges.resample.gates.vbench`` left out (each up to the next table header), the name ``demo`` and the
    description saying so."""
    out, skipping, top = [], False, True  # top: before the first table header (the policy's own keys)
    for line in release.splitlines(keepends=True):
        if line.startswith("["):
            skipping, top = line.startswith(VBENCH_TABLE), False
        if skipping:
            continue
        if top and line.startswith('name = "release"'):
            line = 'name = "demo"\n'
        elif top and line.startswith('description = "'):
            line = line.replace('description = "', 'description = "The release policy without VBench (what `h3eval '
                                'demo` can run on any CPU). ', 1)
        out.append(line)
    return DEMO_POLICY_HEADER + "".join(out)


def write_demo_policy() -> Path:
    """Write gates/policies/demo.toml from release.toml (:func:`demo_policy_text`)."""
    target = policy_path(DEMO_POLICY)
    target.write_text(demo_policy_text(policy_path("release").read_text(encoding="utf-8")), encoding="utf-8")
    return target


def policy_path(name_or_path: str | Path) -> Path:
    """A shipped policy by name (``release``, ``quality``, ``speed``) or a path."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = Path(__file__).resolve().parent.parent / "gates" / "policies" / f"{name_or_path}.toml"
    return shipped if shipped.is_file() else path
