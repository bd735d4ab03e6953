"""The levers: each one file, an ``XConfig`` + ``apply_x(target, config) -> handle`` with ``remove()`` and
``telemetry()``. :func:`apply_recipe_levers` applies the ones a recipe switches on, in an order where each composes
with the ones before it:

1. ``lora`` (step distillation) — changes the weights the next two read;
2. ``adaln`` (modulation precompute) — its tables include the LoRA's effect on ``adaln_proj``;
3. ``quant`` (linear quantization);
4. ``attention`` (backend), 5. ``bucketing``, 6. ``sparse_attention`` — the last two install attention processors that
   keep the backend of step 4 for their dense calls;
7. ``cache`` (step caches), 8. ``offload`` (group offloading), 9. ``compile`` (regional torch.compile, last so that it
   traces the final modules), 10. ``vae`` (tiles per resolution, residency).

Every lever is named in ``executed.levers`` of each clip record: ``{"applied": false}`` when the recipe has it off.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from h3.levers.base import LeverError, LeverHandle

logger = logging.getLogger(__name__)

LEVERS = ("lora", "adaln", "quant", "attention", "bucketing", "sparse_attention", "cache", "offload", "compile", "vae")

__all__ = ["LEVERS", "LeverError", "LeverHandle", "apply_recipe_levers", "keeps_on_cpu", "lever_telemetry"]


def keeps_on_cpu(recipe, component: str) -> bool:
    """Whether the runtime must leave ``component`` on the CPU at load (the offload lever moves it per group)."""
    if not recipe.offload.enabled:
        return False
    return component == "transformer" or (component == "text_encoder" and recipe.offload.text_encoder)


def _cache_dir() -> Path:
    return Path(os.environ.get("H3_CACHE_DIR", Path.home() / ".cache" / "h3"))


def preflight(recipe, device) -> None:
    """Refuse, before any weight loads, a recipe whose levers cannot run on ``device`` (no silent fallback) or whose
    LoRA file is missing."""
    from h3.levers.attention_backend import CUDA_ONLY

    on_cuda = str(device).startswith("cuda")
    problems = []
    if recipe.quant.mode == "fp8_w8a8" and not on_cuda:
        problems.append("quant.mode = 'fp8_w8a8' needs a GPU with FP8 tensor cores (Hopper/Ada)")
    if recipe.attention.backend in CUDA_ONLY and not on_cuda:
        problems.append(f"attention.backend = {recipe.attention.backend!r} needs a CUDA GPU")
    if recipe.offload.enabled and recipe.offload.use_stream and not on_cuda:
        problems.append("offload.use_stream (prefetch on a side CUDA stream) needs a CUDA GPU")
    if problems:
        raise LeverError(f"recipe {recipe.name!r} cannot run on {device}: " + "; ".join(problems)
                         + ". Refusing to fall back silently.")
    if recipe.lora.enabled and recipe.lora.path == "@turbo4-tiny":
        from h3.tiny_trained import TURBO4_LORA_FILE

        if not TURBO4_LORA_FILE.is_file():
            raise LeverError(f"recipe {recipe.name!r}: LoRA file {TURBO4_LORA_FILE} (lora.path = '@turbo4-tiny') does "
                             "not exist; it ships with the trained tiny preset (python -m h3.train exports it)")
    elif recipe.lora.enabled and recipe.lora.path != "@tiny":
        from h3.levers.lora import resolve_lora_path

        try:
            resolve_lora_path(recipe.lora.path, is_tiny=False)
        except LeverError as exc:
            raise LeverError(f"recipe {recipe.name!r}: {exc}") from None


def apply_recipe_levers(pipe, recipe, *, device, model_sha256: str, is_tiny: bool,
                        reversible: bool = False) -> dict[str, LeverHandle]:
    """Apply every lever ``recipe`` switches on to ``pipe``; returns the handles by lever name. ``reversible`` keeps
    the float weights that quantization and the AdaLN precompute would drop, so that removing the handles restores
    the model (benchmarks that measure several recipes on one model); the runtime drops them to save memory."""
    preflight(recipe, device)
    handles: dict[str, LeverHandle] = {}
    transformer = pipe.transformer
    device = str(device)
    try:
        weights_tag = ""
        if recipe.lora.enabled:
            from h3.levers.lora import LoraLeverConfig, apply_lora

            handles["lora"] = apply_lora(
                pipe, LoraLeverConfig(path=recipe.lora.path, scale=recipe.lora.scale, fuse=recipe.lora.fuse,
                                      adapter_name=recipe.lora.adapter_name),
                is_tiny=is_tiny,
            )
            from h3.atomic import sha256_file

            weights_tag = f"lora={sha256_file(handles['lora'].path)};scale={recipe.lora.scale};fuse={recipe.lora.fuse}"
        if recipe.adaln.precompute:
            from h3.levers.adaln import AdalnPrecomputeConfig, apply_adaln_precompute

            handles["adaln"] = apply_adaln_precompute(
                pipe,
                AdalnPrecomputeConfig(
                    num_inference_steps=recipe.num_inference_steps, model_sha256=model_sha256,
                    weights_tag=weights_tag, cache_dir=_cache_dir() / "adaln" if recipe.adaln.disk_cache else None,
                    compute_device=device,
                ),
                keep_originals=reversible,
            )
        if recipe.quant.mode != "none":
            from h3.levers.quantization import QuantizationConfig, apply_quantization

            handles["quant"] = apply_quantization(
                transformer, QuantizationConfig(mode=recipe.quant.mode, exclude=list(recipe.quant.exclude),
                                                keep_originals=reversible, compute_device=device),
            )
        backend = recipe.attention.backend
        if backend != "native":
            from h3.levers.attention_backend import AttentionBackendConfig, apply_attention_backend

            handles["attention"] = apply_attention_backend(transformer, AttentionBackendConfig(backend), device)
        if recipe.bucketing.enabled:
            from h3.levers.bucketing import BucketingConfig, apply_bucketing

            handles["bucketing"] = apply_bucketing(transformer, BucketingConfig(multiple=recipe.bucketing.multiple))
        if recipe.sparse_attention.enabled:
            from h3.levers.sparse_attention import SparseAttentionConfig, apply_sparse_attention

            sa = recipe.sparse_attention
            handles["sparse_attention"] = apply_sparse_attention(
                transformer, SparseAttentionConfig(block_size=sa.block_size, sparsity=sa.sparsity,
                                                   dense_steps=sa.dense_steps, dense_layers=list(sa.dense_layers)),
            )
        if recipe.cache.kind != "none":
            from h3.levers.step_cache import StepCacheConfig, apply_step_cache

            c = recipe.cache
            handles["cache"] = apply_step_cache(
                transformer,
                StepCacheConfig(kind=c.kind, threshold=c.threshold, num_inference_steps=recipe.steps,
                                mag_ratios=c.mag_ratios, calibrate=c.calibrate, max_skip_steps=c.max_skip_steps,
                                retention_ratio=c.retention_ratio, cache_interval=c.cache_interval,
                                disable_cache_before_step=c.disable_cache_before_step, max_order=c.max_order),
            )
        if recipe.offload.enabled:
            from h3.levers.offload import OffloadConfig, apply_offload

            o = recipe.offload
            handles["offload"] = apply_offload(
                pipe, OffloadConfig(onload_device=device, num_blocks_per_group=o.num_blocks_per_group,
                                    use_stream=o.use_stream, record_stream=o.record_stream, text_encoder=o.text_encoder,
                                    resident_top_level=o.resident_top_level),
            )
        if recipe.compile.enabled:
            from h3.levers.compile import CompileConfig, apply_compile

            cc = recipe.compile
            handles["compile"] = apply_compile(
                transformer, CompileConfig(backend=cc.backend, mode=cc.mode, fullgraph=cc.fullgraph, dynamic=cc.dynamic)
            )
            # Call counters inside compiled blocks stay frozen (see QuantizedLinear.forward); say so, not "0 calls".
            for name in ("quant", "lora"):
                if name in handles:
                    handles[name].compiled = True
        if recipe.vae.tiles or not recipe.vae.resident:
            from h3.levers.vae import VaeTilingConfig, apply_vae

            handles["vae"] = apply_vae(pipe, VaeTilingConfig(tiles=dict(recipe.vae.tiles),
                                                              resident=recipe.vae.resident, device=device))
    except LeverError as exc:
        for handle in reversed(handles.values()):
            try:
                handle.remove()
            except LeverError:
                pass  # irreversible levers (fused LoRA, dropped weights): the runtime is discarded anyway
        raise LeverError(f"recipe {recipe.name!r}: {exc}") from exc
    return handles


def lever_telemetry(handles: dict[str, LeverHandle]) -> dict[str, Any]:
    """Every lever by name: the handle's telemetry, or ``{"applied": False}`` for a lever the recipe left off."""
    return {name: (handles[name].telemetry() if name in handles else {"applied": False}) for name in LEVERS}
