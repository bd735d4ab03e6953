"""Step distillation: a few-step LoRA through diffusers' MiniMax-H3 LoRA loader, unfused or fused into the weights.

Seed 001 hit two loader bugs: an adapter that matched 0 of 266 layers (different layer names) and loaded "without
complaint", and a scale 16x too strong. So this lever counts the modules the adapter matched against the modules the
file names, refuses a LoRA that matches none, and reports the per-module ``alpha / rank`` scaling it ended up with
(diffusers honours per-module alphas and a ``__metadata__`` ``alpha``; ``scale`` multiplies on top) beside the
file's own ``alpha / rank`` read from the file itself: the effective scale, and its ratio to the file's, are in every
clip record, and the executed check flags a ratio beyond :data:`SCALE_FLAG_RATIO` (issue 50).

The file's own scales and byte-stable writing are h3.levers.lora_files'; the ``@`` names (``@tiny``, ``@turbo4-tiny``)
h3.levers.lora_presets'; the seeded LoRAs the tests and rehearsals use, h3.train.seeded_lora.

``include`` loads only the file's modules whose (diffusers) name matches one of its patterns: a real setting (a LoRA
applied to some blocks only), and the way a recipe expresses a LoRA that adapts half of the layers it was trained on.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import Field, field_validator, model_serializer

from h3.levers.base import (ApplyContext, LeverConfig, LeverError, LeverHandle, count_forward, counts,
                           drop_added_attributes, instance_attributes, mark_applied, new_counter, uncount_forward,
                           unmark_applied)
from h3.levers.lora_files import file_scales, save_lora_file
from h3.levers.lora_presets import TINY_LORA, TRAINED_LORAS, preset_lora_path, trained_lora_file

if TYPE_CHECKING:
    from h3.record import Executed

logger = logging.getLogger(__name__)

SCALE_FLAG_RATIO = 2.0
"""The executed check flags a LoRA whose effective scale (peft's ``alpha / rank`` x the recipe's ``scale``, per module)
sits more than this factor above or below the file's own ``alpha / rank`` (seed 001: a scale 16x too strong produced
visibly corrupted video; issue 18's LoRA at 0.3 drew worse clips)."""


