"""Which gates a signoff policy needs for a run, which of them can run here, and what to do about the others.

``h3eval gate RUN --policy release`` and ``h3eval floor --policy release`` read the policy through h3eval.policy's API:
each candidate's judge (its signoff kind: declared by its recipe's ``[signoff] kind``, by ``h3eval import --kind``,
or by the levers that differ from its parent) decides the gates it needs (:meth:`Policy.gates_for`), and a floor
measures the gates whose thresholds are stated against the floor (:meth:`Policy.floor_gates`). A gate that cannot run
on this machine is not attempted pair by pair: it is named once, with the exact command or file that would make it
run (:func:`blocker`):

- ``vbench``: the pinned VBench environment (``h3eval vbench setup --dimensions ...``), checked by
  :func:`gates.vbench.verify` for the dimensions the policy's metrics name;
- ``fidelity``: LPIPS's AlexNet trunk, ``alexnet-owt-7be5be79.pth`` in the torch hub cache (or the random trunk of
  ``-o fidelity.lpips_trunk=rand``, for tests and offline demos only);
- ``trajectory``: latent trajectories, recorded only by ``h3eval ab ... --trajectory`` (imported clips have none:
  there the gate runs and records each pair as not applicable).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h3eval.policy import LoadedPolicy, Policy, PolicyError, load_policy
from h3eval.store import RunManifest, RunStore

POLICY_DIR = Path(__file__).resolve().parent.parent / "gates" / "policies"


def policy_path(name_or_path: str | Path) -> Path:
    """A shipped policy by name (``release``, ``quality``, ``speed``...) or a path; PolicyError naming the shipped
    ones when it is neither."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = POLICY_DIR / f"{name_or_path}.toml"
    if shipped.is_file() and path.parent == Path("."):
        return shipped
    names = ", ".join(sorted(p.stem for p in POLICY_DIR.glob("*.toml")))
    raise PolicyError(f"policy {str(name_or_path)!r} is neither a file nor a shipped policy ({names})")


def load_named_policy(name_or_path: str | Path) -> LoadedPolicy:
    return load_policy(policy_path(name_or_path))


def candidate_kinds(policy: Policy, manifest: RunManifest, candidate: str) -> list[str | None]:
    """The signoff kinds ``candidate`` is judged as under ``policy`` (several for a ladder's top, judged against its
    parent and against the baseline); ``[None]`` when it declares none."""
    try:  # the lineage judge (issue 50), when this checkout has it
        from h3eval.verdict.lineage import judgements
    except ImportError:
        from h3eval.verdict import choose_judge

        return [choose_judge(policy, manifest, candidate)[0]]
    return list(dict.fromkeys(j.kind for j in judgements(policy, manifest, candidate)))


def vbench_dimensions(policy: Policy) -> list[str]:
    """The VBench dimensions the policy's ``vbench`` metrics name (``temporal_flickering_delta`` ->
    ``temporal_flickering``), in order."""
    from gates.vbench.dimensions import DIMENSIONS

    tables = [policy.gates.get("vbench")] + [j.gates.get("vbench") for j in policy.judges.values()]
    dims: list[str] = []
    for table in tables:
        for metric in (table.metrics if table else {}):
            name = metric.removesuffix("_delta")
            if name in DIMENSIONS and name not in dims:
                dims.append(name)
    return dims


@dataclass
class Blocked:
    """A gate that cannot run here: why, and the exact command or step that would make it run."""

    gate: str
    reason: str
    fix: str

    def line(self) -> str:
        return f"{self.gate}: cannot run here: {self.reason}; to run it: {self.fix}"


def _option(options: dict[str, Any], gate: str, key: str) -> Any:
    return options.get(f"{gate}.{key}", options.get(key))


