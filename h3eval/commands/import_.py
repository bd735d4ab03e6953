"""`h3eval import`: bring clips made by another stack into a run, paired by name or by a manifest."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from h3eval.commands._common import handle_errors, setup_logging


def register(app: typer.Typer) -> None:
    @app.command("import")
    @handle_errors
    def import_(
        baseline_dir: str = typer.Option(..., "--baseline-dir", help="DIR or NAME=DIR of the baseline clips."),
        candidate_dir: List[str] = typer.Option(..., "--candidate-dir", help="DIR or NAME=DIR (repeatable)."),
        out: Path = typer.Option(..., "--out", envvar="H3EVAL_OUT", help="Run directory (created or resumed)."),
        manifest: Optional[Path] = typer.Option(None, "--manifest", help="JSONL pairing clips (see docs)."),
        prompts: Optional[str] = typer.Option(None, "--prompts", envvar="H3EVAL_PROMPTS",
                                              help="Prompt suite the clips were made from (text, keyframes, "
                                                   "reference images)."),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """Import <prompt_id>-s<seed>.mp4 clips of a baseline and candidates into RUNDIR."""
        setup_logging(verbose)
        run = run_import(baseline_dir=baseline_dir, candidate_dirs=candidate_dir, out=out, manifest=manifest,
                         prompts=prompts)
        typer.echo(f"{out}: {run.status}, {len(run.errors)} clip(s) not imported")
        for err in run.errors:
            typer.echo(f"  {err.recipe}/{err.prompt_id}-s{err.seed}: {err.error}", err=True)
        if run.status != "complete":
            raise typer.Exit(1)


def run_import(*, baseline_dir, candidate_dirs, out, manifest=None, prompts=None):
    from h3eval.backends.folder import import_folders
    from h3eval.prompts import load_prompts

    suite = load_prompts(prompts) if prompts else None
    return import_folders(baseline_dir, list(candidate_dirs), Path(out), Path(manifest) if manifest else None, suite)
