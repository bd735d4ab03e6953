"""``h3 serve --nproc N``: rank 0 serves the videos API (h3/server.py, unchanged) and writes the files; the other ranks
follow its requests.

Rank 0's server holds a :class:`Leader` where it would hold the runtime. Before rank 0 generates a job, the leader
broadcasts the request on the control group (gloo, h3.parallel.world.control_group); every follower is waiting in
:func:`follow`, receives it and runs the same ``generate`` (writing nothing), so all ranks enter the request's
collectives together. The server's single worker thread makes jobs strictly sequential, which the collectives need.

Idle followers wait inside a collective, and every collective has a timeout (h3.parallel.world). So that an idle
server is never mistaken for a dead one, the leader sends a heartbeat every ``HEARTBEAT_S`` while no job runs. When
the server stops, the leader sends ``stop`` and the followers return. A rank that dies makes torchrun stop the others.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

HEARTBEAT_S = 5.0


def _broadcast(message: dict[str, Any] | None) -> dict[str, Any]:
    import torch.distributed as dist

    from h3.parallel.world import control_group

    box = [message]
    dist.broadcast_object_list(box, src=0, group=control_group())
    return box[0]


class Leader:
    """Rank 0's runtime as the server sees it: same ``recipe``/``model``/``resolve``/``generate``, plus the
    broadcast that makes the followers run each request too."""

    def __init__(self, runtime: Any, heartbeat_s: float = HEARTBEAT_S):
        self.runtime = runtime
        self.recipe, self.model = runtime.recipe, runtime.model
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._stopped = False
        self._heartbeat_s = heartbeat_s
        self._thread = threading.Thread(target=self._beat, name="h3-parallel-heartbeat", daemon=True)
        self._thread.start()

    def resolve(self, request):
        return self.runtime.resolve(request)

    def generate(self, request, out, extra: dict | None = None, trajectory: bool = False):
        with self._lock:
            if self._stopped:
                raise RuntimeError("the parallel runtime has stopped")
            _broadcast({"op": "generate", "request": asdict(request), "trajectory": bool(trajectory)})
            try:
                return self.runtime.generate(request, out, extra=extra, trajectory=trajectory)
            finally:
                self._last = time.monotonic()

    def _beat(self) -> None:
        while True:
            time.sleep(self._heartbeat_s / 2)
            with self._lock:
                if self._stopped:
                    return
                if time.monotonic() - self._last >= self._heartbeat_s:
                    _broadcast({"op": "noop"})
                    self._last = time.monotonic()

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            try:
                _broadcast({"op": "stop"})
            except RuntimeError as exc:  # the followers are gone already (torchrun stopping every rank)
                logger.info("followers not told to stop: %s", exc)


def follow(runtime: Any) -> int:
    """A follower rank's loop: run every request rank 0 announces until it says stop. Returns the requests run."""
    from h3.runtime import GenerateRequest

    ran = 0
    while True:
        message = _broadcast(None)
        op = message.get("op")
        if op == "stop":
            return ran
        if op != "generate":
            continue
        request = GenerateRequest(**message["request"])
        try:
            # A follower writes nothing (H3Runtime.generate returns before the frames are prepared); ``out`` only
            # satisfies the signature.
            runtime.generate(request, Path("/nonexistent/follower.mp4"), trajectory=message["trajectory"])
        except Exception:  # the same failure happens on rank 0, which reports it on the job; keep following
            logger.exception("follower: request failed")
        ran += 1


def serve_ranks(model: str, recipe, host: str, port: int, api_key: str | None, max_queue: int,
                output_dir: str | Path, device: str | None) -> None:
    """This rank's part of ``h3 serve --nproc N`` (the process was started by torchrun)."""
    from h3.parallel.world import destroy_world, init_world, prepare_model
    from h3.runtime import H3Runtime

    prepare_model(model)
    world = init_world(device)
    try:
        runtime = H3Runtime.load(model, recipe, str(world.device))
        if not world.is_writer:
            follow(runtime)
            return
        import uvicorn

        from h3.server import create_app

        leader = Leader(runtime)
        try:
            app = create_app(leader, output_dir, api_key=api_key, max_queue=max_queue)
            uvicorn.run(app, host=host, port=port, log_level="warning")
        finally:
            leader.stop()
    finally:
        destroy_world()