def has_trajectories(store: RunStore, manifest: RunManifest, recipes: list[str] | None = None) -> bool:
    """Whether the run recorded a latent trajectory next to any clip of ``recipes`` (default: the baseline)."""
    from h3.trajectory import trajectory_path

    for recipe in recipes or [manifest.baseline]:
        directory = store.clip_dir(recipe)
        if directory.is_dir() and any(trajectory_path(mp4).exists() for mp4 in directory.glob("*.mp4")):
            return True
    return False


def imported(manifest: RunManifest) -> bool:
    return manifest.kind == "import" or any("imported_from" in (r or {}) for r in manifest.recipes.values())


def blocker(gate: str, *, options: dict[str, Any], dims: list[str] | None = None, trajectories: bool = True,
            is_imported: bool = False) -> Blocked | None:
    """Why ``gate`` cannot run on this machine for this run, with the fix; None when it can. ``trajectories``: whether
    the clips it would gate have latent trajectories (``is_imported``: whether they are imported clips, on which the
    trajectory gate runs and records "not applicable")."""
    from gates.base import known_gates

    if gate not in known_gates():
        return Blocked(gate, "not a registered gate", f"correct the policy (registered: {', '.join(known_gates())})")
    if gate == "fidelity":
        from gates.fidelity import ALEXNET_WEIGHTS, FETCH_COMMAND, alexnet_weights_path

        trunk = _option(options, "fidelity", "lpips_trunk") or os.environ.get("H3EVAL_LPIPS_TRUNK") or "alexnet"
        path = alexnet_weights_path()
        if trunk == "alexnet" and not path.is_file():
            return Blocked(gate, f"LPIPS needs the AlexNet trunk weights {ALEXNET_WEIGHTS}, which are not in "
                                 f"{path.parent}",
                           f"put {ALEXNET_WEIGHTS} at {path} (on a connected machine: `{FETCH_COMMAND}` writes it to "
                           f"~/.cache/torch/hub/checkpoints/), or pass `-o fidelity.lpips_trunk=rand` (a random "
                           f"trunk: tests and offline demos only)")
    if gate == "vbench":
        from gates.vbench.env import default_env_path
        from gates.vbench.pins import verify

        wanted = dims or []
        env = _option(options, "vbench", "env")
        report = verify(Path(env) if env else default_env_path(), wanted, _option(options, "vbench", "cache_dir"))
        if not report.ok:
            return Blocked(gate, f"the pinned VBench environment is not usable ({report.problems[0]})",
                           f"`h3eval vbench setup --dimensions {','.join(wanted)}`"
                           + (" (and `--fetch-checkpoints` on a connected machine)"
                              if any("checkpoint" in p for p in report.problems) else ""))
    if gate == "trajectory" and not trajectories and not is_imported:
        return Blocked(gate, "the run recorded no latent trajectories",
                       "generate the run with `h3eval ab ... --trajectory` (the near judge's trajectory gate is "
                       "advisory)")
    return None


@dataclass
class GatePlan:
    """What ``h3eval gate RUN --policy P`` runs: groups of (gates, candidates), one gate-runner call each."""

    loaded: LoadedPolicy
    groups: list[tuple[list[str], list[str]]] = field(default_factory=list)
    blocked: list[Blocked] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    """The gate options to run with: the given ones, plus ``vbench.dimensions`` from the policy when not given."""
    pairing: dict[tuple[str, str], set[str]] | None = None
    """(reference, candidate) -> the gates that comparison's judgement needs (a ladder's top: near gates against its
    parent, resample gates against the baseline); ``None`` (a policy without judges): every comparison, every gate."""

    @property
    def gates(self) -> list[str]:
        return list(dict.fromkeys(g for gates, _ in self.groups for g in gates))


