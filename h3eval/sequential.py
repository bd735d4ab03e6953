"""Sequential signoff (issue 53): a group-sequential design over looks, so that a candidate stops generating as soon
as its verdict is decided, with the verdict's error rates kept.

The design (boundaries, nominal levels, the stopping rule) is h3eval.sequential_design's; this module runs it: rounds
of pairs, a verdict per look, the state file that makes a killed run resume, and the requests saved.

Looks are whole seeds of the prompt suite (every prompt at every seed of a round): a look of ``n`` pairs with ``P``
prompts takes ``ceil(n / P)`` seeds (:func:`look_seeds`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from h3eval.sequential_design import (DEFAULT_LOOKS, DEFAULT_MAX_PAIRS, DESIGNS, Design, SequentialDesign,  # noqa: F401
                                      SequentialError, boundaries, crossing_probabilities, look_pairs, look_policy,
                                      look_seeds, make_design, nominal_levels, policy_alphas, resolvable, spent,
                                      stop_decision, z_of)

STATE_NAME = "sequential.json"
STATE_SCHEMA = "h3eval.sequential"
STATE_VERSION = 2
"""2 (session 32): the looks spend the ghosting run test's FDR, count departed pairs against the last look, and stop a
byte-identical rung only when identical to its parent and the baseline; a run begun under version 1's rules is not
resumed under these (its looks would mix two rules)."""


def _load_state(path) -> dict[str, Any] | None:
    import json

    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SequentialError(f"{path} is not a readable sequential record: {exc}") from None
    if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA:
        raise SequentialError(f"{path} is not a sequential record (schema {STATE_SCHEMA!r})")
    return data


def _identity(state: dict[str, Any]) -> dict[str, Any]:
    """What a resumed run must share with the one on disk."""
    keys = ("version", "baseline", "candidates", "prompts_sha256", "seeds", "looks", "policy_sha256", "floor_sha256")
    return {k: state.get(k) for k in keys} | {"design": state["design"]["design"]}


def _file_sha(path) -> str | None:
    import hashlib
    from pathlib import Path

    return None if path is None else hashlib.sha256(Path(path).read_bytes()).hexdigest()


def metric_rows(candidate, design: SequentialDesign, look: int, alpha_ni: float, policy=None) -> list[dict[str, Any]]:
    """Each required metric's statistic at this look beside its boundary: the (Holm-adjusted) non-inferiority p as a
    z, and the regression test's, with the effect (mean) and its CI at the look's level."""
    rows = []
    for g in candidate.gates:
        for m in g.metrics:
            if not m.required:
                continue
            row: dict[str, Any] = {"metric": f"{g.gate}.{m.metric}", "outcome": m.outcome, "n_pairs": m.n_pairs,
                                   "mean": m.mean_value, "ci": [m.ci_low, m.ci_high], "threshold": m.threshold}
            p = m.p_holm if m.p_holm is not None else m.p_value
            if p is not None:
                row.update(p=p, z=z_of(p), bound=design.bound(alpha_ni, look))
            if m.p_worse_holm is not None:
                row.update(p_worse=m.p_worse_holm, z_worse=z_of(m.p_worse_holm))
                reg = _regression_alpha(policy, candidate.judge, g.gate, m.metric)
                if reg is not None:
                    row.update(alpha_worse=reg, bound_worse=design.bound(reg, look))
            rows.append(row)
    return rows


def _regression_alpha(policy, kind, gate: str, metric: str) -> float | None:
    if policy is None:
        return None
    try:
        rt = policy.gates_for(kind)[gate].metrics[metric].regression
    except (KeyError, AttributeError):
        return None
    return None if rt is None else rt.alpha


def run_sequential(*, baseline: str, candidates: Sequence[str], prompts: str, out, seeds: Sequence[int],
                   max_pairs: int = DEFAULT_MAX_PAIRS, looks: Sequence[int] = DEFAULT_LOOKS,
                   design: str = "obrien-fleming", policy: str = "release", floor=None,
                   gate_options: dict[str, Any] | None = None, gate_device: str = "cpu", off_identity: bool = False,
                   progress: bool = True, echo=None, **ab_kwargs) -> dict[str, Any]:
    """``h3eval ab --sequential``: generate pairs in rounds (the design's looks), gate each comparison with its
    judgement's gates (:func:`h3eval.verdict.lineage.pairing_gates`) and judge after each round, stop each decided
    candidate, write ``sequential.json`` (atomically, after every look) and, at the end, ``verdict.json`` with each
    candidate's verdict at the look it stopped. A killed run resumes at its round. Returns the record."""
    from pathlib import Path

    from h3.atomic import atomic_write_json
    from h3.recipe import load_recipe
    from h3eval.ab import identity_recipe, run_ab_from_args
    from h3eval.gateplan import group_options, load_named_policy, plan_gates
    from h3eval.gaterun import run_gates
    from h3eval.policy import LoadedPolicy
    from h3eval.prompts import load_prompts
    from h3eval.store import RunStore, utc_now
    from h3eval.verdict import compute_verdict

    say = echo or (lambda line: None)
    out = Path(out)
    suite = load_prompts(prompts)
    n_prompts = len(suite.ids)
    pairs = look_pairs(max_pairs, n_prompts, looks)
    seeds = _design_seeds(list(seeds), pairs[-1], n_prompts, max_pairs)
    loaded = load_named_policy(policy)
    the_design = make_design(design, pairs, policy_alphas(loaded.policy))
    alpha_ni = (1 - loaded.policy.confidence) / 2
    base = load_recipe(baseline)
    given = {load_recipe(c).name: c for c in candidates}
    if off_identity:
        given[identity_recipe(base).name] = None
    names = list(given)
    floor_path = Path(floor) if floor is not None else None
    if floor_path is not None and not floor_path.is_file():
        raise SequentialError(f"--floor {floor_path}: no such file")
    fresh = {
        "schema": STATE_SCHEMA, "version": STATE_VERSION, "baseline": base.name, "candidates": names,
        "prompts": str(prompts), "prompts_sha256": suite.sha256 if hasattr(suite, "sha256") else None,
        "n_prompts": n_prompts, "seeds": seeds, "looks": pairs, "max_pairs": pairs[-1],
        "design": the_design.to_dict(), "policy": str(loaded.path), "policy_sha256": loaded.sha256,
        "floor": str(floor_path) if floor_path else None, "floor_sha256": _file_sha(floor_path),
        "rounds": [], "stopped": {}, "verdicts": {}, "status": "running", "created_at": utc_now(),
        "parents": _ladder_parents(candidates, given)}
    state_path = out / STATE_NAME
    store = RunStore(out)
    if not state_path.is_file():  # a folder holding a sequential record is this command's
        store.check_writable_root()
    with store.lock("h3eval ab --sequential"):
        state = _load_state(state_path)
        if state is None:
            if store.manifest_path.exists():
                raise SequentialError(f"{out} holds a run that is not sequential (no {STATE_NAME}); choose a new "
                                      "--out directory")
            state = fresh
        elif _identity(state) != _identity(fresh):
            diff = [k for k, v in _identity(fresh).items() if _identity(state).get(k) != v]
            raise SequentialError(f"{state_path}: a sequential run with other parameters (differs in: "
                                  f"{', '.join(diff)}); choose a new --out directory or rerun with its own")
        if state["status"] == "complete":
            say(f"{out}: the sequential run is complete (verdict.json, {STATE_NAME})")
            return state
        look_policies = [LoadedPolicy(policy=look_policy(loaded.policy, the_design, k), path=loaded.path,
                                      sha256=f"{loaded.sha256} at sequential look {k + 1}")
                         for k in range(len(pairs))]
        options = dict(gate_options if gate_options is not None else _default_gate_options())
        last_verdict = None
        warmed: set[str] = set()  # recipes that generated in this process: warm for the rounds after (round_warmups)
        for k, n in enumerate(pairs):
            if k < len(state["rounds"]):
                continue  # this look was judged before the kill
            active = [c for c in names if c not in state["stopped"]]
            if not active:
                break
            look_seed_list = look_seeds(seeds, n_prompts, n)
            say(f"look {k + 1} of {len(pairs)}: {n} pairs (seeds {look_seed_list}), candidates {', '.join(active)}")
            _prepare_round(store, base, given, active, look_seed_list)
            generating = _round_generating(store, base, given, active, look_seed_list, suite.ids)
            run_ab_from_args(baseline=baseline, candidates=[given[c] for c in active if given[c] is not None],
                             prompts=prompts, out=out, seeds=",".join(str(s) for s in look_seed_list),
                             off_identity=any(given[c] is None for c in active), progress=progress,
                             **{**ab_kwargs, **round_warmups(ab_kwargs, warmed, generating)})
            warmed.update(generating)
            manifest = store.read_manifest()
            if manifest.status != "complete":
                raise SequentialError(f"round {k + 1} of {out} ended {manifest.status}: rerun to resume it")
            plan = plan_gates(out, policy, options)  # plan.pairing: a ladder's top runs near gates vs its parent only
            for gate_names, cands in plan.groups:
                run_gates(out, gate_names, device=gate_device, options=group_options(gate_names, plan.options),
                          progress=progress, candidates=cands, pairing_gates=plan.pairing)
            last_verdict = verdict = compute_verdict(out, look_policies[k], floor_path=floor_path)
            _record_look(state, verdict, k, len(pairs), n, look_seed_list, active, look_policies[k].policy.confidence,
                         the_design, alpha_ni, loaded.policy, say,
                         lambda cand, against: _byte_identical(store, cand, against or base.name, suite.ids,
                                                               look_seed_list))
            atomic_write_json(state_path, state)
        _finish(state, state_path, store, last_verdict, names, design, pairs, say)
        return state


def _ladder_parents(candidates: Sequence[str], given: dict[str, Any]) -> dict[str, str]:
    """Each candidate's parent when the parent is a candidate too (a ladder's rung: :func:`pairs_used`)."""
    from h3.recipe import load_recipe

    recipes = [load_recipe(c) for c in candidates]
    return {r.name: r.parent for r in recipes if r.parent in given}


def _default_gate_options() -> dict[str, Any]:
    from h3eval.demo import lpips_trunk

    return {"fidelity.lpips_trunk": lpips_trunk()}


def round_warmups(ab_kwargs: dict[str, Any], warmed: set[str], generating: list[str]) -> dict[str, Any]:
    """The warm-up arguments of a round's ``h3eval ab`` session: each recipe is warmed up once per process, in the
    first round that generates it here, not in every round. ``h3eval ab`` warms a recipe before its first timed request
    of a session, whose one-off costs are the process's (the sparse rung's flex attention is compiled twice a process:
    3.8 s of the demo's one-thread profile, bench/demo_time/results/2026-12-06-GenuineIntel-s25-pairing-warmups.md);
    after a round has generated it in this process a later round's first request is as warm as a session's second.
    Measured on the demo (Intel 2-core VM, bench/demo_time/results/2026-12-06-GenuineIntel-ladder-quiet.log):
    look 1's warm-ups took 2.3 s (baseline) and 2.3 s (the sparse rung) against 1.4-1.8 s for their timed requests,
    looks 2's and 3's what their timed requests took (baseline 1.8 and 1.7 s against 1.4-2.0 s, turbo4-tiny 1.2 and
    1.0 s against 0.8-1.2 s): five of the demo's nine warm-up requests bought nothing. A resumed run's first round is
    its process's first, so it warms every recipe it generates again.

    ``generating``: the recipes that have clips to make this round; ``warmed``: those that generated earlier in this
    process. Returns the arguments that replace ``warmup``/``warmup_recipes`` (nothing when ``warmup`` is 0)."""
    if int(ab_kwargs.get("warmup", 1)) == 0:
        return {}
    allowed = ab_kwargs.get("warmup_recipes")
    todo = [r for r in generating if r not in warmed and (not allowed or r in allowed)]
    return {"warmup_recipes": todo} if todo else {"warmup": 0, "warmup_recipes": None}


def _round_generating(store, base, given: dict[str, Any], active: list[str], seeds: list[int],
                      prompt_ids) -> list[str]:
    """The recipes of a round (the baseline, the active candidates and the parents their ladder needs) that have a
    quality clip of the round's seeds still to make."""
    from h3.recipe import load_recipe
    from h3eval.ab import identity_recipe, ladder_recipes

    recipes = [base] + ladder_recipes(base, [load_recipe(given[c]) for c in active if given[c] is not None])
    if any(given[c] is None for c in active):
        recipes.append(identity_recipe(base))
    return [r.name for r in recipes
            if any(store.read_record(r.name, pid, seed) is None for pid in prompt_ids for seed in seeds)]


def _prepare_round(store, base, given: dict[str, Any], active: list[str], seeds: list[int]) -> None:
    """Make the run on disk the round's: its seeds and the recipes still generating (the active candidates, the
    parents their ladder needs, the baseline), so that ``h3eval ab`` resumes it and generates only what is new."""
    from h3.recipe import load_recipe
    from h3eval.ab import identity_recipe, ladder_recipes

    if not store.manifest_path.exists():
        return
    recipes = [base] + ladder_recipes(base, [load_recipe(given[c]) for c in active if given[c] is not None])
    if any(given[c] is None for c in active):
        recipes.append(identity_recipe(base))
    keep = [r.name for r in recipes]
    manifest = store.read_manifest()
    if manifest.seeds == seeds and list(manifest.recipes) == keep:
        return
    manifest.seeds = list(seeds)
    manifest.candidates = keep[1:]
    manifest.recipes = {k: manifest.recipes[k] for k in keep if k in manifest.recipes}
    manifest.recipe_sha256 = {k: manifest.recipe_sha256[k] for k in keep if k in manifest.recipe_sha256}
    manifest.status = "running"
    store.write_manifest(manifest)


def pairs_used(state: dict[str, Any]) -> dict[str, int]:
    """The quality pairs each recipe of a sequential run made: a candidate until it stopped (``max_pairs`` while it
    has not), a rung's parent until the last rung built on it stopped (its clips are that rung's reference, so
    :func:`_round_generating` keeps making them after the parent stopped), the baseline until the last candidate
    stopped. ``state["parents"]`` names each candidate's parent among the candidates (a record without it: none)."""
    n_max = state["max_pairs"]
    used = {c: int(state["stopped"].get(c, {}).get("n_pairs", n_max)) for c in state["candidates"]}
    parents = state.get("parents") or {}
    need = dict(used)
    for c, n in used.items():
        q, seen = parents.get(c), {c}
        while q in need and q not in seen:
            need[q] = max(need[q], n)
            seen.add(q)
            q = parents.get(q)
    need[state["baseline"]] = max(used.values(), default=n_max)
    return need


def savings(store, state: dict[str, Any]) -> dict[str, Any]:
    """Requests and GPU-seconds the sequential run did not spend against the fixed design at its last look (every
    candidate and the baseline at ``max_pairs``): a recipe's seconds are its mean generation-side latency over its
    quality clips."""
    n_max = state["max_pairs"]
    used = pairs_used(state)
    per: dict[str, Any] = {}
    rows = [(state["baseline"], used.pop(state["baseline"]))] + [(c, used[c]) for c in state["candidates"]]
    manifest = store.read_manifest()
    prompts = manifest.prompts.ids if manifest.prompts else []
    for name, n in rows:
        lat = []
        for seed in state["seeds"]:
            for pid in prompts:
                rec = store.read_record(name, pid, seed)
                if rec is not None and not (rec.extra or {}).get("warmup"):
                    lat.append(rec.timings.generation_side_latency_s)
        mean = float(np.mean(lat)) if lat else None
        per[name] = {"pairs_used": n, "requests_saved": n_max - n, "mean_latency_s": mean,
                     "seconds_saved": None if mean is None else (n_max - n) * mean}
    fixed = n_max * len(rows)
    spent_requests = sum(v["pairs_used"] for v in per.values())
    saved_s = sum(v["seconds_saved"] or 0.0 for v in per.values())
    return {"fixed_requests": fixed, "requests": spent_requests, "requests_saved": fixed - spent_requests,
            "share_of_fixed": spent_requests / fixed, "device_seconds_saved": saved_s, "recipes": per,
            "describe": f"{spent_requests} of the fixed design's {fixed} quality requests "
                        f"({spent_requests / fixed:.0%}); {fixed - spent_requests} saved, about {saved_s:.1f} "
                        f"device-seconds at the recipes' mean generation latency"}


def sequential_command(*, echo, max_pairs: int, design: str, policy: str, floor, seeds: str, gate_device=None,
                       **ab_args) -> int:
    """``h3eval ab --sequential`` as the CLI calls it: runs (or resumes) the sequential run, echoes each look and the
    requests saved, and returns the verdict's exit code (0 PASS, 1 FAIL, 2 INCONCLUSIVE; 3 bad input)."""
    import json

    from h3eval.prompts import parse_seeds

    # A SequentialError (bad input) propagates: the CLI turns it into one line and exit 3.
    state = run_sequential(max_pairs=max_pairs, design=design, policy=policy, floor=floor,
                           seeds=parse_seeds(seeds), echo=echo,
                           gate_device=gate_device or ab_args.get("device") or "cpu", **ab_args)
    from pathlib import Path

    verdict = json.loads((Path(ab_args["out"]) / "verdict.json").read_text(encoding="utf-8"))
    for name, s in state["stopped"].items():
        echo(f"  {name}: {s['outcome']} at look {s['look']} ({s['n_pairs']} pairs)")
    echo(f"requests saved: {state['savings']['describe']}")
    return int(verdict["exit_code"])


def _design_seeds(seeds: list[int], last_pairs: int, n_prompts: int, max_pairs: int) -> list[int]:
    """The seeds the design's last look needs: the default ``--seeds 0`` grows to as many consecutive seeds, any
    other list must hold enough (SequentialError otherwise)."""
    need = math.ceil(last_pairs / n_prompts)
    if len(seeds) < need:
        if seeds == [0]:
            return list(range(need))
        raise SequentialError(f"--max-pairs {max_pairs} with {n_prompts} prompts needs {need} seeds; --seeds "
                              f"gives {len(seeds)} ({seeds})")
    return seeds[:need]


def _record_look(state: dict[str, Any], verdict, k: int, n_looks: int, n: int, look_seed_list: list[int],
                 active: list[str], confidence: float, the_design, alpha_ni: float, policy, say, identical) -> None:
    """Add look ``k``'s round to ``state``: each active candidate's outcome and stop decision, its metrics against
    the boundaries; a stopped candidate's verdict is kept as it stood at this look."""
    decidable = resolvable(the_design, k, alpha_ni, policy.n_resamples)
    entry: dict[str, Any] = {"look": k + 1, "n_pairs": n, "seeds": look_seed_list, "active": active,
                             "confidence": confidence, "resolvable": decidable, "candidates": {}}
    for c in verdict.candidates:
        if c.candidate not in active:
            continue  # a stopped rung kept in the run as a parent: judged at its own stop
        # a ladder's top is judged against its parent and against the baseline: byte-identical to both, or it waits
        same = identical(c.candidate, c.judged_against) and (c.against_baseline is None or identical(c.candidate, None))
        stop, why = stop_decision(c.outcome, k, n_looks, same, decidable)
        entry["candidates"][c.candidate] = {"outcome": c.outcome, "stopped": stop, "why": why,
                                            "metrics": metric_rows(c, the_design, k, alpha_ni, policy)}
        if stop:
            state["stopped"][c.candidate] = {"look": k + 1, "n_pairs": n, "outcome": c.outcome, "why": why}
            state["verdicts"][c.candidate] = c.model_dump(mode="json")
        say(f"  {c.candidate}: {c.outcome} -> {'stops' if stop else 'continues'} ({why})")
    state["rounds"].append(entry)
    state["last_verdict"] = verdict.model_dump(mode="json")


def _finish(state: dict[str, Any], state_path, store, last_verdict, names: list[str], design: str,
            pairs: list[int], say) -> None:
    """The record's end: the savings, and verdict.json holding each candidate's verdict at its stop."""
    from h3.atomic import atomic_write_json
    from h3eval.store import utc_now
    from h3eval.verdict import Verdict, write_verdict
    from h3eval.verdict.decide import combine
    from h3eval.verdict.schema import EXIT_CODES, CandidateVerdict

    shell = last_verdict or Verdict.model_validate(state["last_verdict"])
    cands = [CandidateVerdict.model_validate(state["verdicts"][c]) for c in names if c in state["verdicts"]]
    for c in cands:
        s = state["stopped"][c.candidate]
        c.warnings.insert(0, f"sequential ({design}): stopped at look {s['look']} of {len(pairs)} "
                             f"({s['n_pairs']} pairs): {s['why']}; its CIs are repeated confidence intervals at "
                             f"that look's level ({STATE_NAME})")
    shell.candidates = cands
    shell.outcome = combine([c.outcome for c in cands])
    shell.exit_code = EXIT_CODES[shell.outcome]
    shell.reasons = [f"{c.candidate}: {c.outcome}" for c in cands]
    state["savings"] = savings(store, state)
    shell.warnings.append(f"sequential signoff ({design}, looks {pairs}): {state['savings']['describe']}")
    write_verdict(shell, store.root)
    state["status"] = "complete"
    state["ended_at"] = utc_now()
    state.pop("last_verdict", None)
    atomic_write_json(state_path, state)
    say(f"{store.root}: {shell.outcome}; {state['savings']['describe']}")


def _byte_identical(store, candidate: str, against: str, prompt_ids, seeds) -> bool:
    """Whether every clip of ``candidate`` at these prompts and seeds is byte-identical to ``against``'s."""
    for pid in prompt_ids:
        for seed in seeds:
            a, b = store.clip_path(candidate, pid, seed), store.clip_path(against, pid, seed)
            if not (a.is_file() and b.is_file()) or a.read_bytes() != b.read_bytes():
                return False
    return True
