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
        policy: Optional[str] = typer.Option(None, "--policy", envvar="H3EVAL_POLICY",
                                             help="Policy TOML file or a shipped policy's name (release...)."),
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
            policy_file = policy_path(policy)
            ungated = not_gated(run_dir, policy_file)
            if ungated:
                raise usage_error(f"{run_dir} has no results of the gates policy {policy} needs ({ungated}): run "
                                  f"`h3eval gate {run_dir} --policy {policy}` first (nothing was judged)")
            verdict = run_verdict(run_dir, policy_file, floor=floor, write=write)
        except INPUT_ERRORS as exc:
            raise usage_error(str(exc)) from None
        if as_json:
            typer.echo(json.dumps(verdict.dump(), indent=2))
        else:
            typer.echo("\n".join(summary_lines(verdict)))
            typer.echo("\n".join(next_lines(verdict, run_dir, policy)))
        raise typer.Exit(verdict.exit_code)


def policy_path(policy: str) -> Path:
    """A policy file, or a shipped policy by name (``release``)."""
    from h3eval.gateplan import policy_path as resolve

    return resolve(policy)


def not_gated(run_dir: Path, policy_file: Path) -> str | None:
    """The policy's gates, comma-separated, when the run has results of none of them (``gate`` was not run yet);
    else None."""
    from h3eval.policy import load_policy
    from h3eval.store import RunStore

    store = RunStore(run_dir)
    try:
        store.read_manifest()
    except StoreError:
        return None  # not a readable run: the verdict names what is wrong with it
    needed = list(load_policy(policy_file).policy.all_gates())
    present = set(store.gates_present())
    return ", ".join(needed) if needed and not present & set(needed) else None


def next_lines(verdict, run_dir: Path, policy: str) -> list[str]:
    """What to run next: the gates still without results (and, for those that cannot run here, what would make them
    run), else the dashboard."""
    from h3eval.gateplan import blocker

    missing: dict[str, list[str]] = {}
    for candidate in verdict.candidates:
        for gv in candidate.gates:
            if gv.required and gv.n_results == 0:
                missing.setdefault(gv.gate, []).append(candidate.candidate)
    if not missing:
        return [f"next: h3eval dashboard {run_dir}"]
    lines = [f"next: h3eval gate {run_dir} --policy {policy} (no results yet: "
             + "; ".join(f"{gate} for {', '.join(cands)}" for gate, cands in missing.items()) + ")"]
    for gate in missing:
        blocked = blocker(gate, options={}, dims=_dims(policy))
        if blocked is not None:
            lines.append(f"  {blocked.line()}")
    return lines


def _dims(policy: str) -> list[str]:
    from h3eval.gateplan import load_named_policy, vbench_dimensions

    return vbench_dimensions(load_named_policy(policy).policy)