class LoraConfig(LeverConfig):
    """Step distillation: a few-step LoRA loaded through diffusers' MiniMax-H3 LoRA loader (recipe section
    ``[lora]``)."""

    name = "lora"
    signoff_kind = "resample"  # the judge a change of this lever implies (h3.recipe.lever_differences)
    signoff_why = "a distillation LoRA changes the weights: another sample of the prompt (seed 000: 29 -> 4 steps)"

    enabled: bool = False
    path: str | None = None
    """LoRA file (.safetensors, diffusers/PEFT or original MiniMax-H3 names); ``$VARS`` are expanded. ``@tiny`` is
    the seeded demo LoRA of the tiny preset (refused on a real checkpoint)."""
    scale: float | None = None
    """Adapter weight on top of the file's own ``alpha / rank``; None keeps the file's (alpha or metadata) scale."""
    fuse: bool = False
    """Fuse the adapter into the base weights at load time (no per-step LoRA matmuls) instead of running it unfused."""
    adapter_name: str = "distill"
    include: list[str] = Field(default_factory=list)
    """Regular expressions (``re.search``) over the diffusers names of the modules the file adapts
    (``transformer_blocks.0.attn.to_q``): only those load; empty loads every module of the file. A pattern list that
    selects none of them is refused like a LoRA that matches no layer."""

    @field_validator("include")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression ({exc})") from None
        return value

    @model_serializer(mode="wrap")
    def _omit_default_include(self, handler):
        # ``include`` was added after recipes were hashed and clips recorded: left at its default (every module), it
        # stays out of the resolved recipe, so those recipes keep their hash (the computation is the same).
        data = handler(self)
        if isinstance(data, dict) and not self.include:
            data.pop("include", None)
        return data

    def is_on(self) -> bool:
        return self.enabled

    def check_inputs(self) -> None:
        if not self.enabled or self.path == TINY_LORA:
            return
        if self.path in TRAINED_LORAS:  # the model is checked at load; here only that the file shipped
            if not trained_lora_file(self.path).is_file():
                raise LeverError(f"LoRA file {trained_lora_file(self.path)} ({self.name}.path = '{self.path}') does "
                                 "not exist; it ships with the trained tiny preset (python -m h3.train exports it)")
            return
        resolve_lora_path(self.path, is_tiny=False, section=self.name)

    def apply(self, pipe, ctx: ApplyContext) -> "LoraHandle":
        return apply_lora(pipe, self, is_tiny=ctx.is_tiny, device=ctx.device, reversible=ctx.reversible,
                          keep_on=ctx.keep_on, weight_source=ctx.weight_source)

    def check_telemetry(self, telemetry: dict[str, Any], executed: "Executed") -> list[str]:
        """Every module the adapter file targets matched a transformer module (seed 001: a LoRA that matched 0 of 266
        layers "loaded without complaint"; one that matches some of them is as wrong), fused as configured, at the
        configured adapter weight; unfused, its LoRA layers ran in the request. With ``include``, every module it
        selects matched (a partial selection is the recipe's, flagged by :meth:`executed_flags`)."""
        (targeted, matched), problems = counts(telemetry, "file_modules", "matched_modules")
        if not problems:
            selected = telemetry.get("selected_modules", targeted) if self.include else targeted
            if targeted < 1:
                problems.append("the adapter file targets no module")
            elif isinstance(selected, bool) or not isinstance(selected, int):
                problems.append(f"reported no integer selected_modules ({selected!r})")
            elif matched != selected:
                which = "lora.include selects" if self.include else "the adapter file targets"
                problems.append(f"matched {matched} of the {selected} modules {which} "
                                f"({selected - matched} unmatched): the adapter did not load as trained")
        if list(telemetry.get("include", [])) != list(self.include):
            problems.append(f"recipe includes {list(self.include)}, the lever loaded with {telemetry.get('include')!r}")
        if telemetry.get("fused") is not self.fuse:
            problems.append(f"recipe asks for fuse={self.fuse}, the lever reported fused={telemetry.get('fused')!r}")
        weight = 1.0 if self.scale is None else self.scale
        if telemetry.get("adapter_weight") != weight:
            problems.append(f"recipe asks for adapter weight {weight}, the lever reported "
                            f"{telemetry.get('adapter_weight')!r}")
        if not self.fuse and executed.forward_passes > 0:
            (calls,), missing = counts(telemetry, "lora_layer_calls")
            problems += missing
            if not missing and calls < 1:
                problems.append(f"no LoRA layer ran in {executed.forward_passes} DiT forwards (unfused adapter)")
        return problems

    def executed_flags(self, telemetry: dict[str, Any], executed: "Executed", recipe: Any = None) -> list[str]:
        """What ran as configured yet is a known recipe bug: an effective scale more than :data:`SCALE_FLAG_RATIO`
        off the file's own ``alpha / rank`` (seed 001's 16x; a scale that ignores the file's alpha), and an
        ``include`` that loads only part of the modules the file adapts (seed 001's adapter that matched 0 of 266:
        the partial form of it)."""
        flags = []
        ratio = telemetry.get("scale_ratio")
        if _finite_pair(ratio) and (ratio[0] < 1 / SCALE_FLAG_RATIO or ratio[1] > SCALE_FLAG_RATIO):
            low, high = ratio
            span = f"{_g(low)}x" if low == high else f"{_g(low)}x to {_g(high)}x"
            flags.append(f"effective scale {_span(telemetry.get('effective_scale'))} is {span} the file's own alpha / "
                         f"rank {_span(telemetry.get('file_scale'))} (more than {_g(SCALE_FLAG_RATIO)}x off; "
                         "seed 001: a LoRA 16x too strong corrupted the video)")
        elif ratio is not None and not _finite_pair(ratio):
            flags.append(f"reported no finite scale_ratio ({ratio!r}): the LoRA's effective scale is unknown")
        (targeted,), missing = counts(telemetry, "file_modules")
        selected = telemetry.get("selected_modules")
        if not missing and isinstance(selected, int) and not isinstance(selected, bool) and selected < targeted:
            flags.append(f"loads {selected} of the {targeted} modules the adapter file adapts (lora.include = "
                         f"{list(self.include)}): the adapter runs on part of the layers it was trained on")
        return flags


def _finite_pair(value: Any) -> bool:
    import math

    return (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                    for v in value) and value[0] <= value[1])


def _g(value: float) -> str:
    return f"{value:.4g}"


def _span(value: Any) -> str:
    if _finite_pair(value):
        return _g(value[0]) if value[0] == value[1] else f"{_g(value[0])}..{_g(value[1])}"
    return repr(value)


