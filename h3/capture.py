"""Op-input capture: record the real inputs of chosen ops during a request, to disk, without changing the result.

Seed 001's sparse-attention config was admitted by a single-call numerical check on synthetic shapes; the opcheck
gate (gates/opcheck.py) instead replays what the model really fed each op. :class:`OpCapture` attaches removable
hooks to a pipeline and records, at the chosen denoising steps and transformer layers:

- ``attention``: the ``query``/``key``/``value`` (B, S, H, D) that diffusers' attention dispatcher received (after
  q/k norm and RoPE), by wrapping the dispatcher's backend registry while a selected attention module runs;
- ``linear``: the input of selected ``nn.Linear`` modules, with the module's weight and bias saved once per module;
- ``vae_block``: the hidden-state input of the video VAE decoder's blocks (step ``None``; ``call`` counts tiles).

Nothing is modified: hooks return nothing and tensors are copied (``clone``) before anything else runs, so a request
with capture attached writes the byte-identical clip (tests/test_capture.py).

Bounded size (the truncation rule): a record whose tensors exceed ``max_record_bytes`` keeps the first N rows of its
sequence dimension (rows of q, k and v alike; rows of a linear input), N the largest multiple of ``ROW_MULTIPLE``
that fits (at least ``ROW_MULTIPLE``), and notes ``orig_shapes``; once the capture's total would pass ``max_bytes``,
later records are not written and are counted in ``index["dropped"]`` (``index["complete"]`` is then False).

On disk: ``<dir>/index.json`` (written last, atomically: its presence means the capture finished) and one
``records/rNNNNN.pt`` per record plus ``weights/<module>.pt`` per linear module (``torch.save``, written atomically).
"""

from __future__ import annotations

import io
import logging
import os
import re
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from h3.atomic import atomic_write_bytes, atomic_write_json

logger = logging.getLogger(__name__)

INDEX_VERSION = 1
KINDS = ("attention", "linear", "vae_block")
# Truncated sequences keep whole 128-row blocks: the block-sparse lever's default block size, so routing decisions
# of the kept blocks are the ones the full sequence would make for them at sparsity 0.
ROW_MULTIPLE = 128
# Transformer layer index of a module name (``transformer.transformer_blocks.7.attn`` -> 7).
_LAYER = re.compile(r"(?:^|\.)(?:transformer_blocks|refiner_blocks)\.(\d+)(?:\.|$)")

DEFAULT_PATTERNS = {
    "attention": r"^transformer\.(transformer_blocks|token_refiner\.refiner_blocks)\.\d+\.attn$",
    "linear": r"^transformer\.transformer_blocks\.\d+\.(attn\.to_[qkv]|attn\.to_out\.0|ff\.net\.\d+(\.proj)?)$",
    "vae_block": r"^vae\.decoder\.transformer_blocks\.\d+$",
}


@dataclass
class CaptureConfig:
    """What to capture."""

    kinds: tuple[str, ...] = ("attention", "linear")
    """Op kinds to record, from ``KINDS``."""
    patterns: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_PATTERNS))
    """Per kind, a regular expression (``re.search``) over module names prefixed by component
    (``transformer.``, ``vae.``)."""
    steps: list[int] | None = None
    """Denoising steps (0-based DiT forward index) to record; None: every step. VAE blocks ignore it."""
    layers: list[int] | None = None
    """Transformer layer indices to record; None: every layer. Modules without a layer index always qualify."""
    max_bytes: int = 512 * 2**20
    """Budget for the whole capture (records and weights)."""
    max_record_bytes: int = 64 * 2**20
    """Budget for one record; above it the sequence is truncated to its first rows (module docstring)."""

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"unknown capture kind(s) {unknown}; known: {', '.join(KINDS)}")
        if self.max_bytes <= 0 or self.max_record_bytes <= 0:
            raise ValueError("max_bytes and max_record_bytes must be positive")


def layer_of(module_name: str) -> int | None:
    match = _LAYER.search(module_name)
    return int(match.group(1)) if match else None


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _save(path: Path, obj: Any) -> None:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def _copy(t: torch.Tensor) -> torch.Tensor:
    # clone: on the CPU .cpu() returns the same storage, which the pipeline may overwrite in place later
    return t.detach().to("cpu", copy=True)


