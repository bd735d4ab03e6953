"""`h3eval parallel-check`: a recipe at degree N against the same recipe on one process, same seeds, within the
single-process same-seed noise floor (h3eval/parallel_check.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from h3eval.commands._common import fail, handle_errors, setup_logging


def register(app: typer.Typer) -> None:
    @app.command("parallel-check")
    @handle_errors
    def parallel_check(
        recipe: str = typer.Option(..., "--recipe", envvar="H3EVAL_RECIPE", help="Recipe name or TOML path."),
        nproc: int = typer.Option(2, "--nproc", help="Parallel degree of the checked side (ranks started here)."),
        prompts: str = typer.Option(..., "--prompts", envvar="H3EVAL_PROMPTS", help="Prompt suite name or JSONL."),
        out: Path = typer.Option(..., "--out", envvar="H3EVAL_OUT", help="Run directory (created or resumed)."),
        model: str = typer.Option("tiny", "--model", envvar="H3EVAL_MODEL",
                                 help="'tiny' (the trained tiny preset; also 'tiny-trained'), 'tiny-random' (random "
                                      "weights), 'h3-random', 'h3-random-small' or a checkpoint dir."),
        seeds: str = typer.Option("0", "--seeds", envvar="H3EVAL_SEEDS"),
        option: list[str] = typer.Option([], "--option", "-o",
                                         help="Gate option k=v (e.g. fidelity.lpips_trunk=rand)."),
        plant: Optional[str] = typer.Option(None, "--plant", help="A planted parallel bug the check must fail "
                                                                   "(a2a_permutation, rope_offset)."),
        factor: float = typer.Option(2.0, "--factor", help="Allowed multiple of the noise floor."),
        seconds: Optional[float] = typer.Option(None, "--seconds"),
        num_frames: Optional[int] = typer.Option(None, "--num-frames"),
        height: Optional[int] = typer.Option(None, "--height"),
        width: Optional[int] = typer.Option(None, "--width"),
        device: Optional[str] = typer.Option(None, "--device", envvar="H3EVAL_DEVICE"),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """Exit 0 on PASS, 1 on FAIL, 3 on bad input."""
        setup_logging(verbose)
        from h3.parallel.plants import PLANTS
        from h3.recipe import load_recipe
        from h3eval.gaterun import parse_options
        from h3eval.parallel_check import ParallelCheckPlan, run_parallel_check
        from h3eval.prompts import load_prompts, parse_seeds
        from h3eval.runner import RequestShape

        if nproc < 2:
            raise fail(f"--nproc must be 2 or more, got {nproc}")
        if plant is not None and plant not in PLANTS:
            raise fail(f"--plant {plant!r} is not a planted bug; one of {', '.join(PLANTS)}")
        if not factor > 0:
            raise fail(f"--factor must be positive, got {factor}")
        result = run_parallel_check(ParallelCheckPlan(
            model=model, recipe=load_recipe(recipe), degree=nproc, prompts=load_prompts(prompts),
            seeds=parse_seeds(seeds), out=out,
            shape=RequestShape(seconds=seconds, num_frames=num_frames, height=height, width=width), device=device,
            gate_options=parse_options(option), plant=plant, factor=factor))
        for pair in result["pairs"]:
            state = "pass" if pair["pass"] else "FAIL"
            typer.echo(f"{pair['prompt_id']}-s{pair['seed']}: {state}" + (
                "" if pair["pass"] else " (" + "; ".join(pair["reasons"]) + ")"))
        worst = ", ".join(f"{k} {v:.3g}x" for k, v in sorted(result["worst_ratio"].items()))
        typer.echo(f"{result['verdict']}: {result['recipe']} at degree {nproc} against degree 1 "
                   f"(worst ratio to the floor: {worst or 'none'}); wrote {Path(out) / 'parallel_check.json'}")
        if result["verdict"] != "PASS":
            raise typer.Exit(1)