def _ratio_range(layers: dict[str, Any], adapter: str, path: Path) -> tuple[list[float], list[float], list[float]]:
    """(the file's own alpha / rank, the effective scale, their ratio), each as [min, max] over the loaded modules.

    Matched by rank: without per-module alphas the file's scale depends on a module's rank alone. With per-module
    ``.alpha`` tensors diffusers folds each into the factors (peft then scales by the recipe's weight alone), so the
    effective scale is the file's times peft's scaling."""
    scales, folded = file_scales(path)
    by_rank: dict[int, set[float]] = {}
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        for key in handle.keys():
            if key.endswith((".lora_A.weight", ".lora_down.weight")):
                module = key.split(".lora_")[0]
                by_rank.setdefault(handle.get_slice(key).get_shape()[0], set()).add(scales[module])
    file_values = sorted({v for values in by_rank.values() for v in values})
    effective, ratios = [], []
    for layer in layers.values():
        scaling = float(layer.scaling[adapter])
        if folded:
            ratios.append(scaling)
            effective.extend(scaling * v for v in file_values)
            continue
        own = by_rank.get(int(layer.r[adapter]))
        if own is None or len(own) != 1:
            own = set(file_values)  # a rank the file does not hold (a converted fused projection): every value
        for value in own:
            effective.append(scaling)
            ratios.append(scaling / value)
    span = lambda v: [min(v), max(v)] if v else None  # noqa: E731
    return span(file_values), span(effective), span(ratios)


def resolve_lora_path(path: str | None, *, is_tiny: bool, transformer: torch.nn.Module | None = None,
                      section: str = "lora") -> Path:
    """The LoRA file a recipe names (in its ``section``), or a LeverError naming the missing file."""
    if not path:
        raise LeverError(f"{section}.enabled is true but {section}.path is empty; name the LoRA file")
    preset = preset_lora_path(path, is_tiny=is_tiny, transformer=transformer, section=section)
    if preset is not None:  # ``@tiny``, ``@turbo4-tiny``, ...: h3.levers.lora_presets
        return preset
    expanded = os.path.expandvars(os.path.expanduser(path))
    if "$" in expanded:
        raise LeverError(
            f"LoRA path {path!r} (recipe key {section}.path) names an environment variable that is not set "
            f"({expanded!r}); set it to the folder holding the few-step LoRA. Refusing to run the recipe without it."
        )
    resolved = Path(expanded)
    if not resolved.is_file():
        raise LeverError(
            f"LoRA file {resolved} (recipe key {section}.path = {path!r}) does not exist; put the LoRA "
            f"(.safetensors) there or point {section}.path at it. Refusing to run the recipe without it."
        )
    return resolved


_ABSENT = object()

TURBO_LORA_FILE = "minimax-h3-turbo-4step.safetensors"
"""The file name the shipped turbo recipes read under ``$H3_LORA_DIR``."""
def _lora_layers(transformer: torch.nn.Module, adapter: str) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in transformer.named_modules() if isinstance(m, LoraLayer) and adapter in m.lora_A}


