"""What every command shares: one clear line and a non-zero exit for bad input, never a traceback."""

from __future__ import annotations

import functools
import logging
import sys
from typing import Callable

import typer

# Input/usage errors exit with 3 (the verdict command uses 0/1/2 for PASS/FAIL/INCONCLUSIVE).
EXIT_INPUT_ERROR = 3


def input_errors() -> tuple[type[BaseException], ...]:
    """The product's own errors for bad input (a file, a name, an option, a run directory); anything else is a bug
    and keeps its traceback (a bare ValueError or KeyError is never taken for bad input)."""
    from gates.base import GateInputError, UnknownGateError
    from h3.levers import LeverError
    from h3.media import MediaError
    from h3.recipe import RecipeError
    from h3.runtime import CheckpointError, RequestError
    from h3eval.gaterun import GateRunError
    from h3eval.policy import PolicyError
    from h3eval.prompts import PromptSuiteError, SeedsError
    from h3eval.runner import RunError
    from h3eval.store import StoreError
    from h3eval.verdict import VerdictInputError

    return (RecipeError, CheckpointError, RequestError, LeverError, PromptSuiteError, SeedsError, RunError,
            StoreError, MediaError, GateRunError, GateInputError, UnknownGateError, PolicyError, VerdictInputError)


def fail(message: str, code: int = EXIT_INPUT_ERROR) -> "typer.Exit":
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def handle_errors(fn: Callable) -> Callable:
    """Turn the product's input errors into one line on stderr and exit code 3."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except input_errors() as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)  # KeyError quotes its str
            raise fail(str(message)) from None

    return wrapper


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
