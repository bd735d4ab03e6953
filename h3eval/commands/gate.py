"""`h3eval gate`: run chosen gates over every (baseline, candidate) pair of a run; a rerun resumes.

``--gates NAME,...`` chooses the gates; ``--policy release`` (a shipped policy's name or a policy file) runs those
the policy needs for each candidate's judge, names the ones that cannot run here with what would make them run, and
leaves each gate's results to the candidates that need it (h3eval/gateplan.py).

Exit codes: 0 every pair scored; 1 at least one pair errored (its result file says why, the others are scored);
3 bad input before anything ran (not a run directory, unknown gate or policy, bad option or device).
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
    gates: str | None,
    device: str = "cpu",
    options: Optional[List[str]] = None,
    force: bool = False,
    progress: bool = True,
    policy: str | None = None,
) -> int:
    """The command's work, callable from tests: returns the exit code and echoes a one-line-per-gate summary."""
    from gates.base import UnknownGateError
    from h3eval.gaterun import GateRunError, GateRunSummary, check_options, parse_options, run_gates
    from h3eval.policy import PolicyError
    from h3eval.store import StoreError

    try:
        parsed = parse_options(options or [])
        if (gates is None) == (policy is None):
            raise GateRunError("choose the gates with --gates NAME,... or with --policy NAME|FILE (the gates the "
                               "policy's judges need), one of the two")
        if policy is not None:
            from gates.base import get_gate
            from h3eval.gateplan import group_options, next_after_gate, plan_gates

            plan = plan_gates(run_dir, policy, parsed)
            if plan.gates:  # an option no gate of the plan knows is refused before anything runs
                check_options([get_gate(g) for g in plan.gates], plan.options)
            for note in plan.notes:
                typer.echo(f"note: {note}")
            for blocked in plan.blocked:
                typer.echo(blocked.line())
            runs = [(gate_names, candidates, group_options(gate_names, plan.options))
                    for gate_names, candidates in plan.groups]
            pairing = plan.pairing  # each comparison with its judgement's gates only
            closing = next_after_gate(run_dir, policy, plan.loaded)
        else:
            pairing = None
            runs = [([name.strip() for name in gates.split(",") if name.strip()], None, parsed)]
            closing = f"next: h3eval verdict {run_dir} --policy release --write (or h3eval gate {run_dir} --policy " \
                      "release: the gates that policy needs)"
        summaries: list[tuple[GateRunSummary, list[str] | None]] = []
        for gate_names, candidates, group in runs:
            if candidates is not None:
                typer.echo(f"{', '.join(candidates)}: {', '.join(gate_names)}")
            summaries.append((run_gates(run_dir, gate_names, device=device, options=group, force=force,
                                        progress=progress, candidates=candidates, pairing_gates=pairing),
                              candidates))
    except UnknownGateError as exc:
        typer.echo(f"error: {exc.args[0] if exc.args else exc}", err=True)
        return EXIT_INPUT_ERROR
    except (GateRunError, PolicyError, StoreError) as exc:
        typer.echo(f"error: {exc}", err=True)
        return EXIT_INPUT_ERROR
    failed = False
    for summary, candidates in summaries:
        failed = failed or summary.failed
        for name in summary.gates:
            errors = sum(1 for e in summary.errors if e["gate"] == name)
            typer.echo(
                f"{name}: {summary.pairs} pairs, {summary.scored[name]} computed, {summary.resumed[name]} resumed, "
                f"{summary.identical[name]} identical, {summary.flagged[name]} flagged, {errors} errors"
                + (f", {summary.not_applicable[name]} not applicable" if summary.not_applicable.get(name) else "")
            )
            for reason in summary.not_applicable_reasons.get(name, []):
                typer.echo(f"  {name}: {reason} (recorded as not applicable, not as a failure)")
        if summary.seconds:
            typer.echo("gate seconds (computed results, summed over pairs): "
                       + ", ".join(f"{name} {sum(secs):.2f}" for name, secs in summary.seconds.items()))
        for error in summary.errors:
            typer.echo(
                f"error: {error['gate']} {error['candidate']}/{error['prompt_id']}-s{error['seed']}: {error['error']}",
                err=True,
            )
    typer.echo(closing)
    return EXIT_PAIR_ERRORS if failed else 0


def register(app: typer.Typer) -> None:
    @app.command("gate")
    def gate(
        run_dir: Path = typer.Argument(..., help="Run directory with a baseline and candidates."),
        gates: Optional[str] = typer.Option(None, "--gates", envvar="H3EVAL_GATES",
                                            help="Gate names, comma-separated (or --policy)."),
        policy: Optional[str] = typer.Option(
            None, "--policy", help="A shipped policy (release, quality, speed...) or a policy file: run the gates its "
                                   "judges need for each candidate, and say which cannot run here."),
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
        raise typer.Exit(gate_command(run_dir, gates, device, option, force, progress, policy))
