"""What "the model exactly as loaded" means in tests: every parameter and buffer (name, dtype, device, shape, bytes),
every hook, processor and plain attribute of every submodule of every component, and the pipeline's own attributes.
Two states compare equal only when nothing of a removed recipe is left behind."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

COMPONENTS = ("transformer", "text_encoder", "vae", "audio_vae")
_PLAIN = (bool, int, float, str, type(None))
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
               "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called",
               "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
               "_load_state_dict_post_hooks")


def _tensor(t: torch.Tensor) -> tuple:
    data = t.detach().cpu().contiguous()
    raw = data.view(torch.uint8) if data.numel() else data
    return (str(t.dtype), str(t.device), tuple(t.shape), hashlib.sha256(raw.numpy().tobytes()).hexdigest())


def _value(value: Any) -> Any:
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, _PLAIN) for v in value):
        return tuple(value)
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted(map(repr, value))))
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return ("dict", tuple(sorted((k, _value(v)) for k, v in value.items())))
    return ("object", type(value).__qualname__)


def module_state(module: torch.nn.Module) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        state[f"param:{name}"] = (_tensor(param), type(param).__name__, param.requires_grad)
    for name, buffer in module.named_buffers(remove_duplicate=False):
        state[f"buffer:{name}"] = _tensor(buffer)
    for name, sub in module.named_modules(remove_duplicate=False):
        state[f"type:{name}"] = type(sub).__qualname__
        for hooks in _HOOK_DICTS:
            registered = getattr(sub, hooks, None)
            if registered:
                state[f"{hooks}:{name}"] = len(registered)
        for key, value in vars(sub).items():
            if key in ("_parameters", "_buffers", "_modules", *_HOOK_DICTS):
                continue
            state[f"attr:{name}:{key}"] = _value(value)
        processor = getattr(sub, "processor", None)
        if processor is not None:
            state[f"processor:{name}"] = (type(processor).__qualname__,
                                          _value({k: v for k, v in vars(processor).items()}))
    return state


def pipeline_state(pipe: Any) -> dict[str, Any]:
    """The state of every component and the pipeline's own plain attributes."""
    state: dict[str, Any] = {}
    for name in COMPONENTS:
        for key, value in module_state(getattr(pipe, name)).items():
            state[f"{name}/{key}"] = value
    for key, value in vars(pipe).items():
        state[f"pipe:{key}"] = _value(value)
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    state["attention:active_backend"] = str(_AttentionBackendRegistry._active_backend)
    return state


def state_differences(before: dict[str, Any], after: dict[str, Any], limit: int = 12) -> list[str]:
    """The keys that differ, first ``limit`` of them, readable."""
    diffs = []
    for key in sorted(set(before) | set(after)):
        if before.get(key, "<absent>") != after.get(key, "<absent>"):
            diffs.append(f"{key}: {before.get(key, '<absent>')!r} -> {after.get(key, '<absent>')!r}")
    return diffs[:limit] + ([f"... {len(diffs) - limit} more"] if len(diffs) > limit else [])
