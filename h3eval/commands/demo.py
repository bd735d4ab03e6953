"""`h3eval demo`: the main job on the embedded tiny preset (README's first command)."""

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
        """Baseline vs an identical and a lossy candidate on the tiny preset: gates, noise floor, verdict, report."""
        setup_logging(verbose)
        from h3eval.demo import run_demo

        result = run_demo(out)
        typer.echo("")
        typer.echo(f"h3eval demo finished in {result.seconds:.0f} s: 3 recipes x 4 smoke prompts x 4 seeds on the tiny "
                   "preset (random weights: noise-like clips from the real pipeline code)")
        for cand, same in result.identical.items():
            typer.echo(f"  {cand}: {'byte-identical to baseline on every pair' if same else 'differs from baseline'}")
        if result.lpips_trunk != "alexnet":
            typer.echo("  note: LPIPS used the lpips package's random trunk (AlexNet weights "
                       "alexnet-owt-7be5be79.pth are not in the torch hub cache); its values are for the demo only")
        if result.gate_errors:
            typer.echo(f"  gate errors: {len(result.gate_errors)} (see the per-pair results)")
        typer.echo("")
        for line in result.lines:
            typer.echo(line)
        typer.echo("")
        typer.echo("where to look:")
        for name, path in sorted(result.reports.items()):
            typer.echo(f"  {name}: {path}")
        typer.echo(f"  clips: {result.run_dir / 'clips'}   gate results: {result.run_dir / 'gates'}")
        typer.echo(f"  noise floor: {result.floor_dir / 'floor.json'}")
        typer.echo(f"  dashboard: h3eval dashboard {result.run_dir}")
