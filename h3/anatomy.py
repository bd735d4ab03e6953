"""Stage anatomy of a request: device-synchronized timers attached to the pipeline's components as removable hooks.

The timers sit on the modules the diffusers blocks call — the Qwen3-VL language model (text encode), the
transformer (one forward = one denoising step), ``vae.decode`` and ``audio_vae.decode`` — so the pipeline code runs
unchanged. Each boundary synchronizes the device, so a stage's time is the device work it launched, not only the
Python that launched it.
"""

from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch


def synchronize(device: torch.device | str) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class StageClock:
    """Collects (stage, start, end) intervals of one request."""

    device: torch.device
    intervals: list[tuple[str, float, float]] = field(default_factory=list)
    active: str | None = None
    attention_calls: Counter = field(default_factory=Counter)
    _start: float = 0.0

    def now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()

    def begin(self, stage: str) -> None:
        self.active = stage
        self._start = self.now()

    def end(self, stage: str) -> None:
        self.intervals.append((stage, self._start, self.now()))
        self.active = None

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.begin(name)
        try:
            yield
        finally:
            self.end(name)

    @contextmanager
    def nested(self, name: str) -> Iterator[None]:
        """An interval of ``name`` inside the active stage, leaving that stage running: its time counts in both
        (:meth:`exclusive` takes it out of the outer one). The streamed frame preparation inside the video decode."""
        start = self.now()
        try:
            yield
        finally:
            self.intervals.append((name, start, self.now()))

    def total(self, stage: str) -> float:
        return sum(end - start for name, start, end in self.intervals if name == stage)

    def exclusive(self, stage: str, inner: str) -> float:
        """:meth:`total` of ``stage`` less the time of the ``inner`` intervals that lie within its intervals."""
        spans = [(start, end) for name, start, end in self.intervals if name == stage]
        inside = sum(end - start for name, start, end in self.intervals
                     if name == inner and any(s <= start and end <= e for s, e in spans))
        return self.total(stage) - inside

    def each(self, stage: str) -> list[float]:
        return [end - start for name, start, end in self.intervals if name == stage]

    def first_start(self, stage: str) -> float | None:
        starts = [start for name, start, _ in self.intervals if name == stage]
        return min(starts) if starts else None

    def last_end(self, stage: str) -> float | None:
        ends = [end for name, _, end in self.intervals if name == stage]
        return max(ends) if ends else None


class _Removable:
    def __init__(self, remove: Callable[[], None]):
        self.remove = remove


def wrap_method(owner: Any, attr: str, make_wrapper: Callable[[Callable], Callable]) -> _Removable:
    """Replace ``owner.attr`` (e.g. ``vae.decode``) by ``make_wrapper(original)`` as an instance attribute.

    The returned handle's ``remove()`` restores exactly what was there (an instance attribute, or the class's method).
    """
    original = getattr(owner, attr)
    had_instance_attr = attr in vars(owner)
    setattr(owner, attr, make_wrapper(original))

    def remove() -> None:
        if had_instance_attr:
            setattr(owner, attr, original)
        else:
            delattr(owner, attr)

    return _Removable(remove)


def observe_attention_dispatch(observer: Callable[[str, dict], None]) -> _Removable:
    """Call ``observer(backend_name, kwargs)`` before every attention call diffusers' dispatcher makes.

    Wraps every entry of diffusers' attention backend registry, so what is observed is the backend that actually
    ran, not the one configured. ``remove()`` restores the entries it wrapped (and only those still its own).
    """
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    registry = _AttentionBackendRegistry._backends
    originals = dict(registry)

    def make(name, fn):
        label = str(getattr(name, "value", name))

        # Not traced by torch.compile: inside a compiled block dynamo would otherwise guard on the observer's own state
        # (a list that grows every call), recompile at every forward and, past its recompile limit, fall back to eager
        # for the rest of the process (found on the H200: compiled recipes ran slower than eager). A disabled probe
        # is a graph break around the attention call; the attention kernel itself is the same one.
        @torch.compiler.disable
        def probe(*args, **kwargs):
            observer(label, kwargs)
            return fn(*args, **kwargs)

        return probe

    wrappers = {name: make(name, fn) for name, fn in originals.items()}
    registry.update(wrappers)

    def remove() -> None:
        for name, fn in originals.items():
            if registry.get(name) is wrappers[name]:
                registry[name] = fn

    return _Removable(remove)


def _timed(clock_getter: Callable[[], "StageClock | None"], stage: str) -> Callable[[Callable], Callable]:
    def make_wrapper(original: Callable) -> Callable:
        def timed(*args, **kwargs):
            clock = clock_getter()
            if clock is None:
                return original(*args, **kwargs)
            with clock.stage(stage):
                return original(*args, **kwargs)

        return timed

    return make_wrapper


class StageHooks:
    """Attach timers to a MiniMax-H3 pipeline's components; one :class:`StageClock` per request."""

    def __init__(self, pipe: Any):
        self.clock: StageClock | None = None
        self._handles: list[Any] = []
        getter = lambda: self.clock  # noqa: E731

        text_model = getattr(pipe.text_encoder, "model", pipe.text_encoder)
        self._handles.append(self._module_timer(text_model, "text_encode"))
        self._handles.append(self._module_timer(pipe.transformer, "denoise_step"))
        self._handles.append(wrap_method(pipe.vae, "decode", _timed(getter, "video_decode")))
        self._handles.append(wrap_method(pipe.audio_vae, "decode", _timed(getter, "audio_decode")))
        self._handles.append(observe_attention_dispatch(self._count_attention))

    def _module_timer(self, module: torch.nn.Module, stage: str):
        def pre(_module, _args, _kwargs):
            if self.clock is not None:
                self.clock.begin(stage)

        def post(_module, _args, _kwargs, _output):
            if self.clock is not None:
                self.clock.end(stage)

        h1 = module.register_forward_pre_hook(pre, with_kwargs=True)
        h2 = module.register_forward_hook(post, with_kwargs=True)

        class _Pair:
            def remove(self_inner):
                h1.remove()
                h2.remove()

        return _Pair()

    def _count_attention(self, backend: str, _kwargs: dict) -> None:
        """Which attention backend diffusers' dispatcher actually called, per stage."""
        if self.clock is not None:
            self.clock.attention_calls[(self.clock.active or "other", backend)] += 1

    @contextmanager
    def request(self, device: torch.device) -> Iterator[StageClock]:
        self.clock = StageClock(device=torch.device(device))
        try:
            yield self.clock
        finally:
            self.clock = None

    def remove(self) -> None:
        for handle in reversed(self._handles):
            handle.remove()
        self._handles.clear()
