"""`h3eval verdict RUNDIR --policy FILE`: PASS / FAIL / INCONCLUSIVE per gate, candidate and overall.

Exit codes: 0 PASS, 1 FAIL, 2 INCONCLUSIVE, 3 usage or input error. Click reports its own usage errors with exit
code 2, which would read as INCONCLUSIVE; so these commands use :class:`UsageExit3Command`, and check their
arguments themselves, so that every usage error exits 3.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperCommand

try:  # typer 0.29 carries its own copy of click; its usage errors are that copy's class
    from typer._click.exceptions import UsageError as _UsageError
except ImportError:  # pragma: no cover - older typer on the click package
    from click.exceptions import UsageError as _UsageError

from h3eval.policy import PolicyError
from h3eval.store import StoreError
from h3eval.verdict import EXIT_USAGE, VerdictInputError, run_verdict, summary_lines

logger = logging.getLogger(__name__)


INPUT_ERRORS = (PolicyError, VerdictInputError, StoreError, OSError)


def usage_error(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(EXIT_USAGE)


class UsageExit3Command(TyperCommand):
    """A typer command whose click-level usage errors (an option without its value...) exit 3, not click's 2."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except _UsageError as exc:
            exc.exit_code = EXIT_USAGE
            raise


def register(app: typer.Typer) -> None:
    @app.command(
        "verdict",
        cls=UsageExit3Command,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        help="Judge a run under a signoff policy. Exit 0 PASS, 1 FAIL, 2 INCONCLUSIVE, 3 usage/input error.",
    )
    def verdict_command(
        ctx: typer.Context,
        run_dir: Optional[Path] = typer.Argument(None, help="The run directory (with run.json)."),
        policy: Optional[Path] = typer.Option(None, "--policy", envvar="H3EVAL_POLICY", help="Policy TOML file."),
        floor: Optional[Path] = typer.Option(
            None, "--floor", envvar="H3EVAL_FLOOR", help="Noise-floor JSON (overrides the policy's floor_file)."
        ),
        write: bool = typer.Option(False, "--write", help="Also write RUNDIR/verdict.json."),
        as_json: bool = typer.Option(False, "--json", help="Print the verdict as JSON instead of a summary."),
    ) -> None:
        if ctx.args:
            raise usage_error(f"unexpected arguments: {' '.join(ctx.args)}")
        if run_dir is None or policy is None:
            raise usage_error("usage: h3eval verdict RUNDIR --policy FILE [--floor FILE] [--write] [--json]")
        try:
            verdict = run_verdict(run_dir, policy, floor=floor, write=write)
        except INPUT_ERRORS as exc:
            raise usage_error(str(exc)) from None
        if as_json:
            typer.echo(json.dumps(verdict.dump(), indent=2))
        else:
            typer.echo("\n".join(summary_lines(verdict)))
        raise typer.Exit(verdict.exit_code)
