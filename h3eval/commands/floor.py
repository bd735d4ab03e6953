"""`h3eval floor`: measure the suite's own noise (determinism and the new-seed floor)."""

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
        gates: str = typer.Option(",".join(("fidelity", "audio", "ghosting")), "--gates"),
        option: list[str] = typer.Option([], "--option", "-o", help="Gate option k=v (e.g. fidelity.lpips_trunk=rand)."),
        seconds: Optional[float] = typer.Option(None, "--seconds"),
        num_frames: Optional[int] = typer.Option(None, "--num-frames"),
        height: Optional[int] = typer.Option(None, "--height"),
        width: Optional[int] = typer.Option(None, "--width"),
        device: Optional[str] = typer.Option(None, "--device", envvar="H3EVAL_DEVICE"),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """Same recipe and seed twice (must be identical) and different seeds (the scale of a new video)."""
        setup_logging(verbose)
        from h3.recipe import load_recipe
        from h3eval.floor import measure_floor, newseed_floor_from_run
        from h3eval.gaterun import parse_options
        from h3eval.prompts import load_prompts, parse_seeds
        from h3eval.runner import RequestShape, RunError

        gate_names = [g.strip() for g in gates.split(",") if g.strip()]
        if from_run is not None:
            if prompts is not None:
                raise RunError("--from-run takes the prompts and seeds of that run; leave out --prompts")
            out_run = newseed_floor_from_run(from_run, recipe, out, gates=gate_names, device=device or "cpu",
                                             gate_options=parse_options(option))
            for key, value in sorted(out_run["metrics"].items()):
                typer.echo(f"  new-seed floor {key} = {value:.6g} (n={out_run['counts'][key]})")
            typer.echo(f"wrote {Path(out) / 'floor.json'} (from the clips of {from_run}; no determinism check)")
            if out_run["gate_errors"]:
                raise typer.Exit(1)
            return
        if prompts is None:
            raise RunError("--prompts is needed (or --from-run RUN to take an existing run's clips)")
        result = measure_floor(
            model=model, recipe=load_recipe(recipe), prompts=load_prompts(prompts), seeds=parse_seeds(seeds), out=out,
            gates=gate_names,
            shape=RequestShape(seconds=seconds, num_frames=num_frames, height=height, width=width), device=device,
            gate_options=parse_options(option), args=dict(recipe=recipe, prompts=str(prompts), seeds=seeds),
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
        if det["identical"] is False:
            raise typer.Exit(1)
