"""`h3eval report RUNDIR`: write verdict.json, report.md, report.html and junit.xml into the run directory.

With ``--policy`` the verdict is computed afresh; without it the run's existing ``verdict.json`` is rendered.
Exits with the verdict's code (0 PASS, 1 FAIL, 2 INCONCLUSIVE) so one CI step both reports and gates, unless
``--exit-zero``; 3 is a usage or input error.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

from h3eval.commands.verdict import INPUT_ERRORS, UsageExit3Command, not_gated, policy_path, usage_error
from h3eval.report import run_report

logger = logging.getLogger(__name__)


def register(app: typer.Typer) -> None:
    @app.command(
        "report",
        cls=UsageExit3Command,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        help="Write verdict.json, report.md, report.html and junit.xml for a run; exits with the verdict's code.",
    )
    def report_command(
        ctx: typer.Context,
        run_dir: Optional[Path] = typer.Argument(None, help="The run directory (with run.json)."),
        policy: Optional[str] = typer.Option(None, "--policy", envvar="H3EVAL_POLICY",
                                             help="Policy TOML file or a shipped policy's name (release...)."),
        floor: Optional[Path] = typer.Option(None, "--floor", envvar="H3EVAL_FLOOR", help="Noise-floor JSON."),
        exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 whatever the verdict, once written."),
    ) -> None:
        if ctx.args:
            raise usage_error(f"unexpected arguments: {' '.join(ctx.args)}")
        if run_dir is None:
            raise usage_error("usage: h3eval report RUNDIR [--policy FILE] [--floor FILE] [--exit-zero]")
        try:
            policy_file = policy_path(policy) if policy is not None else None
            ungated = not_gated(run_dir, policy_file) if policy_file is not None else None
            if ungated:
                raise usage_error(f"{run_dir} has no results of the gates policy {policy} needs ({ungated}): run "
                                  f"`h3eval gate {run_dir} --policy {policy}` first (nothing was judged)")
            verdict, paths = run_report(run_dir, policy_file, floor=floor)
        except INPUT_ERRORS as exc:
            raise usage_error(str(exc)) from None
        typer.echo(f"{verdict.outcome}: " + ", ".join(str(p) for p in paths.values()))
        typer.echo(f"next: h3eval dashboard {run_dir}")
        raise typer.Exit(0 if exit_zero else verdict.exit_code)
