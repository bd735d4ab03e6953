"""``h3eval vbench setup|pin|verify``: the pinned VBench scoring environment, its pins, and their check.

Scoring itself is ``h3eval gate RUNDIR --gates vbench [--dimensions ...]`` (gates/vbench/).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

import typer

from gates.vbench.dimensions import DIMENSIONS, UnknownDimensionError, resolve_dimensions
from gates.vbench.env import VBenchEnvError, default_env_path, setup_env
from gates.vbench.pins import CHECKPOINT_PINS_PATH, VBenchPinError, pin_checkpoints, verify

logger = logging.getLogger(__name__)

_ENV_HELP = "Scoring environment folder [env: H3EVAL_VBENCH_ENV; default ~/.cache/h3eval/vbench-env]"
_DIM_HELP = f"Dimensions, comma-separated or repeated (default: all of {', '.join(DIMENSIONS)})"
_CACHE_HELP = "VBench cache folder with the checkpoints [env: VBENCH_CACHE_DIR; default ~/.cache/vbench]"


def _fail(message: str, code: int = 1) -> None:
    """Exit 1 for a failed check or build; 3 for bad input (an unknown dimension, a missing checkpoint to pin)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=code)


def _code(exc: Exception) -> int:
    return 3 if isinstance(exc, (UnknownDimensionError, VBenchPinError)) else 1


def run_setup(env: Path | None, dimensions: list[str] | None, force: bool) -> dict:
    return setup_env(env or default_env_path(), dimensions, force=force)


def run_fetch(dimensions: list[str] | None, cache_dir: Path | None, pins: Path = CHECKPOINT_PINS_PATH,
              show_progress: bool = True) -> dict:
    """Download the checkpoints ``dimensions`` need (gates.vbench.fetch) with a progress bar on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from gates.vbench.fetch import fetch_checkpoints

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  console=Console(stderr=True), disable=not show_progress) as bar:
        tasks: dict[str, int] = {}

        def progress(name: str, done: int, total: int | None) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(name, total=total)
            bar.update(tasks[name], completed=done, total=total)

        return fetch_checkpoints(dimensions, cache_dir, pins, progress=progress).to_dict()


def run_verify(env: Path | None, dimensions: list[str] | None, cache_dir: Path | None) -> dict:
    dims = resolve_dimensions(dimensions)
    report = verify(env or default_env_path(), dims, cache_dir)
    return {"ok": report.ok, "dimensions": dims, "problems": report.problems, "provenance": report.provenance()}


def register(app: typer.Typer) -> None:
    vbench_app = typer.Typer(help="Pinned VBench scoring: build its environment, pin checkpoints, verify pins.",
                             no_args_is_help=True)

    @vbench_app.command("setup")
    def setup_cmd(
        env: Optional[Path] = typer.Option(None, "--env", envvar="H3EVAL_VBENCH_ENV", help=_ENV_HELP),
        dimensions: Optional[list[str]] = typer.Option(None, "--dimensions", "-d", help=_DIM_HELP),
        force: bool = typer.Option(False, "--force", help="Rebuild from scratch even if the environment looks fine"),
        fetch_checkpoints: bool = typer.Option(
            False, "--fetch-checkpoints",
            help="Also download every checkpoint the dimensions need from its official location (resumable), "
                 "verify it against gates/vbench/vbench-checkpoints.json or pin it on first download"),
        cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", envvar="VBENCH_CACHE_DIR", help=_CACHE_HELP),
    ) -> None:
        """Build the isolated VBench environment from the committed locks (gates/vbench/vbench-requirements*.lock)."""
        from gates.vbench.fetch import FetchError

        try:
            marker = run_setup(env, dimensions, force)
            if fetch_checkpoints:
                marker = {**marker, "checkpoints": run_fetch(dimensions, cache_dir)}
        except (VBenchEnvError, UnknownDimensionError, FetchError, VBenchPinError) as exc:
            _fail(str(exc), _code(exc))
        typer.echo(json.dumps(marker, indent=2))
        if fetch_checkpoints and marker["checkpoints"]["pinned_now"]:
            typer.echo(f"pinned on first download (trust on first use): {', '.join(marker['checkpoints']['pinned_now'])}"
                       f"; commit {CHECKPOINT_PINS_PATH}", err=True)

    @vbench_app.command("pin")
    def pin_cmd(
        cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", envvar="VBENCH_CACHE_DIR", help=_CACHE_HELP),
        dimensions: Optional[list[str]] = typer.Option(None, "--dimensions", "-d", help=_DIM_HELP),
        out: Path = typer.Option(CHECKPOINT_PINS_PATH, "--out", help="Checkpoint pins file to write (commit it)"),
    ) -> None:
        """Hash the checkpoints in the VBench cache folder into the pins file. Run once, on a trusted machine."""
        try:
            data = pin_checkpoints(cache_dir, dimensions, out)
        except (VBenchPinError, UnknownDimensionError) as exc:
            _fail(str(exc), _code(exc))
        typer.echo(f"pinned {len(data['checkpoints'])} checkpoint file(s) into {out}; commit it")

    @vbench_app.command("verify")
    def verify_cmd(
        env: Optional[Path] = typer.Option(None, "--env", envvar="H3EVAL_VBENCH_ENV", help=_ENV_HELP),
        dimensions: Optional[list[str]] = typer.Option(None, "--dimensions", "-d", help=_DIM_HELP),
        cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", envvar="VBENCH_CACHE_DIR", help=_CACHE_HELP),
    ) -> None:
        """Check the environment, every pinned scorer file and checkpoint; exit 1 naming each problem."""
        try:
            result = run_verify(env, dimensions, cache_dir)
        except UnknownDimensionError as exc:
            _fail(str(exc), 3)
        if not result["ok"]:
            _fail("VBench verification failed:\n  - " + "\n  - ".join(result["problems"]))
        typer.echo(f"ok: {result['provenance']['checked_files']} pinned file(s) verified for "
                   f"{', '.join(result['dimensions'])}")

    app.add_typer(vbench_app, name="vbench")