def plan_gates(run_dir: str | Path, policy: str | Path, options: dict[str, Any] | None = None) -> GatePlan:
    """The gates ``policy`` needs for each candidate of the run at ``run_dir``, grouped by candidates that need the
    same ones; those that cannot run here are left out and named (:func:`blocker`)."""
    loaded = load_named_policy(policy)
    store = RunStore(run_dir)
    manifest = store.read_manifest()
    options = dict(options or {})
    dims = vbench_dimensions(loaded.policy)
    plan = GatePlan(loaded=loaded, options=options)
    if dims and _option(options, "vbench", "dimensions") is None:
        plan.options["vbench.dimensions"] = ",".join(dims)
    trajectories, is_imported = has_trajectories(store, manifest), imported(manifest)
    verdicts: dict[str, Blocked | None] = {}
    groups: dict[tuple[str, ...], list[str]] = {}
    for candidate in manifest.candidates:
        kinds = candidate_kinds(loaded.policy, manifest, candidate)
        if loaded.policy.judges and None in kinds:
            fix = (f"`h3eval import ... --kind {candidate}=exact|near|resample`" if is_imported else
                   "a `[signoff] kind` in its recipe")
            plan.notes.append(f"{candidate} declares no signoff kind, so only the policy's shared gates run for it; "
                              f"declare it with {fix}")
        needed = list(dict.fromkeys(g for kind in kinds for g in loaded.policy.gates_for(kind)))
        runnable = []
        for gate in needed:
            if gate not in verdicts:
                verdicts[gate] = blocker(gate, options=plan.options, dims=dims, trajectories=trajectories,
                                         is_imported=is_imported)
                if verdicts[gate] is not None:
                    plan.blocked.append(verdicts[gate])  # type: ignore[arg-type]
            if verdicts[gate] is None:
                runnable.append(gate)
        if runnable:
            groups.setdefault(tuple(runnable), []).append(candidate)
    plan.groups = [(list(gates), candidates) for gates, candidates in groups.items()]
    if loaded.policy.judges:
        from h3eval.verdict.lineage import pairing_gates

        plan.pairing = pairing_gates(loaded.policy, manifest)
    return plan


def group_options(gates: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """The options one group's gate run takes: scoped ones (the runner ignores those of gates it does not run) and
    unscoped ones a gate of the group knows (the others belong to another group's gates)."""
    from gates.base import gate_class

    known = set().union(*(gate_class(g).option_names for g in gates)) if gates else set()
    return {k: v for k, v in options.items() if "." in k or k in known}


def floor_kinds(policy: Policy, manifest: RunManifest | None) -> tuple[list[str | None], str | None]:
    """The signoff kinds a floor is measured for: those of the run's candidates (a floor from a run), else every
    judge of the policy; and a note when the run's candidates declare none."""
    every: list[str | None] = list(policy.judges) or [None]
    if manifest is None:
        return every, None
    kinds = list(dict.fromkeys(k for c in manifest.candidates for k in candidate_kinds(policy, manifest, c)
                               if k is not None))
    if not kinds:
        return every, (f"no candidate of the run declares a signoff kind: the floor measures what every judge of "
                       f"policy {policy.name!r} needs")
    return kinds, None


def next_after_gate(run_dir: str | Path, policy_arg: str, loaded: LoadedPolicy) -> str:
    """The command after ``h3eval gate RUN --policy P``: the floor when the policy states thresholds against one and
    the run has none, then the verdict."""
    store = RunStore(run_dir)
    manifest = store.read_manifest()
    kinds = [k for c in manifest.candidates for k in candidate_kinds(loaded.policy, manifest, c)]
    if loaded.policy.floor_gates(kinds or [None]) and loaded.policy.floor_file is None:
        floor_dir = f"{str(run_dir).rstrip('/')}-floor"
        return (f"next: h3eval floor --from-run {run_dir} --recipe {manifest.baseline} --policy {policy_arg} "
                f"--out {floor_dir}, then h3eval verdict {run_dir} --policy {policy_arg} --floor "
                f"{floor_dir}/floor.json --write")
    return f"next: h3eval verdict {run_dir} --policy {policy_arg} --write"
