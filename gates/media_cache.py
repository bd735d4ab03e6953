"""Decoded clips shared by the gates of one pair, so that running several gates decodes each MP4 once.

The runner goes pair by pair and runs every chosen gate on the pair before moving on, so a small LRU of decoded
clips (keyed by path, size and modification time: a rewritten file is decoded again) is enough. It keeps, per kind,
the two sides of the current pair, the next pair's two (decoded ahead while this pair's gates run, where they run
side by side: h3eval.gaterun.decode_ahead; up to MAX_DECODE_AHEAD pairs) and one spare: decoded video (a 5 s
768x1344 clip is about 384 MB of uint8 frames), decoded audio, and video frames uploaded to a device (:func:`load_video_on`), so that the gates that run on
a GPU upload each clip once. (One shared bound of 3 entries across kinds evicted the baseline's frames while the
integrity gate read the candidate's audio, so the next gate decoded the baseline again.)

On a machine with many cores the video decoder uses FFmpeg's frame threads (``h3.media.decode_video(threads=0)``)
and converts the frames to RGB in a few threads beside it (``convert_threads``): the same frames, measured equal in
tests/test_gate_fidelity.py; on a few shared cores one thread (more threads were no faster on the 2-core CPU).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import numpy as np

logger = logging.getLogger(__name__)

MAX_DECODE_AHEAD = 2
"""The most pairs whose clips h3eval.gaterun decodes ahead of the current pair (h3eval.gaterun.decode_ahead_pairs)."""
_MAX_PER_KIND = 2 * (1 + MAX_DECODE_AHEAD) + 1  # the current pair's two sides, the pairs ahead, one spare
THREADED_DECODE_MIN_CORES = 8
"""Cores from which the video decoder runs FFmpeg's frame threads (below: one thread)."""
_lock = threading.Lock()
_cache: "OrderedDict[tuple[Any, ...], Any]" = OrderedDict()
_loading: dict[tuple[Any, ...], threading.Event] = {}
_unread: set[tuple[Any, ...]] = set()  # decoded ahead (:func:`prefetch`), not yet read by a gate: evicted last


def _key(kind: str, path: str | os.PathLike) -> tuple[Any, ...]:
    path = Path(path).resolve()
    stat = path.stat()
    return (kind, str(path), stat.st_size, stat.st_mtime_ns)


def _cached(kind: str, path: str | os.PathLike, load: Callable[[], Any], ahead: bool = False) -> Any:
    if not Path(path).exists():
        # Let the loader raise its own error that names the file.
        return load()
    key = _key(kind, path)
    while True:
        with _lock:
            if key in _cache:
                if not ahead:
                    _unread.discard(key)
                    _cache.move_to_end(key)
                return _cache[key]
            pending = _loading.get(key)
            if pending is None:  # this thread decodes it; gates asking for it meanwhile wait for this decode
                pending = _loading[key] = threading.Event()
                break
        pending.wait()  # another thread's decode: its value, or (when it raised) this thread tries itself
    try:
        value = load()
        with _lock:
            _cache[key] = value
            if ahead:
                _unread.add(key)
            _evict(kind)
    finally:
        with _lock:
            del _loading[key]
        pending.set()
    return value


def _evict(kind: str) -> None:
    """Drop the least recently read clips of ``kind`` beyond the bound; clips decoded ahead and not yet read go last
    (reads of the current pair's clips while the next pairs decode made a decoded-ahead clip the oldest, so it was
    evicted and decoded again). Called under ``_lock``."""
    same_kind = [k for k in _cache if k[0] == kind]
    excess = len(same_kind) - _MAX_PER_KIND
    for old in ([k for k in same_kind if k not in _unread] + [k for k in same_kind if k in _unread])[: max(0, excess)]:
        del _cache[old]
        _unread.discard(old)


def prefetch(paths: list[str | os.PathLike], needs: set[str]) -> None:
    """Decode the clips at ``paths`` (video and/or audio, as ``needs`` says) in parallel threads into the cache, so
    that gates run side by side (:func:`h3eval.gaterun.gate_workers`) do not wait on one decode after another.
    Errors are left for the gates to raise and report."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(load, path) for path in paths for kind, load in (("video", load_video), ("audio", load_audio))
            if kind in needs and Path(path).exists()]
    if not jobs:
        return
    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="decode") as pool:
        for future in [pool.submit(load, path, ahead=True) for load, path in jobs]:
            try:
                future.result()
            except Exception:  # noqa: BLE001 - the gate that needs the clip decodes it again and reports the error
                logger.debug("prefetch failed", exc_info=True)


def decode_threads() -> int:
    """Decoder threads for this machine: 0 (FFmpeg's choice, frame threads) on many cores, else 1."""
    return 0 if (os.cpu_count() or 1) >= THREADED_DECODE_MIN_CORES else 1


def convert_threads() -> int:
    """Threads converting decoded frames to RGB (``h3.media.decode_video(convert_threads=)``): a quarter of the cores,
    at most 8, on many cores (the two clips of a pair decode side by side, the next pair's ahead); else 1."""
    cores = os.cpu_count() or 1
    return min(8, cores // 4) if cores >= THREADED_DECODE_MIN_CORES else 1


def load_video(path: str | os.PathLike, ahead: bool = False) -> tuple[np.ndarray, float]:
    """``h3.media.decode_video`` through the cache: uint8 (T, H, W, 3) frames (read-only) and fps. ``ahead``: decoded
    for a later pair (:func:`prefetch`), kept until a gate reads it."""
    from h3.media import decode_video

    def load() -> tuple[np.ndarray, float]:
        frames, fps = decode_video(path, threads=decode_threads(), convert_threads=convert_threads())
        frames.setflags(write=False)  # shared between gates: nobody may modify it in place
        return frames, fps

    return _cached("video", path, load, ahead)


def load_video_on(path: str | os.PathLike, device: str):
    """The clip's uint8 (T, H, W, 3) frames as a torch tensor on ``device``, uploaded once per clip and device (the
    gates that run on a GPU share it; nobody may modify it in place), and fps."""
    import torch

    on_cpu = torch.device(device).type == "cpu"

    def load():
        frames, fps = load_video(path)
        if on_cpu:  # a tensor of its own (the device path run on the CPU, in tests)
            return torch.from_numpy(frames.copy()), fps
        with warnings.catch_warnings():  # the cached frames are read-only; the tensor is only read, to copy it over
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            host = torch.from_numpy(frames)
        return host.to(device), fps

    return _cached(f"video@{torch.device(device)}", path, load)


def load_audio(path: str | os.PathLike, ahead: bool = False) -> tuple[np.ndarray, int]:
    """``h3.media.decode_audio`` through the cache: float32 (channels, N) in [-1, 1] (read-only) and sample rate;
    ``ahead`` as :func:`load_video`'s."""
    from h3.media import decode_audio

    def load() -> tuple[np.ndarray, int]:
        audio, rate = decode_audio(path)
        audio.setflags(write=False)
        return audio, rate

    return _cached("audio", path, load, ahead)


def clear() -> None:
    with _lock:
        _cache.clear()
        _unread.clear()
