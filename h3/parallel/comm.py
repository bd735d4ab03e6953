"""Communication time per denoising step: how long the context-parallel collectives held the compute stream.

The collectives are diffusers' (h3/parallel/attention.py uses no exchange of its own). The timer wraps the places
where diffusers' engine exchanges tensors and waits for them:

- ``attention_dispatch._all_to_all_single`` (the Ulysses all-to-all of query, key, value and output; it waits
  inside);
- ``attention_dispatch.all_to_all_single_any_qkv_async`` / ``..._o_async`` (``ulysses_anything``; the wait is the
  closure they return, which the timer wraps);
- the ring's key/value all-gather (``funcol.all_gather_tensor`` as ``attention_dispatch`` sees it) and the output
  gather of the CP plan (``EquipartitionSharder.unshard`` / ``PartitionAnythingSharder.unshard_anything``), each
  waited on at once (the next line of diffusers' code reads the result anyway).

On CUDA a pair of events brackets each collective on the current stream, read at the end of the step (the stage
clock synchronizes there already), so timing adds no synchronization; on the CPU (gloo, synchronous) the wall time
of the call. The sum per step is the time the step's compute waited for communication; overlap, if any, is not
counted.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

import torch

_ACTIVE: "CommTimer | None" = None


class CommTimer:
    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._events: list[tuple[Any, Any]] = []
        self._cpu = 0.0
        self.calls = 0
        self._restore: list[Callable[[], None]] = []

    # -- timing ----------------------------------------------------------------------------------------------------
    def start(self):
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, token) -> None:
        self.calls += 1
        if self.device.type == "cuda":
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((token, end))
        else:
            self._cpu += time.perf_counter() - token

    def collect(self) -> float:
        """Seconds of communication since the last collect (synchronizes CUDA when events are pending)."""
        if self._events:
            torch.cuda.synchronize(self.device)
            total = sum(start.elapsed_time(end) for start, end in self._events) / 1000.0
        else:
            total = self._cpu
        self._events, self._cpu = [], 0.0
        return total

    # -- installation ----------------------------------------------------------------------------------------------
    def _patch(self, owner, attr: str, make: Callable[[Callable], Callable]) -> None:
        original = owner.__dict__[attr]
        setattr(owner, attr, make(original))
        self._restore.append(lambda: setattr(owner, attr, original))

    def install(self) -> "CommTimer":
        global _ACTIVE
        if _ACTIVE is not None:
            raise RuntimeError("a communication timer is already installed in this process")
        from diffusers.hooks import context_parallel as cp_hooks
        from diffusers.models import attention_dispatch as ad

        timer = self

        def blocking(fn):
            @functools.wraps(fn)
            @torch.compiler.disable
            def timed(*args, **kwargs):
                token = timer.start()
                out = ad._wait_tensor(fn(*args, **kwargs))
                timer.stop(token)
                return out

            return timed

        def deferred(fn):
            @functools.wraps(fn)
            @torch.compiler.disable
            def timed(*args, **kwargs):
                token = timer.start()
                wait = fn(*args, **kwargs)

                def timed_wait():
                    out = wait()
                    timer.stop(token)
                    return out

                return timed_wait

            return timed

        self._patch(ad, "_all_to_all_single", blocking)
        self._patch(ad, "all_to_all_single_any_qkv_async", deferred)
        self._patch(ad, "all_to_all_single_any_o_async", deferred)

        class _Funcol:
            """``attention_dispatch.funcol`` with the ring's all-gather timed (and waited on at once)."""

            def __init__(self, inner):
                self._inner = inner
                self.all_gather_tensor = blocking(inner.all_gather_tensor)

            def __getattr__(self, name):
                return getattr(self._inner, name)

        original_funcol = ad.funcol
        ad.funcol = _Funcol(original_funcol)
        self._restore.append(lambda: setattr(ad, "funcol", original_funcol))
        for cls, name in ((cp_hooks.EquipartitionSharder, "unshard"),
                          (cp_hooks.PartitionAnythingSharder, "unshard_anything")):
            original = cls.__dict__[name]
            fn = original.__func__

            def make(fn=fn):
                @torch.compiler.disable
                def timed(klass, *args, **kwargs):
                    token = timer.start()
                    out = ad._wait_tensor(fn(klass, *args, **kwargs))
                    timer.stop(token)
                    return out

                return classmethod(timed)

            setattr(cls, name, make())
            self._restore.append(lambda cls=cls, name=name, original=original: setattr(cls, name, original))
        _ACTIVE = self
        return self

    def remove(self) -> None:
        global _ACTIVE
        for restore in reversed(self._restore):
            restore()
        self._restore.clear()
        if _ACTIVE is self:
            _ACTIVE = None


def install_gloo_uneven_gather() -> Callable[[], None]:
    """On the CPU (gloo) only: diffusers gathers the output of an uneven (``*_anything``) plan with one
    ``dist.all_gather`` of tensors of different lengths, which NCCL accepts (it falls back to broadcasts) and gloo
    refuses ("invalid tensor size"). This gathers the same shards padded to the longest and trims them, so the CPU
    runs the plan diffusers runs on GPUs. Returns the remover."""
    import torch.distributed as dist
    from diffusers.hooks import context_parallel as cp_hooks
    from diffusers.models._modeling_parallel import gather_size_by_comm

    cls = cp_hooks.PartitionAnythingSharder
    original = cls.__dict__["unshard_anything"]

    def unshard_anything(klass, tensor, dim, mesh):
        group = mesh.get_group()
        tensor = tensor.contiguous()
        sizes = gather_size_by_comm(tensor.shape[dim], group)
        width = max(sizes)
        if tensor.shape[dim] < width:
            pad_shape = list(tensor.shape)
            pad_shape[dim] = width - tensor.shape[dim]
            tensor = torch.cat([tensor, tensor.new_zeros(pad_shape)], dim=dim)
        parts = [torch.empty_like(tensor) for _ in sizes]
        dist.all_gather(parts, tensor, group=group)
        return torch.cat([part.narrow(dim, 0, size) for part, size in zip(parts, sizes)], dim=dim)

    cls.unshard_anything = classmethod(unshard_anything)
    return lambda: setattr(cls, "unshard_anything", original)