class LoraHandle(LeverHandle):
    name = "lora"

    def __init__(self, pipe, config: LoraConfig, path: Path, file_modules: list[str], matched: list[str],
                 scalings: list[float], device: str | torch.device | None = None,
                 fused_weights: list[str] | None = None, weight_source=None,
                 originals: dict[str, torch.Tensor] | None = None, selected: list[str] | None = None,
                 scale_ranges: tuple[Any, Any, Any] = (None, None, None)):
        super().__init__()
        self.name = config.name  # lora, or compensation_lora (the same mechanism, a second adapter)
        self.pipe, self.config, self.path = pipe, config, path
        self.file_modules, self.matched, self.scalings = file_modules, matched, scalings
        self.selected = file_modules if selected is None else selected
        self.file_scale, self.effective_scale, self.scale_ratio = scale_ranges
        self.fused_weights = fused_weights
        """Reversible fused form: the transformer weights the fuse changed in place (restored on ``remove()``)."""
        self.weight_source, self.originals = weight_source, originals or {}
        self.merged_before: Any = _ABSENT
        self.attributes_before: set[str] | None = None
        self.requires_grad: dict[str, bool] = {}
        self._counted: list[torch.nn.Module] = []
        self._counters: list[torch.Tensor] = []
        if not config.fuse:
            for layer in _lora_layers(pipe.transformer, config.adapter_name).values():
                # Counted inside compiled graphs too (new_counter, count_forward).
                counter = new_counter(device or next(layer.parameters()).device)
                count_forward(layer, counter)
                self._counted.append(layer)
                self._counters.append(counter)

    @property
    def calls(self) -> int:
        """LoRA-layer calls since :meth:`begin_request` (every layer, eager and compiled)."""
        return sum(int(c) for c in self._counters)

    @property
    def weights_tag(self) -> str:
        """What this LoRA did to the weights (file hash, scale, fused), for caches keyed by the weights (AdaLN)."""
        from h3.atomic import sha256_file

        tag = f"lora={sha256_file(self.path)};scale={self.config.scale};fuse={self.config.fuse}"
        return tag + (f";include={self.config.include}" if self.config.include else "")

    def begin_request(self) -> None:
        for counter in self._counters:
            counter.zero_()

    def telemetry(self) -> dict[str, Any]:
        return {
            "applied": not self.removed,
            "path": str(self.path),
            "file_modules": len(self.file_modules),
            "include": list(self.config.include),
            "selected_modules": len(self.selected),
            "matched_modules": len(self.matched),
            "unmatched_modules": len(self.selected) - len(self.matched),
            "fused": self.config.fuse,
            "adapter_weight": 1.0 if self.config.scale is None else self.config.scale,
            "scaling": sorted(set(self.scalings)),
            # [min, max] over the modules: the file's own alpha / rank (read from the file), the scale that multiplied
            # B @ A (peft's, before any fuse), and their ratio (issue 50: flagged beyond SCALE_FLAG_RATIO).
            "file_scale": self.file_scale,
            "effective_scale": self.effective_scale,
            "scale_ratio": self.scale_ratio,
            "lora_layer_calls": self.calls,
        }

    def held_tensors(self) -> list[torch.Tensor]:
        return list(self.originals.values())

    @torch.no_grad()
    def _remove(self) -> None:
        for layer in self._counted:
            uncount_forward(layer)
        self._counted = []
        if self.config.fuse:
            if self.fused_weights is None:
                raise LeverError("a fused LoRA is part of the weights now; reload the model to remove it (or apply it "
                                 "reversibly: a shared model reads the weights again from their source)")
            transformer = self.pipe.transformer
            if self.weight_source is not None:
                self.weight_source.restore("transformer", transformer, self.fused_weights)
            else:
                for name in self.fused_weights:
                    transformer.get_parameter(name).copy_(self.originals[name])
                self.originals.clear()
            if self.merged_before is _ABSENT:
                vars(self.pipe).pop("_merged_adapters", None)
            else:
                self.pipe._merged_adapters = self.merged_before
        else:
            self.pipe.unload_lora_weights()
        # peft left the base weights frozen and diffusers its adapter bookkeeping on the transformer: as loaded again.
        transformer = self.pipe.transformer
        for name, param in transformer.named_parameters():
            if name in self.requires_grad:
                param.requires_grad_(self.requires_grad[name])
        if self.attributes_before is not None:
            drop_added_attributes(transformer, self.attributes_before)
        unmark_applied(transformer, self.config.name)


