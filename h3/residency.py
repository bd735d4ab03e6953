"""Where the text encoder lives: on the device (``resident``) or streamed from host memory while it encodes
(``offload``). A setting of the loaded model, not of a recipe: every recipe that shares the model shares it, and every
clip record names it (``extra["text_encoder"]``).

Why ``offload`` exists. At full size the DiT (33.1 B parameters, 61.7 GiB in bf16) and the Qwen3-VL conditioner
(33.4 B, 62.1 GiB) together fill an H200 (140 GiB): a process that A/B-tests an FP8 candidate beside the bf16
baseline on one card (``H3Runtime(shared=True)``) must also hold the candidate's FP8 weights (31 GiB) and the
activations. Streamed, the conditioner's 64 decoder layers stay in pinned host memory and pass through the device one
layer at a time (diffusers' group offloading, the next layer prefetched on a side CUDA stream): about 59 GiB of
host-to-device copy per request, ~1.1 s at the H200's measured 54 GB/s pinned rate
(``bench/full_size_speed/results/h200_speed_stock.json``), paid inside the ``text_encode`` stage and so measured, not assumed. Its
embeddings, final norm, vision tower and LM head (unused by MiniMax-H3) stay on the device.

``fit``: streamed as ``offload`` streams it, with as many decoder layers kept on the device as the requests leave room
for (:class:`LayerResidency`). On an 80 GB H100 an FP8 DiT (31 GiB) leaves room for about half of the conditioner's
layers, which then stop crossing the bus at every request; a bf16 DiT (62 GiB) for a few. What a request needs is
measured, not planned: a request of a (recipe, shape) not seen before runs with every layer streamed (layers kept
for another shape go back to host memory first), its peak above what was allocated at its start is recorded, and
after it the layers that fit beside that peak (plus :data:`FIT_MARGIN_GIB`) are copied up, outside any request's
timing. The computation is the same either way (the same weights, moved or not): the clip is the same to the bit.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch

logger = logging.getLogger(__name__)

TextEncoderResidency = Literal["resident", "offload", "fit"]
TEXT_ENCODER_RESIDENCY = ("resident", "offload", "fit")
STREAMED_RESIDENCY = ("offload", "fit")
"""The residencies that keep the decoder layers in host memory (a random model draws them there)."""
GIB = 1 << 30
FIT_MARGIN_GIB = 3.0
"""Kept free beyond a request's measured peak under ``fit``: h3.memory's 2 GiB headroom (CUDA context, cuBLAS
workspaces, the caching allocator's fragmentation) and 1 GiB more, because the peak is one request's, not a bound."""


def _language_model(text_encoder: torch.nn.Module) -> torch.nn.Module:
    model = getattr(text_encoder, "model", text_encoder)
    language = getattr(model, "language_model", None)
    if language is None or not hasattr(language, "layers"):
        raise ValueError(f"{type(text_encoder).__name__} has no language_model.layers to stream")
    return language


_DIFFUSERS_OFFLOAD_HOOKS = ("group_offloading", "layer_execution_tracker", "lazy_prefetch_group_offloading")


def _streaming_intact(language: torch.nn.Module) -> bool:
    """Whether the layout :func:`_stream_layers` set up is still the one in place: diffusers' LoRA loading
    (``load_lora_weights`` with a pipeline) removes every group-offloading hook of every component and applies group
    offloading again at the component's top level, which for Qwen3-VL is one group holding the whole conditioner,
    onloaded only by the top-level ``forward`` that MiniMax-H3's text step never calls (it calls ``.model``)."""
    from h3.levers.offload import _groups, is_top_level_group

    return any(is_top_level_group(g, language) and getattr(g, "_h3_resident", False) for g in _groups(language))


def _stream_layers(text_encoder: torch.nn.Module, language: torch.nn.Module, device: torch.device) -> None:
    from diffusers.hooks import HookRegistry, apply_group_offloading

    from h3.levers.offload import _groups, is_top_level_group, release_module_buffers

    # Whatever group offloading is there (ours, or diffusers' re-application at the top level) goes first; the
    # tensors stay where they are (host memory) until the hooks below move them.
    for module in text_encoder.modules():
        registry = getattr(module, "_diffusers_hook", None)
        if registry is not None:
            for name in _DIFFUSERS_OFFLOAD_HOOKS:
                if registry.get_hook(name) is not None:
                    registry.remove_hook(name, recurse=False)
    # Everything outside the decoder layers lives on the device (vision tower, embeddings, final norm, LM head: a
    # few GiB at full size), moved tensor by tensor so that the 62 GiB of layers never pass through the device at once.
    layers = {id(t) for layer in language.layers for t in (*layer.parameters(), *layer.buffers())}
    with torch.no_grad():
        for tensor in (*text_encoder.parameters(), *text_encoder.buffers()):
            if id(tensor) not in layers and tensor.device != device:
                tensor.data = tensor.data.to(device)
    stream = device.type == "cuda"
    apply_group_offloading(language, onload_device=device, offload_device=torch.device("cpu"),
                           offload_type="block_level", num_blocks_per_group=1, use_stream=stream,
                           non_blocking=stream)
    for group in _groups(language):
        if is_top_level_group(group, language):
            # Embeddings and final norm: small, used at every request; put on the device now and never moved again.
            # Now, not at the first forward: Qwen3-VL looks up ``embed_tokens`` in its outer model before the language
            # model's forward (whose hook would onload this group) runs, so a lazy onload leaves the lookup table on
            # the host beside device ids (the 2026-12-01 H200 run failed every request on it).
            group.onload_()
            if group.stream is not None:
                group.stream.synchronize()
            group.onload_ = lambda *args, **kwargs: None
            group.offload_ = lambda *args, **kwargs: None
            group._h3_resident = True
        elif group.stream is not None:
            offload = group.offload_

            def offload_with_buffers(*args, _offload=offload, _group=group, **kwargs):
                result = _offload(*args, **kwargs)
                release_module_buffers(_group)
                return result

            group.offload_ = offload_with_buffers


def stream_text_encoder(text_encoder: torch.nn.Module, device: str | torch.device) -> dict[str, Any]:
    """Keep the conditioner's decoder layers in host memory and stream them through ``device`` one at a time; the
    rest of it stays on ``device``. Returns what the records report.

    The layout survives diffusers' LoRA loading, which re-applies group offloading at the conditioner's top level
    (the 2026-12-01 H200 run: every LoRA candidate after the baseline failed on host embeddings): a pre-forward hook
    on ``text_encoder.model``, the module MiniMax-H3's text step calls, puts it back when it is gone."""
    device = torch.device(device)
    language = _language_model(text_encoder)
    _stream_layers(text_encoder, language, device)
    inner = getattr(text_encoder, "model", text_encoder)

    def restore(module, args, kwargs):
        if not _streaming_intact(language):
            logger.info("text encoder: group offloading was re-applied from outside (LoRA loading); streaming the "
                        "decoder layers again")
            _stream_layers(text_encoder, language, device)

    if not getattr(inner, "_h3_streaming_guard", False):
        inner.register_forward_pre_hook(restore, with_kwargs=True)
        inner._h3_streaming_guard = True
    streamed = sum(p.numel() for layer in language.layers for p in layer.parameters())
    logger.info("text encoder: %d decoder layers streamed from host memory (%.1f B parameters)",
                len(language.layers), streamed / 1e9)
    return {"residency": "offload", "streamed_layers": len(language.layers), "streamed_params": streamed,
            "use_stream": device.type == "cuda"}


def place_text_encoder(text_encoder: torch.nn.Module, device: str | torch.device,
                       residency: TextEncoderResidency) -> dict[str, Any]:
    """Put the conditioner where ``residency`` says; returns what the records report."""
    if residency not in TEXT_ENCODER_RESIDENCY:
        raise ValueError(f"text encoder residency must be one of {', '.join(TEXT_ENCODER_RESIDENCY)}, "
                         f"got {residency!r}")
    if residency in STREAMED_RESIDENCY:
        info = stream_text_encoder(text_encoder, device)
        if residency == "fit":
            text_encoder._h3_fit = LayerResidency(_language_model(text_encoder), torch.device(device))
            info = {**info, **text_encoder._h3_fit.info()}
        return info
    text_encoder.to(device)
    return {"residency": "resident"}


def _cuda_memory(device: torch.device) -> tuple[int, int, int]:
    """(bytes this process's allocator could hold in all: the device's free memory and what it caches already;
    bytes allocated now; the most allocated since the last ``reset_peak_memory_stats``, which every request does)."""
    free, _ = torch.cuda.mem_get_info(device)
    return (free + torch.cuda.memory_reserved(device), torch.cuda.memory_allocated(device),
            torch.cuda.max_memory_allocated(device))


class LayerResidency:
    """The ``fit`` residency of a streamed conditioner's decoder layers: which of them stay on the device.

    A kept layer's group is onloaded once and its ``onload_`` / ``offload_`` become a wait on the copy stream (the
    wait diffusers' prefetch chain relies on: a streamed group's weights are read only after the next group's
    ``onload_`` synchronized that stream) and nothing; giving it back restores them and offloads it (its pinned host
    copy was never dropped). Kept layers are the last ones, so the streamed ones keep their prefetch chain.

    ``memory``: a callable giving (bytes the allocator could hold in all, bytes allocated now, the peak allocated since
    the request began); on a CUDA device the device's, elsewhere none (nothing is kept: host memory is where the
    layers are). Tests give their own."""

    def __init__(self, language: torch.nn.Module, device: torch.device, memory=None):
        self.language = language
        self.memory = memory if memory is not None else (
            (lambda: _cuda_memory(device)) if device.type == "cuda" else None)
        self.needs: dict[Any, int] = {}
        """Per request key (recipe, frames, height, width): the most a request allocated above its start."""
        self.moves: list[dict[str, Any]] = []
        self._start: int | None = None

    def _layer_groups(self) -> list[Any]:
        from h3.levers.offload import _groups, is_top_level_group

        return [g for g in _groups(self.language) if not is_top_level_group(g, self.language)]

    @staticmethod
    def _group_bytes(group: Any) -> int:
        from h3.memory import component_bytes

        loose = (*group.parameters, *group.buffers)
        return sum(map(component_bytes, group.modules)) + sum(t.numel() * t.element_size() for t in loose)

    @staticmethod
    def _is_kept(group: Any) -> bool:
        return getattr(group, "_h3_fit_kept", False)

    @property
    def kept(self) -> list[Any]:
        return [g for g in self._layer_groups() if self._is_kept(g)]

    def target(self, need: int | None) -> int:
        """How many layers fit beside a request that needs ``need`` bytes above its start (0 when unknown)."""
        if need is None or self.memory is None:
            return 0
        usable, allocated, _ = self.memory()
        groups = self._layer_groups()
        kept_bytes = sum(self._group_bytes(g) for g in groups if self._is_kept(g))
        room = usable - (allocated - kept_bytes) - need - int(FIT_MARGIN_GIB * GIB)
        count = 0
        for group in reversed(groups):
            room -= self._group_bytes(group)
            if room < 0:
                break
            count += 1
        return count

    def _keep(self, group: Any) -> None:
        group._h3_fit_saved = (group.onload_, group.offload_)
        group.onload_()
        stream = group.stream
        if stream is not None:
            stream.synchronize()
        group.onload_ = (lambda *a, **k: stream.synchronize()) if stream is not None else (lambda *a, **k: None)
        group.offload_ = lambda *a, **k: None
        group._h3_fit_kept = True

    def _give_back(self, group: Any) -> None:
        group.onload_, group.offload_ = group._h3_fit_saved
        group._h3_fit_kept = False
        group.offload_()

    def settle(self, count: int, why: str) -> None:
        """Keep the last ``count`` layers on the device and stream the others."""
        import time

        t0 = time.perf_counter()
        groups = self._layer_groups()
        wanted = set(map(id, groups[len(groups) - count:])) if count else set()
        before = len(self.kept)
        for group in groups:  # give back first: the room is needed before anything is copied up
            if self._is_kept(group) and id(group) not in wanted:
                self._give_back(group)
        for group in reversed(groups):
            if id(group) in wanted and not self._is_kept(group):
                try:
                    self._keep(group)
                except torch.OutOfMemoryError:
                    self._give_back(group)  # what was copied up goes back to its pinned host copy
                    logger.warning("text encoder: out of memory keeping a layer on the device; %d kept",
                                   len(self.kept))
                    break
        after = len(self.kept)
        if after != before:
            self.moves.append({"why": why, "from": before, "to": after,
                               "seconds": round(time.perf_counter() - t0, 3)})
            logger.info("text encoder: %d of %d decoder layers kept on the device (%s)", after, len(groups), why)

    def before_request(self, key: Any) -> None:
        """Give back what a request of ``key`` has no room for (everything when it was never measured), and note what
        is allocated as it begins."""
        count = self.target(self.needs.get(key))
        if count < len(self.kept):
            self.settle(count, f"before a request of {key}")
        self._start = self.memory()[1] if self.memory is not None else None

    def after_request(self, key: Any) -> None:
        """Record what the request of ``key`` that just ran needed above its start (its peak, read before the next
        request resets it) and keep the layers that fit beside it."""
        if self.memory is None or self._start is None:
            return
        need, self._start = self.memory()[2] - self._start, None
        self.needs[key] = max(need, self.needs.get(key, 0))
        count = self.target(self.needs[key])
        if count > len(self.kept):
            self.settle(count, f"after a request of {key}")

    def info(self) -> dict[str, Any]:
        groups = self._layer_groups()
        kept = [g for g in groups if self._is_kept(g)]
        return {"residency": "fit", "kept_layers": len(kept), "streamed_layers": len(groups) - len(kept),
                "kept_gib": round(sum(self._group_bytes(g) for g in kept) / GIB, 3),
                "moves": self.moves[-3:]}
