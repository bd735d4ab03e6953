"""``h3 serve --nproc N``: rank 0 serves the videos API (h3/server.py, unchanged) and writes the files; the other ranks
follow its requests.

Rank 0's server holds a :class:`Leader` where it would hold the runtime. Before rank 0 generates a job, the leader
broadcasts the request on the control group (gloo, h3.parallel.world.control_group); every follower is waiting in
:func:`follow`, receives it and runs the same ``generate`` (writing nothing), so all ranks enter the request's
collectives together. The server's single worker thread makes jobs strictly sequential, which the collectives need.

A job may stop early (the server's per-job timeout, or the server stopping: h3.server.JobInterrupts) only where every
rank stops with it: at the start of each DiT step rank 0 decides and broadcasts the decision, and every follower,
waiting at the same step, stops there too (:meth:`Leader.install_interrupts`, :func:`_follower_stop_points`). Text
encoding and the tile-parallel decode run to their end.

Idle followers wait inside a collective, and every collective has a timeout (h3.parallel.world). So that an idle
server is never mistaken for a dead one, the leader sends a heartbeat every ``HEARTBEAT_S`` while no job runs. When
the server stops, the leader sends ``stop`` and the followers return. A rank that dies makes torchrun stop the others.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import fields
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

    def __getattr__(self, name: str):
        # What the server reads of a runtime beyond the calls below (pipe, device, default_size for its limits).
        return getattr(self.runtime, name)

    def resolve(self, request):
        return self.runtime.resolve(request)

    def install_interrupts(self, interrupts) -> list[Any]:
        """The job's stop points (h3.server.JobInterrupts): the start of each DiT step, where rank 0 broadcasts
        whether the job stops and every follower receives it (:func:`_follower_stop_points`); returns the hooks."""
        import torch

        @torch.compiler.disable
        def step(*_):
            reason = interrupts.due()
            _broadcast({"op": "step", "stop": reason})
            if reason is not None:
                interrupts.stop(reason)
            interrupts.count_step()

        return [self.runtime.pipe.transformer.register_forward_pre_hook(step, prepend=True)]

    def generate(self, request, out, extra: dict | None = None, trajectory: bool = False):
        with self._lock:
            if self._stopped:
                raise RuntimeError("the parallel runtime has stopped")
            _broadcast({"op": "generate", "request": request_fields(request), "trajectory": bool(trajectory)})
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


def request_fields(request) -> dict[str, Any]:
    """The request as the followers rebuild it (``GenerateRequest(**fields)``): its fields one level deep, so that a
    keyframe or reference image (h3.conditioning.ImageInput) travels as itself. ``dataclasses.asdict`` would turn it
    into a dict, and a follower would then run another workflow than rank 0 (or fail) in the same collectives."""
    return {f.name: getattr(request, f.name) for f in fields(request)}


class FollowerStopped(RuntimeError):
    """Rank 0 stopped the job at this DiT step (its timeout, or the server stopping)."""


def _follower_stop_points(runtime: Any):
    """Rank 0's stop decision at the start of each DiT step, received here (Leader.install_interrupts)."""
    import torch

    @torch.compiler.disable
    def step(*_):
        decision = _broadcast(None)
        if decision.get("stop") is not None:
            raise FollowerStopped(decision["stop"])

    return runtime.pipe.transformer.register_forward_pre_hook(step, prepend=True)


def follow(runtime: Any) -> int:
    """A follower rank's loop: run every request rank 0 announces until it says stop. Returns the requests run."""
    hook = _follower_stop_points(runtime)
    try:
        return _follow(runtime)
    finally:
        hook.remove()


def _follow(runtime: Any) -> int:
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
        except FollowerStopped as exc:
            logger.info("follower: the job stopped with rank 0: %s", exc)
        except Exception:  # the same failure happens on rank 0, which reports it on the job; keep following
            logger.exception("follower: request failed")
        ran += 1


def serve_ranks(model: str, recipe, host: str, port: int, api_key: str | None, max_queue: int,
                output_dir: str | Path, device: str | None, text_encoder: str = "resident",
                **limit_overrides: Any) -> None:
    """This rank's part of ``h3 serve --nproc N`` (the process was started by torchrun); ``text_encoder``:
    ``resident`` or ``offload`` (h3.residency); ``limit_overrides``: the server's limits
    (h3.server_request.default_limits' keywords)."""
    from h3.parallel.world import destroy_world, init_world, prepare_model
    from h3.runtime import H3Runtime

    prepare_model(model)
    world = init_world(device)
    try:
        runtime = H3Runtime.load(model, recipe, str(world.device), text_encoder=text_encoder)
        if not world.is_writer:
            follow(runtime)
            return
        from h3.server import serve_runtime

        leader = Leader(runtime)
        try:
            serve_runtime(leader, host=host, port=port, api_key=api_key, max_queue=max_queue, output_dir=output_dir,
                          **limit_overrides)
        finally:
            leader.stop()
    finally:
        destroy_world()
