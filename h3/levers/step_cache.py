"""Step caches: diffusers' FirstBlockCache, MagCache and TaylorSeer through ``transformer.enable_cache``.

MiniMax-H3's modular denoise loop calls the transformer without ``cache_context``, and diffusers 0.42.1 has no block
metadata for ``MiniMaxH3TransformerBlock``; this lever registers the block (it returns the residual stream alone, like
Wan's) and wraps every transformer forward in a cache context carrying the step index. Per request the cache state is
reset, and the lever counts how many forwards computed the last block's feed-forward: a forward that did not is a
skipped (cached) step.

Seed 001: step caches need redundant steps, so they compete with distillation ("a 9-step schedule has no redundant
steps left to find"): pair them with full-step recipes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field

from h3.levers.base import (ApplyContext, LeverConfig, LeverError, LeverHandle, count_forward, counts,
                           drop_added_attributes, forget_empty_hook_registries, instance_attributes, mark_applied,
                           new_counter, uncount_forward, unmark_applied)

if TYPE_CHECKING:
    from h3.record import Executed

logger = logging.getLogger(__name__)

KINDS = ("fbc", "mag", "taylorseer")


class StepCacheConfig(LeverConfig):
    """Step caches from diffusers' hooks, through ``transformer.enable_cache`` (recipe section ``[cache]``)."""

    name = "cache"
    signoff_kind = "near"  # the judge a change of this lever implies (h3.recipe.lever_differences)
    signoff_why = "blocks reused from earlier steps of the same sample (stale-feature ghosts: seed 001)"

    kind: Literal["none", "fbc", "mag", "taylorseer"] = "none"
    threshold: float = Field(default=0.05, ge=0.0)
    """FirstBlockCache / MagCache threshold."""
    mag_ratios: list[float] | None = None
    """MagCache: the checkpoint's magnitude ratios (required unless ``calibrate``)."""
    calibrate: bool = False
    max_skip_steps: int = Field(default=3, ge=1)
    retention_ratio: float = Field(default=0.2, ge=0.0, le=1.0)
    cache_interval: int = Field(default=5, ge=1)
    """TaylorSeer: full computation every N steps."""
    disable_cache_before_step: int = Field(default=3, ge=0)
    """TaylorSeer: warm-up steps always computed."""
    max_order: int = Field(default=1, ge=0)

    def is_on(self) -> bool:
        return self.kind != "none"

    def apply(self, pipe, ctx: ApplyContext) -> "StepCacheHandle":
        return apply_step_cache(pipe.transformer, self, num_inference_steps=ctx.steps, device=ctx.device)

    def check_telemetry(self, telemetry: dict[str, Any], executed: "Executed") -> list[str]:
        """The configured cache kind; every forward of the request went through the cache and either computed or
        reused a cached step, and the first one computed (nothing is cached before it). How many are cached depends on
        the content (thresholds), so the count itself is reported, not checked."""
        problems = []
        if telemetry.get("kind") != self.kind:
            problems.append(f"recipe asks for cache kind {self.kind!r}, the lever ran {telemetry.get('kind')!r}")
        if executed.forward_passes > 0:
            (forwards, computed, cached), missing = counts(telemetry, "forwards", "computed_steps", "cached_steps")
            problems += missing
            if not missing:
                if forwards != executed.forward_passes:
                    problems.append(f"counted {forwards} forwards, the request ran {executed.forward_passes}")
                if computed + cached != forwards or computed < 1:
                    problems.append(f"{computed} computed + {cached} cached steps in {forwards} forwards (the first "
                                    "step always computes)")
        return problems

    def executed_flags(self, telemetry: dict[str, Any], executed: "Executed", recipe: Any = None) -> list[str]:
        """What ran as configured yet says the cache did nothing or everything (issue 50: ``fbc-cache`` on the
        trained tiny produced the baseline clip byte for byte and nothing said so): a request of more than one
        forward whose cache never hit (the clip is the uncached computation: the lever bought nothing), or hit on
        every step after the first (one computed step stands in for the whole schedule). Each with its hit count."""
        (forwards, computed, cached), missing = counts(telemetry, "forwards", "computed_steps", "cached_steps")
        if missing or forwards < 2:
            return []
        schedule = f"{self.kind} cache (threshold {self.threshold})" if self.kind in ("fbc", "mag") \
            else f"{self.kind} cache"
        if cached == 0:
            return [f"the {schedule} never hit: 0 hits in {forwards} forwards, every step computed (the clip is the "
                    "uncached computation; seed 001: a short schedule has no redundant steps to find)"]
        if computed == 1:
            return [f"the {schedule} hit on every step after the first: {cached} hits in {forwards} forwards, one "
                    "computed step stood in for the whole schedule"]
        return []


