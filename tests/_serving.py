"""Test helper: run an ASGI app with real uvicorn on a free loopback port, in a thread; the dashboard as its own
Streamlit process (the free port and the stop are bench/lib/ab.py's serving helpers, which the bench scripts use)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import uvicorn

from bench.lib.ab import free_port, stop_processes


@contextmanager
def serving(app, port: int | None = None):
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)


@contextmanager
def streamlit_dashboard(runs, log_path, timeout: float = 60.0):
    """``h3eval dashboard`` over ``runs`` as its own Streamlit process on a free loopback port; yields its base URL
    once its health check answers (the test fails with the server's log if it never does)."""
    import os
    import subprocess
    from pathlib import Path

    import pytest

    from h3eval.commands.dashboard import streamlit_argv, wait_until_healthy

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "H3EVAL_DASHBOARD_RUNS"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    with open(log_path, "w+") as log:
        proc = subprocess.Popen(streamlit_argv(list(runs), port=port), stdout=log, stderr=subprocess.STDOUT, env=env)
        base = f"http://127.0.0.1:{port}"
        if not wait_until_healthy(base, proc, timeout):
            log.seek(0)
            proc.kill()
            pytest.fail(f"dashboard server did not come up on {base}:\n{log.read()}")
        try:
            yield base
        finally:
            stop_processes([proc], timeout_s=10)
