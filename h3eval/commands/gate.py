"""`h3eval gate`: run chosen gates over every (baseline, candidate) pair of a run; a rerun resumes.

Exit codes: 0 every pair scored; 1 at least one pair errored (its result file says why, the others are scored);
3 bad input before anything ran (not a run directory, unknown gate, bad option or device).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import List, Optional

import typer

EXIT_PAIR_ERRORS = 1
EXIT_INPUT_ERROR = 3


def gate_command(
    run_dir: Path,
    gates: str,
    device: str = "cpu",
    options: Optional[List[str]] = None,
    force: bool = False,
    progress: bool = True,
) -> int:
    """The command's work, callable from tests: returns the exit code and echoes a one-line-per-gate summary."""
    from gates.base import UnknownGateError
    from h3eval.gaterun import GateRunError, parse_options, run_gates

    names = [name.strip() for name in gates.split(",") if name.strip()]
    try:
        summary = run_gates(run_dir, names, device=device, options=parse_options(options or []), force=force,
                            progress=progress)
    except UnknownGateError as exc:
        typer.echo(f"error: {exc.args[0] if exc.args else exc}", err=True)
        return EXIT_INPUT_ERROR
    except GateRunError as exc:
        typer.echo(f"error: {exc}", err=True)
        return EXIT_INPUT_ERROR
    for name in summary.gates:
        errors = sum(1 for e in summary.errors if e["gate"] == name)
        typer.echo(
            f"{name}: {summary.pairs} pairs, {summary.scored[name]} computed, {summary.resumed[name]} resumed, "
            f"{summary.identical[name]} identical, {summary.flagged[name]} flagged, {errors} errors"
        )
    for error in summary.errors:
        typer.echo(
            f"error: {error['gate']} {error['candidate']}/{error['prompt_id']}-s{error['seed']}: {error['error']}",
            err=True,
        )
    return EXIT_PAIR_ERRORS if summary.failed else 0


def register(app: typer.Typer) -> None:
    @app.command("gate")
    def gate(
        run_dir: Path = typer.Argument(..., help="Run directory with a baseline and candidates."),
        gates: str = typer.Option(..., "--gates", envvar="H3EVAL_GATES", help="Gate names, comma-separated."),
        device: str = typer.Option("cpu", "--device", envvar="H3EVAL_DEVICE", help="cpu or cuda."),
        option: Optional[List[str]] = typer.Option(
            None, "--option", "-o", help="KEY=VALUE for every gate, or GATE.KEY=VALUE for one (repeatable)."
        ),
        force: bool = typer.Option(False, "--force", help="Recompute results that already exist."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar on stderr."),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """Run gates over every (baseline, candidate) pair; writes RUNDIR/gates/<gate>/<candidate>/*.json."""
        logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, stream=sys.stderr,
                            format="%(levelname)s %(name)s: %(message)s")
        raise typer.Exit(gate_command(run_dir, gates, device, option, force, progress))
