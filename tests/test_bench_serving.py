"""bench/lib/ab.py's serving helpers, which the servers layout, bench/server_load, bench/bad_input_campaign and
tests/_serving share: a server is waited for until its health URL answers 200, a server that exits or stays silent is
one ServerNotUp quoting its log, and a stop leaves no process behind, the stubborn ones killed.

The servers here are small stand-ins (Python's http.server over a folder that holds a ``health`` file, a process that
exits, one that sleeps), not ``h3 serve``: the bench scripts that start ``h3 serve`` take minutes of CPU.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from bench.lib.ab import LOG_TAIL_CHARS, ServerNotUp, free_port, stop_processes, wait_until_up


def _start(code: str, log_path, *args: str, **popen) -> subprocess.Popen:
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-c", code, *args], stdout=log, stderr=subprocess.STDOUT, **popen)


def test_wait_returns_once_the_health_url_answers(tmp_path):
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "health").write_text("ok")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                             str(tmp_path / "www")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, proc, timeout_s=30, poll_s=0.05)
        assert proc.poll() is None
        assert httpx.get(url + "/health").text == "ok"
        with pytest.raises(ServerNotUp, match="did not answer /nothing within 1 s"):  # a 404 is not up
            wait_until_up(url, proc, timeout_s=1, poll_s=0.05, health="/nothing")
    finally:
        stop_processes([proc])
    assert proc.returncode == -signal.SIGTERM


def test_a_server_that_exits_is_named_with_its_code_and_its_log_tail(tmp_path):
    log = tmp_path / "server.log"
    proc = _start("import sys; print('x' * 5000); print('port already in use'); sys.exit(3)", log)
    started = time.monotonic()
    with pytest.raises(ServerNotUp) as caught:
        wait_until_up(f"http://127.0.0.1:{free_port()}", proc, timeout_s=60, poll_s=0.05, log=log)
    message = str(caught.value)
    assert time.monotonic() - started < 30  # it stopped at the exit, not at the timeout
    assert "exited with 3" in message and message.rstrip().endswith("port already in use")
    assert message.count("x") <= LOG_TAIL_CHARS  # only the tail is quoted


def test_a_silent_server_times_out(tmp_path):
    log = tmp_path / "server.log"
    proc = _start("import time; print('loading weights', flush=True); time.sleep(60)", log)
    try:
        started = time.monotonic()
        with pytest.raises(ServerNotUp, match="did not answer /health within 1 s") as caught:
            wait_until_up(f"http://127.0.0.1:{free_port()}", proc, timeout_s=1, poll_s=0.05, log=log)
        assert 1 <= time.monotonic() - started < 15
        assert "loading weights" in str(caught.value)
    finally:
        stop_processes([proc])


def test_stop_kills_what_ignores_sigterm_and_with_group_its_children(tmp_path):
    ready = tmp_path / "ready"
    ignore = ("import signal, subprocess, sys, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "print(child.pid, flush=True); pathlib.Path(sys.argv[1]).write_text('1'); time.sleep(60)")
    log = tmp_path / "stubborn.log"
    proc = _start(ignore, log, str(ready), start_new_session=True)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(log.read_text().split()[0])
    started = time.monotonic()
    stop_processes([proc], timeout_s=1, group=True)
    assert proc.returncode == -signal.SIGKILL and 1 <= time.monotonic() - started < 15
    for _ in range(200):  # the child (re-parented, reaped by init) is gone once its group is killed
        try:
            with open(f"/proc/{child}/stat") as stat:
                if stat.read().split(") ")[1].startswith("Z"):
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the server's child {child} outlived the group kill")
    stop_processes([proc])  # stopping a stopped process is a no-op