def apply_lora(pipe, config: LoraConfig, *, is_tiny: bool = False, device: str | torch.device | None = None,
               reversible: bool = False, keep_on: str | None = "cpu", weight_source=None) -> LoraHandle:
    """Load ``config.path`` into ``pipe.transformer``; fuse it when asked. Refuses a LoRA that matches no module.

    ``device``: where the LoRA layers' call counters live (the runtime's device; None: the layers' own).
    ``reversible`` with ``fuse``: the weights the fuse changes in place are restored on ``remove()``, read again from
    ``weight_source`` (:mod:`h3.weights`), or without one from copies kept on ``keep_on`` (None: beside them). Exact:
    unfusing by subtraction is not (``W + s·BA - s·BA`` is not ``W`` in floating point)."""
    from diffusers.loaders.lora_pipeline import MiniMaxH3LoraLoaderMixin

    transformer = pipe.transformer
    path = resolve_lora_path(config.path, is_tiny=is_tiny, transformer=transformer, section=config.name)
    attributes_before = instance_attributes(transformer)
    requires_grad = {name: p.requires_grad for name, p in transformer.named_parameters()}
    mark_applied(transformer, config.name)
    try:
        state, _ = MiniMaxH3LoraLoaderMixin.lora_state_dict(str(path), return_lora_metadata=True)
        module_of = lambda key: key.removeprefix("transformer.").split(".lora_")[0]  # noqa: E731
        file_modules = sorted({module_of(k) for k in state if "lora_" in k})
        selected = file_modules
        if config.include:
            patterns = [re.compile(p) for p in config.include]
            selected = [m for m in file_modules if any(p.search(m) for p in patterns)]
            if not selected:
                raise LeverError(
                    f"{config.name}.include = {list(config.include)} selects 0 of the {len(file_modules)} modules LoRA "
                    f"{path} adapts (e.g. {file_modules[:2]}). Refusing to run without the adapter."
                )
        names = {n for n, _ in transformer.named_modules()}
        matched_names = [m for m in selected if m in names]
        if not matched_names:
            raise LeverError(
                f"LoRA {path} matches 0 of its {len(file_modules)} modules in the transformer (first names in the "
                f"file: {file_modules[:3]}; the transformer has e.g. 'transformer_blocks.0.attn.to_q'). Refusing to "
                "run without the adapter."
            )
        if len(selected) < len(file_modules):
            # Only the selected modules: written again in diffusers' layout with the file's metadata (its alpha, which
            # diffusers reads from the file; a state dict handed over directly would load at alpha == rank), and the
            # per-module alphas diffusers already folded into the factors kept out of it.
            _, folded = file_scales(path)
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as handle:
                metadata = dict(handle.metadata() or {})
            if folded:
                metadata.pop("alpha", None)
            keep = set(selected)
            part = {(k if k.startswith("transformer.") else f"transformer.{k}"): v.contiguous()
                    for k, v in state.items() if "lora_" in k and module_of(k) in keep}
            with tempfile.TemporaryDirectory(prefix="h3-lora-include-") as tmp:
                filtered = save_lora_file(Path(tmp) / "selected.safetensors", part, metadata)
                pipe.load_lora_weights(str(filtered), adapter_name=config.adapter_name)
        else:
            pipe.load_lora_weights(str(path), adapter_name=config.adapter_name)
        layers = _lora_layers(transformer, config.adapter_name)
        if not layers:
            raise LeverError(f"LoRA {path}: diffusers loaded it but no LoRA layer was created; refusing")
        if config.scale is not None:
            pipe.set_adapters([config.adapter_name], adapter_weights=[config.scale])
        # peft's per-module scaling: adapter weight x alpha / rank, what multiplies B @ A in the forward.
        scalings = [float(layer.scaling[config.adapter_name]) for layer in layers.values()]
        scale_ranges = _ratio_range(layers, config.adapter_name, path)
        fused_weights, originals = None, {}
        if config.fuse and reversible:
            # The base layers' weights, by the names they have again once the adapter is unloaded.
            fused_weights = [f"{name}.weight" for name in sorted(layers)]
            if weight_source is None:
                originals = {f"{name}.weight": layer.get_base_layer().weight.detach().to(
                    keep_on or layer.get_base_layer().weight.device, copy=True) for name, layer in layers.items()}
        if config.fuse:
            # fuse_lora records the adapter in the pipeline's ``_merged_adapters`` (an instance attribute over the
            # class's empty set): kept to put back on a reversible removal.
            merged_before = vars(pipe).get("_merged_adapters", _ABSENT)
            pipe.fuse_lora(components=["transformer"], lora_scale=1.0, adapter_names=[config.adapter_name])
            # Drop the LoRA factors: the fused base weights carry the adapter now.
            pipe.unload_lora_weights()
        logger.info("LoRA %s: %d of %d modules matched, fused=%s", path, len(layers), len(file_modules), config.fuse)
    except BaseException:
        unmark_applied(transformer, config.name)
        raise
    handle = LoraHandle(pipe, config, path, file_modules, sorted(layers), scalings, device, fused_weights,
                        weight_source, originals, selected=selected, scale_ranges=scale_ranges)
    if config.fuse:
        handle.merged_before = merged_before
    handle.attributes_before, handle.requires_grad = attributes_before, requires_grad
    return handle


def save_fused_checkpoint(runtime, directory) -> None:
    """Fuse offline: write a runtime whose only lever is a fused LoRA as a plain checkpoint (HF layout), so that later
    loads need neither the LoRA file nor the fusing step. Refuses a runtime with any other lever applied (quantized
    or precomputed modules are not checkpoint weights)."""
    handles = getattr(runtime, "levers", {})
    lora = handles.get("lora")
    if lora is None or not lora.config.fuse:
        raise LeverError("save_fused_checkpoint needs a runtime whose recipe fuses a LoRA (lora.fuse = true)")
    others = sorted(name for name, handle in handles.items() if name != "lora" and handle.telemetry()["applied"])
    if others:
        raise LeverError(f"save_fused_checkpoint: levers {others} change modules, not weights; load with a recipe that "
                         "enables only the fused LoRA")
    runtime.save_pretrained(directory)