class OpCapture:
    """Records op inputs of one request into ``directory``; use :meth:`attach` around ``runtime.generate``."""

    def __init__(self, directory: str | os.PathLike, config: CaptureConfig | None = None, meta: dict | None = None):
        self.directory = Path(directory)
        self.config = config or CaptureConfig()
        self.meta = dict(meta or {})
        self.records: list[dict[str, Any]] = []
        self.weights: dict[str, dict[str, Any]] = {}
        self.dropped: list[dict[str, Any]] = []
        self.bytes = 0
        self.step = -1
        self._in_denoise = False
        self._attention_module: tuple[str, int | None] | None = None
        self._calls: dict[str, int] = {}
        self._handles: list[Any] = []
        self._patterns = {k: re.compile(v) for k, v in self.config.patterns.items()}

    # -- selection ---------------------------------------------------------------------------------------------
    def _wanted(self, kind: str, name: str) -> bool:
        pattern = self._patterns.get(kind)
        return kind in self.config.kinds and pattern is not None and bool(pattern.search(name))

    def _step_layer_ok(self, layer: int | None) -> bool:
        steps, layers = self.config.steps, self.config.layers
        if not self._in_denoise or (steps is not None and self.step not in steps):
            return False
        return layers is None or layer is None or layer in layers

    # -- recording ---------------------------------------------------------------------------------------------
    def _record(self, kind: str, module: str, tensors: dict[str, torch.Tensor], step: int | None, **extra) -> None:
        layer = layer_of(module)
        call = self._calls.get(module, 0)
        self._calls[module] = call + 1
        entry: dict[str, Any] = dict(kind=kind, module=module, layer=layer, step=step, call=call, **extra)
        orig_shapes = {k: list(t.shape) for k, t in tensors.items()}
        size = _nbytes(tensors)
        if size > self.config.max_record_bytes:
            seq_dim = 1 if tensors[next(iter(tensors))].dim() >= 3 else 0
            rows = tensors[next(iter(tensors))].shape[seq_dim]
            per_row = size / max(rows, 1)
            keep = max(ROW_MULTIPLE, int(self.config.max_record_bytes // per_row) // ROW_MULTIPLE * ROW_MULTIPLE)
            if keep < rows:
                tensors = {k: t.narrow(seq_dim, 0, keep) for k, t in tensors.items()}
                entry["truncated_rows"] = [rows, keep]
                size = _nbytes(tensors)
        if self.bytes + size > self.config.max_bytes:
            self.dropped.append(dict(kind=kind, module=module, step=step, call=call, bytes=size))
            return
        tensors = {k: _copy(t) for k, t in tensors.items()}
        index = len(self.records)
        rel = f"records/r{index:05d}.pt"
        _save(self.directory / rel, tensors)
        self.bytes += size
        entry.update(id=index, file=rel, bytes=size, dtype=str(next(iter(tensors.values())).dtype).replace("torch.", ""),
                     shapes={k: list(t.shape) for k, t in tensors.items()}, orig_shapes=orig_shapes)
        self.records.append(entry)

    def _save_weight(self, name: str, linear: torch.nn.Linear) -> str | None:
        if name in self.weights:
            return self.weights[name]["file"]
        tensors = {"weight": linear.weight}
        if linear.bias is not None:
            tensors["bias"] = linear.bias
        size = _nbytes(tensors)
        if self.bytes + size > self.config.max_bytes:
            return None
        rel = f"weights/{name}.pt"
        _save(self.directory / rel, {k: _copy(t) for k, t in tensors.items()})
        self.bytes += size
        self.weights[name] = dict(file=rel, bytes=size, out_features=linear.out_features,
                                  in_features=linear.in_features, bias=linear.bias is not None)
        return rel

    # -- hooks -------------------------------------------------------------------------------------------------
    def _step_hooks(self, transformer: torch.nn.Module) -> None:
        def pre(_module, _args):
            self.step += 1
            self._in_denoise = True

        def post(_module, _args, _output):
            self._in_denoise = False

        self._handles.append(transformer.register_forward_pre_hook(pre))
        self._handles.append(transformer.register_forward_hook(post, always_call=True))

    def _attention_hooks(self, name: str, module: torch.nn.Module) -> None:
        layer = layer_of(name)

        def pre(_module, _args):
            self._attention_module = (name, layer)

        def post(_module, _args, _output):
            self._attention_module = None

        self._handles.append(module.register_forward_pre_hook(pre))
        self._handles.append(module.register_forward_hook(post, always_call=True))

    def _wrap_dispatcher(self) -> None:
        """Observe every attention call diffusers' dispatcher makes (h3.anatomy); restored on detach."""
        from h3.anatomy import observe_attention_dispatch

        def capture(backend: str, kwargs: dict) -> None:
            current = self._attention_module
            if current is not None and self._step_layer_ok(current[1]):
                tensors = {k: kwargs[k] for k in ("query", "key", "value") if isinstance(kwargs.get(k), torch.Tensor)}
                if len(tensors) == 3:
                    self._record("attention", current[0], tensors, self.step, backend=backend,
                                 scale=kwargs.get("scale"), has_mask=kwargs.get("attn_mask") is not None)

        self._handles.append(observe_attention_dispatch(capture))

    def _linear_hook(self, name: str, module: torch.nn.Linear) -> None:
        layer = layer_of(name)

        def pre(mod, args):
            if not args or not isinstance(args[0], torch.Tensor) or not self._step_layer_ok(layer):
                return
            weight_file = self._save_weight(name, mod)
            if weight_file is None:
                self.dropped.append(dict(kind="linear", module=name, step=self.step, reason="weight over budget"))
                return
            self._record("linear", name, {"input": args[0]}, self.step, weight=weight_file,
                         features=[mod.in_features, mod.out_features])

        self._handles.append(module.register_forward_pre_hook(pre))

    def _vae_hook(self, name: str, module: torch.nn.Module) -> None:
        def pre(_module, args, kwargs):
            tensors = {f"arg{i}": a for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
            if tensors:
                self._record("vae_block", name, tensors, None)

        self._handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))

    @contextmanager
    def attach(self, pipe: Any) -> Iterator["OpCapture"]:
        """Hooks on ``pipe.transformer`` (and ``pipe.vae``); removed on exit, where the index is written."""
        if self._handles:
            raise RuntimeError("this OpCapture is already attached")
        self.directory.mkdir(parents=True, exist_ok=True)
        components = {"transformer": pipe.transformer, "vae": getattr(pipe, "vae", None)}
        try:
            self._step_hooks(pipe.transformer)
            for prefix, component in components.items():
                if component is None:
                    continue
                for sub, module in component.named_modules():
                    name = f"{prefix}.{sub}" if sub else prefix
                    if self._wanted("attention", name) and hasattr(module, "processor"):
                        self._attention_hooks(name, module)
                    if self._wanted("linear", name) and isinstance(module, torch.nn.Linear):
                        self._linear_hook(name, module)
                    if self._wanted("vae_block", name):
                        self._vae_hook(name, module)
            if "attention" in self.config.kinds:
                self._wrap_dispatcher()
            yield self
        finally:
            for handle in reversed(self._handles):
                handle.remove()
            self._handles.clear()
        self.write_index()

    def index(self) -> dict[str, Any]:
        return {
            "version": INDEX_VERSION,
            "config": asdict(self.config),
            "meta": self.meta,
            "denoise_steps_seen": self.step + 1,
            "bytes": self.bytes,
            "complete": not self.dropped,
            "dropped": self.dropped,
            "weights": self.weights,
            "records": self.records,
        }

    def write_index(self) -> Path:
        path = self.directory / "index.json"
        atomic_write_json(path, self.index())
        logger.info("op capture: %d records (%.1f MiB) in %s, %d dropped", len(self.records), self.bytes / 2**20,
                    self.directory, len(self.dropped))
        return path


class CaptureError(ValueError):
    """A capture directory is missing, unfinished or damaged; the message names the file."""


def load_index(directory: str | os.PathLike) -> dict[str, Any]:
    import json

    path = Path(directory) / "index.json"
    if not path.is_file():
        raise CaptureError(f"{path} is missing: the capture did not finish (or never ran)")
    try:
        index = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CaptureError(f"{path} is not valid JSON ({exc})") from exc
    if index.get("version") != INDEX_VERSION:
        raise CaptureError(f"{path}: index version {index.get('version')!r}, expected {INDEX_VERSION}")
    return index


def load_tensors(directory: str | os.PathLike, rel: str) -> dict[str, torch.Tensor]:
    path = Path(directory) / rel
    if not path.is_file():
        raise CaptureError(f"{path} is missing (listed in {Path(directory) / 'index.json'})")
    return torch.load(path, map_location="cpu", weights_only=True)


def parse_selection(text: str | None, count: int) -> list[int] | None:
    """``all`` -> None; ``first,middle,last`` or integers (negative from the end) -> sorted unique indices."""
    if text is None or str(text).strip() == "all":
        return None
    named = {"first": 0, "middle": (count - 1) // 2, "last": count - 1}
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if part in named:
            out.add(named[part])
            continue
        try:
            value = int(part)
        except ValueError:
            raise ValueError(f"selection {text!r}: {part!r} is not an integer, 'first', 'middle', 'last' or 'all'") from None
        if not -count <= value < count:
            raise ValueError(f"selection {text!r}: {value} is out of range for {count}")
        out.add(value % count)
    return sorted(out)


__all__ = ["CaptureConfig", "CaptureError", "OpCapture", "load_index", "load_tensors", "parse_selection", "layer_of",
           "ROW_MULTIPLE", "KINDS"]
