"""`h3eval floor`: measure the suite's own noise (determinism and the new-seed floor).

Its gates come from a signoff policy (``--policy``, default ``release``): those whose thresholds, for the signoff
kinds of the run's candidates (every judge's, for a floor generated from a recipe), are stated against the floor, less
those that cannot run here (named, with what would make them run: h3eval/gateplan.py). ``--gates`` chooses them by
hand instead."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from h3eval.commands._common import handle_errors, setup_logging


def register(app: typer.Typer) -> None:
    @app.command("floor")
    @handle_errors
    def floor(
        recipe: str = typer.Option(..., "--recipe", envvar="H3EVAL_RECIPE", help="Recipe name or TOML path."),
        prompts: Optional[str] = typer.Option(None, "--prompts", envvar="H3EVAL_PROMPTS",
                                              help="Prompt suite name or JSONL (not with --from-run)."),
        from_run: Optional[Path] = typer.Option(
            None, "--from-run",
            help="Take the recipe's clips at two seeds or more from this run (e.g. the baseline of an `h3eval ab` "
                 "run): the new-seed floor without generating anything; no determinism check."),
        out: Path = typer.Option(..., "--out", envvar="H3EVAL_OUT", help="Run directory (created or resumed)."),
        model: str = typer.Option("tiny", "--model", envvar="H3EVAL_MODEL",
                                 help="'tiny' (the trained tiny preset; also 'tiny-trained'), 'tiny-random' (random "
                                      "weights), 'h3-random', 'h3-random-small' or a checkpoint dir."),
        seeds: str = typer.Option("0,1", "--seeds", envvar="H3EVAL_SEEDS", help="At least two seeds."),
        gates: Optional[str] = typer.Option(None, "--gates", help="Gate names, comma-separated (instead of the "
                                                                 "policy's floor gates)."),
        policy: Optional[str] = typer.Option(None, "--policy", envvar="H3EVAL_POLICY",
                                             help="Measure the gates this policy states against the floor (a shipped "
                                                  "name or a file; default release)."),
        option: list[str] = typer.Option([], "--option", "-o",
                                         help="Gate option k=v (e.g. fidelity.lpips_trunk=rand)."),
        seconds: Optional[float] = typer.Option(None, "--seconds"),
        num_frames: Optional[int] = typer.Option(None, "--num-frames"),
        height: Optional[int] = typer.Option(None, "--height"),
        width: Optional[int] = typer.Option(None, "--width"),
        device: Optional[str] = typer.Option(None, "--device", envvar="H3EVAL_DEVICE"),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """Same recipe and seed twice (must be identical) and different seeds (the scale of a new video)."""
        setup_logging(verbose)
        from h3eval.runner import RunError

        if from_run is not None and prompts is not None:
            raise RunError("--from-run takes the prompts and seeds of that run; leave out --prompts")
        if from_run is None and prompts is None:
            raise RunError("--prompts is needed (or --from-run RUN to take an existing run's clips)")
        if gates is not None and policy is not None:
            raise RunError("choose the floor's gates with --gates or with --policy, not both")
        from h3eval.store import RunStore

        with RunStore(out).lock("h3eval floor"):  # refused before anything is said or measured
            _floor(recipe=recipe, prompts=prompts, from_run=from_run, out=out, model=model, seeds=seeds,
                   gates=gates, policy=policy, option=option, seconds=seconds, num_frames=num_frames,
                   height=height, width=width, device=device)


def _floor(*, recipe, prompts, from_run, out, model, seeds, gates, policy, option, seconds, num_frames, height,
           width, device) -> None:
    from h3.recipe import load_recipe
    from h3eval.floor import measure_floor, newseed_floor_from_run
    from h3eval.gaterun import parse_options
    from h3eval.prompts import load_prompts, parse_seeds
    from h3eval.runner import RequestShape

    policy_arg = policy or "release"
    gate_options = parse_options(option)
    if gates is not None:
        gate_names = [g.strip() for g in gates.split(",") if g.strip()]
    else:
        gate_names = policy_floor_gates(policy_arg, from_run, gate_options)
    verdict_run = from_run if from_run is not None else "RUN"
    closing = (f"next: h3eval verdict {verdict_run} --policy {policy_arg} --floor {Path(out) / 'floor.json'} "
               "--write")
    if from_run is not None:
        out_run = newseed_floor_from_run(from_run, recipe, out, gates=gate_names, device=device or "cpu",
                                         gate_options=gate_options)
        for key, value in sorted(out_run["metrics"].items()):
            typer.echo(f"  new-seed floor {key} = {value:.6g} (n={out_run['counts'][key]})")
        typer.echo(f"wrote {Path(out) / 'floor.json'} (from the clips of {from_run}; no determinism check)")
        typer.echo(closing)
        if out_run["gate_errors"]:
            raise typer.Exit(1)
        return
    result = measure_floor(
        model=model, recipe=load_recipe(recipe), prompts=load_prompts(prompts), seeds=parse_seeds(seeds), out=out,
        gates=gate_names,
        shape=RequestShape(seconds=seconds, num_frames=num_frames, height=height, width=width), device=device,
        gate_options=gate_options, args=dict(recipe=recipe, prompts=str(prompts), seeds=seeds),
    )
    det = result["determinism"]
    state = {True: "identical", False: "BROKEN", None: "not checked"}[det["identical"]]
    typer.echo(f"determinism: {state} over {det['pairs']} repeat pair(s) ({det['compared']})"
               + (f"; differing: {', '.join(det['mismatches'])}" if det["mismatches"] else "")
               + (f"; not comparable: {len(det['not_comparable'])} pair(s) made on another platform"
                  if det["not_comparable"] else ""))
    for key, value in sorted(result["metrics"].items()):
        typer.echo(f"  new-seed floor {key} = {value:.6g} (n={result['counts'][key]})")
    typer.echo(f"wrote {Path(out) / 'floor.json'}")
    typer.echo(closing)
    if det["identical"] is False:
        raise typer.Exit(1)


def policy_floor_gates(policy: str, from_run: Path | None, options: dict) -> list[str]:
    """The floor's gates from ``policy`` (echoing which it leaves out and why); RunError when none can run here.
    ``options`` gains the VBench dimensions the policy names when VBench runs and none were given."""
    from h3eval.gateplan import blocker, floor_kinds, has_trajectories, imported, load_named_policy, vbench_dimensions
    from h3eval.runner import RunError
    from h3eval.store import RunStore

    loaded = load_named_policy(policy)
    manifest = store = None
    if from_run is not None:
        store = RunStore(from_run)
        manifest = store.read_manifest()
    kinds, note = floor_kinds(loaded.policy, manifest)
    if note:
        typer.echo(f"note: {note}")
    wanted = loaded.policy.floor_gates(kinds)
    trajectories = bool(manifest and store and has_trajectories(store, manifest, list(manifest.recipes)))
    dims = vbench_dimensions(loaded.policy)
    runnable = []
    is_imported = manifest is not None and imported(manifest)
    for gate in wanted:
        blocked = blocker(gate, options=options, dims=dims, trajectories=trajectories, is_imported=is_imported)
        if blocked is None and gate == "trajectory" and is_imported:
            typer.echo(f"{gate}: cannot apply to imported clips (no latent trajectories): its floor is not measured")
            continue
        if blocked is not None:
            typer.echo(blocked.line())
            continue
        runnable.append(gate)
    if "vbench" in runnable and "vbench.dimensions" not in options and "dimensions" not in options:
        options["vbench.dimensions"] = ",".join(dims)
    if not runnable:
        raise RunError(f"none of the gates policy {loaded.policy.name!r} states against the floor "
                       f"({', '.join(wanted) or 'none'}) can run here; see the lines above")
    typer.echo(f"floor gates from policy {loaded.policy.name!r} ({', '.join(k or 'no kind' for k in kinds)}): "
               f"{', '.join(runnable)}")
    return runnable
