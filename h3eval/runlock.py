"""The run's lock (:meth:`h3eval.store.RunStore.lock`): one process writes into a run at a time.

The lock is an ``flock`` on ``<run>/.h3eval.lock``, so the kernel releases it when its process dies, even by ``kill
-9``; the holder writes who it is (pid, host, since, command) into the file, and a second process is refused with
:class:`~h3eval.store.RunLockedError` naming it. A lock file left by a dead process is taken over, with a warning that
says so. Within one process the lock is re-entrant.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from h3.provenance import utc_now
from h3eval.store import RunLockedError, StoreError

if TYPE_CHECKING:
    from h3eval.store import RunStore

logger = logging.getLogger("h3eval.store")  # the store's lock: its notices read as the store's, as before the split


@contextlib.contextmanager
def hold_run(store: RunStore, command: str) -> Iterator[dict[str, Any]]:
    """:meth:`h3eval.store.RunStore.lock`: hold ``store``'s run for ``command``; yields the holder's line."""
    key = os.path.realpath(store.root)
    with _HELD_GUARD:
        held = _HELD.get(key)
        if held is not None:
            held["depth"] += 1
    if held is not None:
        try:
            yield held["info"]
        finally:
            with _HELD_GUARD:
                held["depth"] -= 1
        return
    store.check_writable_root()
    created = not store.root.exists()
    try:
        store.root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create run directory {store.root}: {exc.strerror or exc}") from None
    try:
        fd, info = _acquire(store.lock_path, command)
    except StoreError:
        if created:
            with contextlib.suppress(OSError):
                store.root.rmdir()
        raise
    held = {"depth": 1, "info": info}
    with _HELD_GUARD:
        _HELD[key] = held
    try:
        yield info
    finally:
        with _HELD_GUARD:
            _HELD.pop(key, None)
        store.lock_path.unlink(missing_ok=True)  # before the flock is released: see _acquire
        os.close(fd)
        if created:
            with contextlib.suppress(OSError):
                store.root.rmdir()  # only when empty: nothing was written


# -- the holders -----------------------------------------------------------------------------------------------------
_HELD: dict[str, dict[str, Any]] = {}
"""Runs this process holds (real path -> depth and holder line), for re-entrance."""
_HELD_GUARD = threading.Lock()


def _describe_holder(path: Path) -> tuple[dict[str, Any] | None, str]:
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(holder, dict):
            raise ValueError
        return holder, (f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('since')} "
                        f"({holder.get('command')})")
    except (OSError, ValueError):
        return None, "another process (it has not written who it is yet)"


def _pid_alive(pid: Any) -> bool:
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _acquire(path: Path, command: str) -> tuple[int, dict[str, Any]]:
    """Open and ``flock`` the lock file, write who holds it; RunLockedError when another process holds it.

    The holder unlinks the file before closing it, so a process that opened the old file and got its flock after
    the release checks that the path still names the file it locked, and otherwise starts again.
    """
    for _ in range(100):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot create the lock file {path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            _, who = _describe_holder(path)
            raise RunLockedError(f"{path.parent} is in use by {who}: one process writes into a run at a time; "
                                 "wait for it to finish or stop it (nothing was changed)") from None
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"cannot lock {path}: {exc.strerror or exc}") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        previous, who = _describe_holder(path)
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": utc_now(), "command": command,
                "took_over": None}
        if previous is not None:
            here = previous.get("host") == info["host"]
            state = ("its process is gone" if here and not _pid_alive(previous.get("pid"))
                     else "it no longer holds the lock")
            info["took_over"] = previous
            logger.warning("%s: took over the stale lock of %s: %s", path.parent, who, state)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps({k: v for k, v in info.items() if k != "took_over"}) + "\n").encode(), 0)
        return fd, info
    raise StoreError(f"cannot lock {path}: it kept being replaced while this process tried")
