"""`h3eval demo`: the main job on the embedded trained tiny preset (README's first command)."""

from __future__ import annotations

from pathlib import Path

import typer

from h3eval.commands._common import handle_errors, setup_logging


def register(app: typer.Typer) -> None:
    @app.command("demo")
    @handle_errors
    def demo(
        out: Path = typer.Option(Path("demo-run"), "--out", envvar="H3EVAL_DEMO_OUT", help="Where the demo writes."),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """The trained tiny preset: a three-rung ladder (baseline -> turbo4-tiny -> +sparse) and an identical
        candidate, signed off sequentially (floor, then gates and verdict after each look), report."""
        setup_logging(verbose)
        from h3eval.commands._common import fail
        from h3eval.demo import (DEMO_INTENDED, DEMO_RECIPES, DemoError, intended_note, lpips_note, lpips_trunk,
                                 policy_note, run_demo)

        # Said before the minutes of work, not only after them: what judges the demo, and a metric's fallback.
        typer.echo(f"h3eval demo: {policy_note()}", err=True)
        if lpips_trunk() != "alexnet":
            typer.echo(f"note: {lpips_note()}", err=True)
        try:
            result = run_demo(out, echo=lambda line: typer.echo(line, err=True))
        except DemoError as exc:
            raise fail(str(exc), code=1) from None
        typer.echo("")
        typer.echo(f"h3eval demo finished in {result.seconds:.0f} s: {len(DEMO_RECIPES)} recipes x {result.prompts} "
                   f"world prompts x up to {len(result.seeds)} seeds on the trained tiny preset (model "
                   f"{result.model}: coloured shapes moving as their captions say, each with its tone and a click at "
                   "every bounce)")
        same, compared = result.determinism
        typer.echo(f"  baseline: {same} of {compared} clips byte-identical in the floor's run and the signoff run "
                   "(the same request made twice)")
        typer.echo(f"  numerics: {result.numerics}" + ("" if result.numerics == "portable" else
                   " (this CPU's own kernels; H3_PORTABLE_NUMERICS=1 makes the floats the same on any x86-64 CPU with "
                   "AVX2, at about 1.4x the CPU time)"))
        for cand, identical in result.identical.items():
            typer.echo(f"  {cand}: " + ("byte-identical to baseline on every pair it made" if identical else
                                        "differs from baseline"))
        if result.content:
            typer.echo("  what the clips show, read by the world's detector against each caption (clips right / "
                       "scored):")
            for recipe in DEMO_RECIPES:
                aspects = result.content.get(recipe)
                if aspects:
                    typer.echo(f"    {recipe:<18} " + ", ".join(f"{a} {r}/{n}" for a, (r, n) in aspects.items()))
        if result.lpips_trunk != "alexnet":
            typer.echo(f"  note: {lpips_note()}")
        if result.gate_errors:
            typer.echo(f"  gate errors: {len(result.gate_errors)} (see the per-pair results)")
        typer.echo("")
        typer.echo(policy_note(result.policy))
        for line in result.lines:
            # The verdict's reasons can list every pair; the report has them all, the terminal gets the gist.
            typer.echo(line if len(line) <= 240 else line[:237] + "...")
        typer.echo("")
        typer.echo("the ladder, each rung against the rung below (and the top against the baseline):")
        for line in result.ladder:
            typer.echo(line)
        typer.echo("sequential signoff (h3eval ab --sequential): where each candidate stopped")
        for line in result.sequential:
            typer.echo(line if len(line) <= 240 else line[:237] + "...")
        typer.echo(f"requests saved: {result.saved}")
        typer.echo("")
        typer.echo("where to look:")
        for name, path in sorted(result.reports.items()):
            typer.echo(f"  {name}: {path}")
        typer.echo(f"  clips: {result.run_dir / 'clips'} (MP4s with sound)   gate results: {result.run_dir / 'gates'}")
        typer.echo(f"  noise floor: {result.floor_dir / 'floor.json'}   looks: {result.run_dir / 'sequential.json'}")
        typer.echo("")
        as_intended = result.outcomes == DEMO_INTENDED
        typer.echo("outcome: " + ", ".join(f"{name} {outcome}" for name, outcome in result.outcomes.items())
                   + (f" - as intended ({intended_note()})" if as_intended else
                      " - NOT the demo's intended outcome ("
                      + ", ".join(f"{name} {outcome}" for name, outcome in DEMO_INTENDED.items()) + ")")
                   + f"; {result.reports['verdict']}")
        typer.echo(f"report: {result.reports['html']}")
        typer.echo(f"next: h3eval dashboard {result.run_dir}")
        if not as_intended:
            raise typer.Exit(1)