def _register_block_metadata() -> None:
    from diffusers.hooks._helpers import TransformerBlockMetadata, TransformerBlockRegistry
    from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3TransformerBlock

    TransformerBlockRegistry._register()
    if MiniMaxH3TransformerBlock not in TransformerBlockRegistry._registry:
        TransformerBlockRegistry.register(
            model_class=MiniMaxH3TransformerBlock,
            metadata=TransformerBlockMetadata(return_hidden_states_index=0, return_encoder_hidden_states_index=None),
        )


def diffusers_cache_config(config: StepCacheConfig, num_inference_steps: int = 28):
    from diffusers.hooks import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig

    if config.kind == "fbc":
        return FirstBlockCacheConfig(threshold=config.threshold)
    if config.kind == "mag":
        if config.mag_ratios is None and not config.calibrate:
            raise LeverError("cache.kind = 'mag' needs cache.mag_ratios for this checkpoint (or cache.calibrate = true "
                             "to measure them)")
        return MagCacheConfig(
            threshold=config.threshold, max_skip_steps=config.max_skip_steps, retention_ratio=config.retention_ratio,
            num_inference_steps=num_inference_steps, mag_ratios=config.mag_ratios, calibrate=config.calibrate,
        )
    if config.kind == "taylorseer":
        return TaylorSeerCacheConfig(
            cache_interval=config.cache_interval, disable_cache_before_step=config.disable_cache_before_step,
            max_order=config.max_order, taylor_factors_dtype=None,
            cache_identifiers=[r"transformer_blocks\.\d+\.attn", r"transformer_blocks\.\d+\.ff"],
        )
    raise LeverError(f"unknown cache.kind {config.kind!r}; one of {', '.join(KINDS)}")


class StepCacheHandle(LeverHandle):
    name = "cache"

    def __init__(self, transformer, config: StepCacheConfig, device: str | torch.device | None = None,
                 attributes_before: set[str] | None = None):
        super().__init__()
        self.transformer, self.config = transformer, config
        self.attributes_before = attributes_before
        self.step = 0
        self.forwards = 0
        # The first sub-layer of the last block's feed-forward runs only when that block really computed (a cache hook
        # replaces the block's or the feed-forward's forward; hooks on the replaced module itself would still fire).
        probe = transformer.transformer_blocks[-1].ff.net[0]
        # Counted inside compiled blocks too (new_counter, count_forward); forwards are counted on the never-compiled
        # transformer.
        self._computed_counter = new_counter(device or next(probe.parameters()).device)
        self._probe = probe
        count_forward(probe, self._computed_counter)
        self._hooks = [
            transformer.register_forward_pre_hook(self._enter),
            transformer.register_forward_hook(self._exit, always_call=True),
        ]

    def _enter(self, *_):
        from diffusers.hooks.hooks import CacheContext, _set_cache_context

        _set_cache_context(self.transformer, CacheContext("cond", step_index=self.step))
        self.forwards += 1

    def _exit(self, *_):
        from diffusers.hooks.hooks import _set_cache_context

        _set_cache_context(self.transformer, None)
        self.step += 1

    @property
    def computed(self) -> int:
        return int(self._computed_counter)

    def begin_request(self) -> None:
        self.transformer._reset_stateful_cache()
        self.step = self.forwards = 0
        self._computed_counter.zero_()

    def telemetry(self) -> dict[str, Any]:
        return {
            "applied": not self.removed,
            "kind": self.config.kind,
            "forwards": self.forwards,
            "computed_steps": self.computed,
            "cached_steps": self.forwards - self.computed,
        }

    def _remove(self) -> None:
        for h in self._hooks:
            h.remove()
        uncount_forward(self._probe)
        self.transformer.disable_cache()
        forget_empty_hook_registries(self.transformer)
        if self.attributes_before is not None:
            drop_added_attributes(self.transformer, self.attributes_before)
        unmark_applied(self.transformer, "cache")


def apply_step_cache(transformer, config: StepCacheConfig, *, num_inference_steps: int = 28,
                     device: str | torch.device | None = None) -> StepCacheHandle:
    """``num_inference_steps``: the DiT forwards per request, which MagCache's ratios are laid out over (MagCache
    only; 28 is diffusers' default)."""
    if config.kind not in KINDS:
        raise LeverError(f"unknown cache.kind {config.kind!r}; one of {', '.join(KINDS)}")
    _register_block_metadata()
    diff_config = diffusers_cache_config(config, num_inference_steps)
    before = instance_attributes(transformer)
    mark_applied(transformer, "cache")
    try:
        transformer.enable_cache(diff_config)
    except BaseException:
        unmark_applied(transformer, "cache")
        raise
    return StepCacheHandle(transformer, config, device, before)
