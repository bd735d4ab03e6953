"""Decoded clips shared by the gates of one pair, so that running several gates decodes each MP4 once.

The runner goes pair by pair and runs every chosen gate on the pair before moving on, so a small LRU of decoded
clips (keyed by path, size and modification time: a rewritten file is decoded again) is enough. A 5 s 768x1344
clip is about 384 MB of uint8 frames; the cache keeps the two sides of the current pair and one spare.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import numpy as np

logger = logging.getLogger(__name__)

_MAX_ENTRIES = 3
_lock = threading.Lock()
_cache: "OrderedDict[tuple[Any, ...], Any]" = OrderedDict()


def _key(kind: str, path: str | os.PathLike) -> tuple[Any, ...]:
    path = Path(path).resolve()
    stat = path.stat()
    return (kind, str(path), stat.st_size, stat.st_mtime_ns)


def _cached(kind: str, path: str | os.PathLike, load: Callable[[], Any]) -> Any:
    if not Path(path).exists():
        # Let the loader raise its own error that names the file.
        return load()
    key = _key(kind, path)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    value = load()
    with _lock:
        _cache[key] = value
        while len(_cache) > _MAX_ENTRIES:
            _cache.popitem(last=False)
    return value


def load_video(path: str | os.PathLike) -> tuple[np.ndarray, float]:
    """``h3.media.decode_video`` through the cache: uint8 (T, H, W, 3) frames (read-only) and fps."""
    from h3.media import decode_video

    def load() -> tuple[np.ndarray, float]:
        frames, fps = decode_video(path)
        frames.setflags(write=False)  # shared between gates: nobody may modify it in place
        return frames, fps

    return _cached("video", path, load)


def load_audio(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """``h3.media.decode_audio`` through the cache: float32 (channels, N) in [-1, 1] (read-only) and sample rate."""
    from h3.media import decode_audio

    def load() -> tuple[np.ndarray, int]:
        audio, rate = decode_audio(path)
        audio.setflags(write=False)
        return audio, rate

    return _cached("audio", path, load)


def clear() -> None:
    with _lock:
        _cache.clear()
