"""The levers: one file each, holding the lever's config (its recipe section, see :class:`LeverConfig`) and its
``apply_x(target, config) -> handle`` with ``remove()`` and ``telemetry()`` (diffusers' ``XConfig`` + ``apply_x``).

:data:`REGISTRY` lists the levers in the order :func:`apply_recipe_levers` applies them, each composing with the
ones before it:

1. ``lora`` (step distillation) — changes the weights the next two read; 1b. ``compensation_lora`` (a second LoRA
   over the first, for sparse attention);
2. ``adaln`` (modulation precompute) — its tables include the LoRA's effect on ``adaln_proj``;
3. ``quant`` (linear quantization);
4. ``attention`` (backend), 5. ``bucketing``, 6. ``sparse_attention`` — the last two install attention processors that
   keep the backend of step 4 for their dense calls; 6b. ``fp8_attention`` (e4m3 q/k/v per head, FlashAttention-3's
   FP8 kernel or its emulation: it owns the attention call, so it refuses a backend other than native and sparse);
7. ``cache`` (step caches), 8. ``parallel`` (context parallelism across ranks: after the attention processors, which
   it hands its config to, and before offload and compile, which wrap what it hooked), 9. ``offload`` (group
   offloading), 10. ``compile`` (regional torch.compile, last so that it traces the final modules), 11. ``vae`` (the
   stock tiling, tiles per resolution, residency), 12. ``vae_decoder`` (the video VAE's ViT decoder quantized and
   compiled, region by region).

The recipe (:mod:`h3.recipe`) is composed from the same list: one section per lever, named by the config's
``name``. Every lever is named in ``executed.levers`` of each clip record: ``{"applied": false}`` when the recipe
has it off. Adding a lever is one new file here plus one line in :data:`REGISTRY`
(``tests/test_lever_registry.py`` shows it with a toy lever).
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from h3.levers.base import ApplyContext, LeverConfig, LeverError, LeverHandle

if TYPE_CHECKING:
    from h3.record import Executed

logger = logging.getLogger(__name__)


def _config(module: str, name: str) -> type[LeverConfig]:
    """The config class ``name`` of the lever file ``h3/levers/<module>.py``."""
    config = getattr(importlib.import_module(f"h3.levers.{module}"), name)
    if not (isinstance(config, type) and issubclass(config, LeverConfig)):
        raise TypeError(f"h3.levers.{module}.{name} is not a LeverConfig")
    return config


REGISTRY: tuple[type[LeverConfig], ...] = (
    _config("lora", "LoraConfig"),
    _config("compensation_lora", "CompensationLoraConfig"),
    _config("adaln", "AdalnConfig"),
    _config("quantization", "QuantizationConfig"),
    _config("attention_backend", "AttentionBackendConfig"),
    _config("bucketing", "BucketingConfig"),
    _config("sparse_attention", "SparseAttentionConfig"),
    _config("fp8_attention", "Fp8AttentionConfig"),
    _config("step_cache", "StepCacheConfig"),
    _config("parallel", "ParallelConfig"),
    _config("offload", "OffloadConfig"),
    _config("compile", "CompileConfig"),
    _config("vae", "VaeConfig"),
    _config("vae_decoder", "VaeDecoderConfig"),
)
"""Every lever, in the order it is applied, one line each (the lever's file and its config class); each config's
``name`` is its recipe section."""

LEVERS: tuple[str, ...] = tuple(config.name for config in REGISTRY)

__all__ = ["LEVERS", "REGISTRY", "ApplyContext", "LeverConfig", "LeverError", "LeverHandle", "apply_recipe_levers",
           "keeps_on_cpu", "lever_configs", "lever_telemetry", "preflight", "shared_problems"]


def _check_registry() -> None:
    names = [config.name for config in REGISTRY]
    if len(set(names)) != len(names):
        raise RuntimeError(f"two levers share a name in h3.levers.REGISTRY: {names}")


_check_registry()


def lever_configs(recipe) -> list[LeverConfig]:
    """The recipe's lever sections, in the order they apply (the recipe's field order: :data:`REGISTRY`'s)."""
    return [value for value in (getattr(recipe, field) for field in type(recipe).model_fields)
            if isinstance(value, LeverConfig)]


def keeps_on_cpu(recipe, component: str) -> bool:
    """Whether the runtime must leave ``component`` on the CPU at load (a lever moves it itself: offload)."""
    return any(config.keeps_on_cpu(component) for config in lever_configs(recipe))


def preflight(recipe, device) -> None:
    """Refuse, before any weight loads, a recipe whose levers cannot run on ``device`` or with each other (no silent
    fallback) or whose input files (the LoRA) are missing."""
    configs = lever_configs(recipe)
    problems = [p for config in configs for p in config.device_problems(str(device))]
    problems += [p for config in configs for p in config.composition_problems(recipe)]
    if problems:
        raise LeverError(f"recipe {recipe.name!r} cannot run on {device}: " + "; ".join(problems)
                         + ". Refusing to fall back silently.")
    for config in lever_configs(recipe):
        try:
            config.check_inputs()
        except LeverError as exc:
            raise LeverError(f"recipe {recipe.name!r}: {exc}") from None


def apply_recipe_levers(pipe, recipe, *, device, model_sha256: str, is_tiny: bool,
                        reversible: bool = False, keep_on: str | None = "cpu", weight_source=None,
                        applied: dict[str, LeverHandle] | None = None) -> dict[str, LeverHandle]:
    """Apply every lever ``recipe`` switches on to ``pipe``; returns the handles by lever name. ``reversible`` keeps
    the float weights that quantization and the AdaLN precompute would drop (on ``keep_on``; None: where they are),
    and restores weights a fused LoRA changed from ``weight_source`` (or from a kept copy without one), so that removing
    the handles restores the model (benchmarks that measure several recipes on one model, a shared model); the runtime
    of one recipe drops them to save memory.

    ``applied``: levers already on the model, kept from the previous recipe of a shared model (the same config at the
    same step count); they are not applied again (their ``prepare`` settings are made again), and later levers build
    on their handles."""
    preflight(recipe, device)
    kept = dict(applied or {})
    ctx = ApplyContext(device=str(device), model_sha256=model_sha256, is_tiny=is_tiny, steps=recipe.steps,
                       reversible=reversible, keep_on=keep_on, weight_source=weight_source, handles=dict(kept))
    try:
        for config in lever_configs(recipe):
            config.prepare(pipe, ctx)
            if config.is_on() and config.name not in kept:
                ctx.handles[config.name] = config.apply(pipe, ctx)
    except BaseException as exc:
        # Any failure, not only a lever's own: an out-of-memory in the third lever once left the first one (the LoRA)
        # fused on a shared model with no handle to remove it, and every later request of that run was refused with
        # "lever 'lora' is already applied" (2026-12-06 H100 call of bench/device/gate_fraction.sh).
        for name, handle in reversed(list(ctx.handles.items())):
            if name in kept:
                continue
            try:
                handle.remove()
            except LeverError:
                pass  # irreversible levers (fused LoRA, dropped weights): the runtime is discarded anyway
        if isinstance(exc, LeverError):
            raise LeverError(f"recipe {recipe.name!r}: {exc}") from exc
        raise
    return ctx.handles


def shared_problems(recipe) -> list[str]:
    """Why ``recipe`` cannot run on a model several recipes share (its levers applied and removed between requests);
    empty when it can."""
    return [p for config in lever_configs(recipe) if config.is_on() for p in config.shared_problems()]


def lever_telemetry(handles: dict[str, LeverHandle], recipe=None, executed: "Executed | None" = None
                    ) -> dict[str, Any]:
    """Every lever by name: what its config reports for this request (the handle's telemetry, or ``{"applied":
    False}`` for a lever the recipe left off). Without ``recipe`` and ``executed`` (benchmarks that apply levers to
    a bare transformer), the handles' own telemetry."""
    if recipe is None or executed is None:
        return {name: (handles[name].telemetry() if name in handles else {"applied": False}) for name in LEVERS}
    return {config.name: config.telemetry(handles.get(config.name), executed) for config in lever_configs(recipe)}
