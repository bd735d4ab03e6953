"""`h3eval dashboard RUNDIR [RUNDIR ...] [--port N]`: the Streamlit review app over one or more runs, on loopback."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import typer

from h3eval.store import RunStore

logger = logging.getLogger(__name__)

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


class DashboardError(ValueError):
    """The dashboard cannot start with these arguments."""


def streamlit_argv(run_dirs: list[Path], port: int = 8501, address: str = "127.0.0.1") -> list[str]:
    """The command line that serves the dashboard; checks every run directory first (one clear error each)."""
    if not run_dirs:
        raise DashboardError("give at least one run directory")
    for run_dir in run_dirs:
        manifest = RunStore(run_dir).manifest_path
        if manifest.is_dir():
            raise DashboardError(f"{run_dir} is not a run directory: {manifest} is a directory")
        if not manifest.is_file():
            raise DashboardError(f"{run_dir} is not a run directory: {manifest} is missing")
    if not 1 <= port <= 65535:
        raise DashboardError(f"--port {port} is not a TCP port (1-65535)")
    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.address", address,
        "--server.port", str(port),
        "--server.headless", "true",
        "--browser.gatherUsageStats", "false",
        "--",
        *[str(Path(d).resolve()) for d in run_dirs],
    ]


def wait_until_healthy(base: str, proc, timeout: float, poll: float = 0.3) -> bool:
    """Poll a started Streamlit server's health endpoint (``base`` = http://host:port) until it answers 200: True,
    or False once ``proc`` (its ``subprocess.Popen``) has exited or ``timeout`` seconds have passed."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(poll)


def serve_dashboard(run_dirs: list[Path], port: int = 8501, address: str = "127.0.0.1") -> None:
    """Become the dashboard server (exec): signals reach Streamlit directly and no orphan server outlives a killed
    parent. Does not return."""
    argv = streamlit_argv(run_dirs, port, address)
    logger.info("serving the dashboard on http://%s:%d/", address, port)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)


def register(app: typer.Typer) -> None:
    @app.command("dashboard")
    def dashboard(
        run_dirs: list[Path] = typer.Argument(..., help="Run directories to review (one or more)."),
        port: int = typer.Option(8501, "--port", envvar="H3EVAL_DASHBOARD_PORT", help="TCP port on 127.0.0.1."),
    ) -> None:
        """Serve the review dashboard (speed versus quality, stage anatomy, clip viewer, gates, verdict)."""
        try:
            serve_dashboard(run_dirs, port)
        except DashboardError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(3) from exc  # bad input: exit 3, as every h3eval command
