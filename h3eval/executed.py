"""Configured versus executed: does a clip record show that what ran is what its recipe asked for?

The runtime reports what it ran in every clip record (``executed``: DiT forwards, the attention backends diffusers
dispatched, dtype, VAE tiling, and each lever's telemetry). :func:`check_executed` compares that with the recipe:
the settings that are not levers here (name, steps, dtype), every lever through its own config's
``check_executed`` (``h3/levers/<lever>.py``). Every backend's clips go through it (``h3eval ab``, ``generate``,
``floor``): a mismatch removes the clip and stops the recipe.
"""

from __future__ import annotations

import logging

from h3.levers import lever_configs
from h3.record import ClipRecord
from h3.recipe import Recipe

logger = logging.getLogger(__name__)
_LOGGED: set[tuple[str, str]] = set()
"""(recipe hash, flag) already logged by :func:`check_executed` in this process (one warning per distinct flag, not
one per clip)."""

UNVERIFIED = "the backend did not report what executed (foreign server): configured-versus-executed unverified"


def check_executed(recipe: Recipe, record: ClipRecord) -> list[str]:
    """Every way ``record`` ran something other than ``recipe``; empty when what ran is what was configured.

    Checks the recipe name, forward passes == ``recipe.steps``, the transformer dtype, then each lever of the recipe
    against ``executed`` through the lever's own ``check_executed``: applied exactly when the recipe switches it on,
    and what its telemetry must show for its configuration (the LoRA: every module the file targets matched; the
    quantization: its mode on every quantized module, each of which ran; block-sparse attention: the dense first
    steps and a realized sparsity near the configured one; the attention backend the dispatcher ran; compiled
    regions; cached and computed steps; offload groups; the VAE tile per resolution; the buckets), and lever
    telemetry the recipe does not configure. A record whose producer did not report what ran (a foreign server)
    gives one problem saying so (:data:`UNVERIFIED`): it is unverified, not verified.

    What ran as configured but is a known recipe bug (:func:`executed_flags`: a cache's hit count, a LoRA's scale,
    sparse audio queries, quantization on few linears) is logged as a warning, once per distinct flag and recipe in
    a process; it is not a problem (the clip stays).
    """
    if "executed" in (record.extra or {}).get("unreported", []):
        return [UNVERIFIED]
    ex = record.executed
    problems = []
    if record.recipe_name != recipe.name:
        problems.append(f"record is of recipe {record.recipe_name!r}, not {recipe.name!r}")
    if ex.forward_passes != recipe.steps:
        problems.append(f"steps: recipe asks for {recipe.steps} DiT forward passes, {ex.forward_passes} ran")
    # The runtime may be told to run the transformer in another dtype than the recipe's (H3Runtime.load's
    # ``transformer_dtype``: the parallel check's higher-precision floor twin); the record then names it, and what
    # ran is checked against that.
    wanted = (record.extra or {}).get("transformer_dtype") or recipe.dtype
    if ex.torch_dtype != wanted:
        asked = f"recipe asks for {recipe.dtype}" + (f" (the runtime for {wanted})" if wanted != recipe.dtype else "")
        problems.append(f"dtype: {asked}, the transformer ran in {ex.torch_dtype}")
    configured = lever_configs(recipe)
    for config in configured:
        problems.extend(config.check_executed(ex.levers.get(config.name), ex))
    for name in ex.levers:
        if name not in {config.name for config in configured}:
            problems.append(f"{name}: the runtime reported lever telemetry the recipe does not configure: "
                            f"{ex.levers[name]}")
    for flag in executed_flags(recipe, record):
        key = (recipe.sha256(), flag)
        if key not in _LOGGED:
            _LOGGED.add(key)
            logger.warning("recipe %r: %s (configured-versus-executed flag; the clip is kept)", recipe.name, flag)
    return problems


QUANT_FLAG_SHARE = 0.5
"""The executed check flags a quantization recipe that runs its mode on fewer than this share of the transformer's
linears (the rest kept in floating point by ``quant.exclude`` or skipped for the kernel's shape)."""


