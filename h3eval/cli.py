"""The `h3eval` command line: a thin typer app over functions that tests call directly.

One module per command under ``h3eval/commands``; each exposes ``register(app)``.
"""

from __future__ import annotations

import importlib

import typer

from h3.cli import OneLineUsageErrors

app = typer.Typer(
    name="h3eval",
    help="Quality-gated evaluation of accelerated MiniMax-H3 inference: runs, gates, verdicts, reports.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=OneLineUsageErrors,  # a bad option value (--warmup abc) is one line and exit 3, as every bad input
)



@app.callback()
def _root(ctx: typer.Context) -> None:
    """Quality-gated evaluation of accelerated MiniMax-H3 inference."""
    from h3eval.progress import quiet_repeats

    ctx.call_on_close(quiet_repeats())  # each library warning once while the command runs, the counts at its end


COMMAND_MODULES = [
    "h3eval.commands.generate",
    "h3eval.commands.floor",
    "h3eval.commands.verdict",
    "h3eval.commands.report",
    "h3eval.commands.demo",
    "h3eval.commands.vbench",
    "h3eval.commands.dashboard",
    "h3eval.commands.ab",
    "h3eval.commands.import_",
    "h3eval.commands.gate",
    "h3eval.commands.parallel_check",
]

for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def main() -> None:  # pragma: no cover
    app()

if __name__ == "__main__":  # pragma: no cover
    app()
