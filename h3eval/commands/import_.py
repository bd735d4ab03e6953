"""`h3eval import`: bring clips made by another stack into a run, paired by name or by a manifest, with each
candidate's signoff kind, parent and timings declared (h3eval/backends/folder.py says how)."""

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
        kind: List[str] = typer.Option([], "--kind", help="NAME=exact|near|resample: the candidate's signoff kind "
                                                          "(the verdict's judge; repeatable)."),
        parent: List[str] = typer.Option([], "--parent", help="NAME=PARENT: the recipe the candidate is judged "
                                                              "against by lineage (repeatable)."),
        timings: List[str] = typer.Option([], "--timings", help="NAME=FILE: a JSON timing file {\"<prompt_id>-s<seed>\""
                                                                ": seconds} for that side (repeatable)."),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """Import <prompt_id>-s<seed>.mp4 clips of a baseline and candidates into RUNDIR."""
        setup_logging(verbose)
        run = run_import(baseline_dir=baseline_dir, candidate_dirs=candidate_dir, out=out, manifest=manifest,
                         prompts=prompts, kinds=kind, parents=parent, timings=timings)
        typer.echo(f"{out}: {run.status}, {len(run.errors)} clip(s) not imported")
        for err in run.errors:
            typer.echo(f"  {err.recipe}/{err.prompt_id}-s{err.seed}: {err.error}", err=True)
        for line in declaration_lines(run, out):
            typer.echo(line)
        typer.echo(f"next: h3eval gate {out} --policy release")
        if run.status != "complete":
            raise typer.Exit(1)


def declaration_lines(run, out) -> list[str]:
    """One line per candidate: its signoff kind and parent as the run holds them, and whether its clips are timed."""
    from h3eval.store import RunStore

    store = RunStore(out)
    lines = []
    for name in [run.baseline, *run.candidates]:
        recipe = run.recipes.get(name) or {}
        kind = (recipe.get("signoff") or {}).get("kind")
        records = [r for r in (store.read_record(name, p, s) for p in run.prompts.ids for s in run.seeds)
                   if r is not None]
        timed = sum("timings.generation_side_latency_s" not in r.extra.get("unreported", []) for r in records)
        what = [] if name == run.baseline else [f"kind {kind}" if kind else
                                                f"no signoff kind (declare it: --kind {name}=exact|near|resample)"]
        if recipe.get("parent"):
            what.append(f"parent {recipe['parent']}")
        what.append(f"{timed} of {len(records)} clip(s) timed" if timed else "no timing data (speed not judged; give "
                    f"--timings {name}=FILE or latencies in the manifest)")
        lines.append(f"  {name}{' (baseline)' if name == run.baseline else ''}: " + ", ".join(what))
    return lines


def run_import(*, baseline_dir, candidate_dirs, out, manifest=None, prompts=None, kinds=None, parents=None,
               timings=None):
    from h3eval.backends.folder import import_folders
    from h3eval.prompts import load_prompts

    suite = load_prompts(prompts) if prompts else None
    return import_folders(baseline_dir, list(candidate_dirs), Path(out), Path(manifest) if manifest else None, suite,
                          kinds=kinds, parents=parents, timings=timings)
