"""`h3eval generate`: fill a run with one recipe's clips over a prompt suite and seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from h3eval.commands._common import handle_errors, setup_logging


def register(app: typer.Typer) -> None:
    @app.command("generate")
    @handle_errors
    def generate(
        recipe: str = typer.Option(..., "--recipe", envvar="H3EVAL_RECIPE", help="Recipe name or TOML path."),
        prompts: str = typer.Option(..., "--prompts", envvar="H3EVAL_PROMPTS", help="Prompt suite name or JSONL."),
        out: Path = typer.Option(..., "--out", envvar="H3EVAL_OUT", help="Run directory (created or resumed)."),
        model: str = typer.Option(
            "tiny", "--model", envvar="H3EVAL_MODEL",
            help="'tiny' (the trained tiny preset; also 'tiny-trained'), 'tiny-random' (the tiny preset with random "
                 "weights), 'h3-random' (released size, random weights), 'h3-random-small' or a checkpoint dir."),
        seeds: str = typer.Option("0", "--seeds", envvar="H3EVAL_SEEDS", help="Seeds, e.g. 0,1 or 0-3."),
        seconds: Optional[float] = typer.Option(None, "--seconds", help="Duration (snapped to 17n+5 frames)."),
        num_frames: Optional[int] = typer.Option(None, "--num-frames", help="Frame count (snapped to 17n+5)."),
        height: Optional[int] = typer.Option(None, "--height", help="Height, a multiple of 32."),
        width: Optional[int] = typer.Option(None, "--width", help="Width, a multiple of 32."),
        device: Optional[str] = typer.Option(None, "--device", envvar="H3EVAL_DEVICE", help="cpu or cuda."),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """Generate every (prompt, seed) clip of one recipe into RUNDIR; a rerun resumes."""
        setup_logging(verbose)
        manifest = run_generate(recipe=recipe, prompts=prompts, out=out, model=model, seeds=seeds,
                                seconds=seconds, num_frames=num_frames, height=height, width=width, device=device)
        typer.echo(f"{out}: {manifest.status}, {len(manifest.errors)} failed clip(s)")
        if manifest.status != "complete":
            for err in manifest.errors:
                typer.echo(f"  {err.recipe}/{err.prompt_id}-s{err.seed}: {err.error}", err=True)
            raise typer.Exit(1)


def run_generate(*, recipe, prompts, out, model="tiny", seeds="0", seconds=None, num_frames=None, height=None,
                 width=None, device=None, progress=True):
    from h3.recipe import load_recipe
    from h3eval.prompts import load_prompts, parse_seeds
    from h3eval.runner import RequestShape, RunPlan, fill_run

    plan = RunPlan(
        out=Path(out), model=model, recipes=[load_recipe(recipe)], prompts=load_prompts(prompts),
        seeds=parse_seeds(seeds), shape=RequestShape(seconds=seconds, num_frames=num_frames, height=height,
                                                     width=width),
        device=device,
        args=dict(command="generate", recipe=recipe, prompts=str(prompts), model=model, seeds=seeds,
                  seconds=seconds, num_frames=num_frames, height=height, width=width, device=device),
    )
    return fill_run(plan, progress=progress)
