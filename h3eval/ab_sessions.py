"""The sessions of an ``h3eval ab`` run: every process that works on the run is recorded in ``run.json``'s
``extra.ab.sessions`` when it starts (:func:`begin_session`); one a kill left ``running`` is marked ``killed``, and
the warm-up clips of ended sessions that finished no timed request are removed."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from h3eval.store import RunManifest, RunStore, utc_now

logger = logging.getLogger(__name__)


def _sessions(manifest: RunManifest) -> list[dict[str, Any]]:
    """``extra.ab.sessions`` as a list of entries (runs written before entries existed listed bare ids)."""
    ab = manifest.extra.get("ab")
    raw = ab.get("sessions") if isinstance(ab, dict) else None
    return [entry if isinstance(entry, dict) and "id" in entry else {"id": str(entry), "outcome": "unknown"}
            for entry in (raw if isinstance(raw, list) else [])]


def _session_requests(store: RunStore, recipes: list[str]) -> dict[str, int]:
    """Finished timed requests (speed and quality clips) per session, from the records on disk."""
    counts: dict[str, int] = {}
    for name in recipes:
        for directory in [store.clip_dir(name), *(store.speed_dir(p, name) for p in ("repeated", "mixed"))]:
            for record in store.finished_records(directory):
                session = str((record.extra or {}).get("session", ""))
                counts[session] = counts.get(session, 0) + 1
    return counts


def begin_session(store: RunStore, manifest: RunManifest, session_id: str) -> dict[str, Any]:
    """Record a session in ``run.json`` before it generates anything; mark the sessions a kill left ``running`` as
    ``killed``, and remove the warm-up clips of ended sessions that finished no timed request. Returns the entry."""
    sessions = _sessions(manifest)
    recipes = list(manifest.recipes)
    finished = _session_requests(store, recipes)
    for entry in sessions:
        if entry.get("outcome") == "running":  # the lock is ours: that process is gone without saying so
            entry.update(outcome="killed", noticed_by=session_id, finished_requests=finished.get(entry["id"], 0))
    swept: dict[str, int] = {}
    for name in recipes:
        for session, files in store.warmup_files(name).items():
            if session != session_id and not finished.get(session):
                for path in files:
                    path.unlink(missing_ok=True)
                swept[session] = swept.get(session, 0) + sum(1 for p in files if p.suffix == ".mp4")
    for entry in sessions:
        if swept.get(entry["id"]):
            entry["warmups_removed"] = entry.get("warmups_removed", 0) + swept[entry["id"]]
    if swept:
        logger.warning("removed %d orphaned warm-up clip(s) of %d ended session(s) that finished no timed request",
                       sum(swept.values()), len(swept))
    entry = {"id": session_id, "pid": os.getpid(), "host": socket.gethostname(), "started_at": utc_now(),
             "outcome": "running"}
    sessions.append(entry)
    if not isinstance(manifest.extra.get("ab"), dict):
        manifest.extra["ab"] = {}
    manifest.extra["ab"]["sessions"] = sessions
    store.write_manifest(manifest)
    return entry