def executed_flags(recipe: Recipe, record: ClipRecord) -> list[str]:
    """What ran as configured yet is a known recipe bug from the field (issue 50), one line each, the lever named:
    a step cache that never hit or hit on every step (with its hit count), a LoRA whose effective scale is more than
    2x off the file's own alpha / rank or that loads part of its modules, sparse attention on the audio queries, and
    quantization configured but not running on most of the model (from its telemetry's module counts).

    Unlike :func:`check_executed` these do not remove the clip or stop the recipe: the recipe asked for exactly this
    (the signoff judges what it does to the clips); they say why a verdict should be read with care, and a plant of
    the recipe-bug corpus (bench/recipe_bugs) that changes nothing the clip shows is still named here. Each lever's
    config says its own (``executed_flags``); the quantization lever's are read here from the counts it reports."""
    if "executed" in (record.extra or {}).get("unreported", []):
        return []
    ex = record.executed
    flags = []
    for config in lever_configs(recipe):
        telemetry = ex.levers.get(config.name)
        if not config.is_on() or not isinstance(telemetry, dict) or telemetry.get("applied") is not True:
            continue  # a lever that did not run as configured is check_executed's problem, not a flag
        method = getattr(config, "executed_flags", None)
        if method is not None:
            flags += [f"{config.name}: {flag}" for flag in method(telemetry, ex, recipe)]
        if config.name == "quant":
            flags += [f"quant: {flag}" for flag in quantization_flags(config.mode, telemetry)]
    return flags


def quantization_flags(mode: str, telemetry: dict) -> list[str]:
    """FP8/INT8 configured but not running on most of the model: the lever's counts of quantized linears against
    those it kept in floating point (excluded by pattern, skipped for the kernel's shape: the silent fallback)."""
    keys = ("quantized_modules", "excluded_modules", "skipped_shape")
    values = [telemetry.get(k) for k in keys]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        return [f"reported no module counts ({dict(zip(keys, values))}): whether {mode} ran on the model is unknown"]
    quantized, excluded, skipped = values
    total = quantized + excluded + skipped
    if total and quantized < QUANT_FLAG_SHARE * total:
        return [f"{mode} is configured but runs on {quantized} of the transformer's {total} linears ({excluded} kept "
                f"in floating point by quant.exclude, {skipped} skipped for the kernel's shape): most of the model "
                "is not quantized"]
    return []


def is_unverified(problems: list[str]) -> bool:
    """Whether the only problem is that nobody reported what ran (kept, and the speed summary says unverified)."""
    return bool(problems) and all(p == UNVERIFIED for p in problems)


def run_executed_flags(store, manifest, recipe_name: str) -> list[str]:
    """The configured-versus-executed flags (:func:`executed_flags`) of one recipe's quality clips in a run, each
    distinct flag once with the clips it was raised on (``step_cache: ... (16 of 16 clips)``), in the order first
    seen. Empty when none was raised, when the run's recipe is not one this suite computes (imported clips: what
    ran is not reported), or when no record is readable."""
    from h3.recipe import RecipeError, recipe_from_dict
    from h3eval.store import RecordError, read_clip_record

    data = manifest.recipes.get(recipe_name)
    if not isinstance(data, dict):
        return []
    try:
        recipe = recipe_from_dict(data)
    except RecipeError:
        return []
    counts: dict[str, int] = {}
    clips = 0
    for path in store.clip_record_paths(recipe_name):
        try:
            record = read_clip_record(path)
        except RecordError:
            continue
        clips += 1
        for flag in dict.fromkeys(executed_flags(recipe, record)):
            counts[flag] = counts.get(flag, 0) + 1
    return [f"{flag} ({n} of {clips} clips)" for flag, n in counts.items()]


def executed_summary_line(store, manifest) -> str:
    """One line for ``h3eval ab``'s closing summary: each recipe's configured-versus-executed flags, or that none
    was raised."""
    names = [n for n in [manifest.baseline, *manifest.candidates] if n is not None]
    found = {name: run_executed_flags(store, manifest, name) for name in names}
    flagged = {name: flags for name, flags in found.items() if flags}
    if not flagged:
        return f"configured versus executed: no flag on {', '.join(names)}"
    return "configured versus executed: " + " | ".join(f"{name}: {'; '.join(flags)}" for name, flags in flagged.items())
