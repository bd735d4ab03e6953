"""Op registry for opcheck: each op computes one kind of layer math on captured inputs, with its float64 reference.

An :class:`Op` has a ``kind`` (``attention`` or ``linear``), a ``run`` on the replay device in the captured dtype, and
a ``reference``: the *same math* in float64 on the CPU (for a quantized linear, the quantized arithmetic — float64
codes, float64 scales, float64 matmul — not the float weights; for block-sparse attention, float64 routing and exact
attention over the kept blocks). Both return an :class:`OpOutput`; ops with discrete decisions (quantization codes,
kept attention blocks) return them too. Given the op's decisions, the reference computes its float64 output *from
those decisions* (and still returns its own float64 decisions): the output error then measures arithmetic alone, and
the decisions are judged apart, by the flip rate against the float64 ones. One activation code on a rounding tie
(float32 ``x / s`` landing on the other side of .5) moves an int8 W8A8 output by ~1e-4 relative — a decision, not an
arithmetic error.

:func:`ops_for_recipe` maps a recipe to what it dispatches for each captured record: the attention backend through
diffusers' dispatcher (``attention:<backend>``), block-sparse attention from the levers module (``block_sparse``) on
the steps and layers it leaves sparse, a quantized linear (``quant:<mode>``) on the linears it does not exclude, and
plain ``linear`` otherwise. The lever modules (``h3.levers.quantization``, ``h3.levers.sparse_attention``) are
imported lazily: without them, their ops raise :class:`NotApplicable` ("lever module not present").

``register_op`` adds ops (tests register deliberately broken ones); an op that cannot run on the replay device
raises :class:`NotApplicable` with the reason, which the gate reports as ``not_applicable`` — never as a pass.
"""

from __future__ import annotations

import importlib
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

Tensors = dict[str, torch.Tensor]


class NotApplicable(RuntimeError):
    """The op cannot run here (device, missing package or lever module); ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class OpOutput:
    out: torch.Tensor
    decisions: torch.Tensor | None = None
    """Discrete choices the op made (quantization codes, kept-block mask), compared elementwise for the flip rate."""
    ambiguous: torch.Tensor | None = None
    """References only: decisions where the float64 value sits on a rounding tie (within float32 error of .5), so
    either choice is right; a differing choice there is not a flip."""


@dataclass(frozen=True)
class OpSpec:
    """An op by registry name plus its parameters (block size, sparsity, quantization mode)."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def key(self) -> str:
        if not self.params:
            return self.name
        return self.name + "(" + ",".join(f"{k}={v}" for k, v in self.params) + ")"


def spec(name: str, **params: Any) -> OpSpec:
    return OpSpec(name, tuple(sorted(params.items())))


@dataclass
class Op:
    name: str
    kind: str
    run: Callable[..., OpOutput]
    """``run(inputs, device, **params)``: the op as the runtime computes it, output on the CPU."""
    reference: Callable[..., OpOutput]
    """``reference(inputs, decisions=None, **params)``: the same math in float64 (from ``decisions`` when given)."""
    description: str = ""
    requires_cuda: bool = False


_OPS: dict[str, Op] = {}


def register_op(op: Op, replace: bool = False) -> Op:
    if op.name in _OPS and not replace:
        raise ValueError(f"op {op.name!r} is already registered")
    _OPS[op.name] = op
    return op


def unregister_op(name: str) -> None:
    _OPS.pop(name, None)


def get_op(name: str) -> Op:
    if name not in _OPS:
        raise KeyError(f"unknown op {name!r}; known ops: {', '.join(sorted(_OPS))}")
    return _OPS[name]


def known_ops() -> list[str]:
    return sorted(_OPS)


def lever_module(name: str):
    """``h3.levers.<name>``, or NotApplicable when this checkout has no such lever module."""
    try:
        return importlib.import_module(f"h3.levers.{name}")
    except ImportError as exc:
        raise NotApplicable(f"lever module not present: h3.levers.{name} ({exc})") from None


def run_op(op_spec: OpSpec, inputs: Tensors, device: str | torch.device) -> OpOutput:
    op = get_op(op_spec.name)
    device = torch.device(device)
    if op.requires_cuda and device.type != "cuda":
        raise NotApplicable(f"{op_spec.key} needs a CUDA device; the replay device is {device}")
    return op.run(inputs, device, **op_spec.kwargs)


def reference_op(op_spec: OpSpec, inputs: Tensors, decisions: torch.Tensor | None = None) -> OpOutput:
    """The float64 reference; with the op's ``decisions``, its output follows them (see the module docstring)."""
    return get_op(op_spec.name).reference(inputs, decisions=decisions, **op_spec.kwargs)


# -- float64 references --------------------------------------------------------------------------------------------
def attention_reference(query, key, value, scale: float | None = None, kept: torch.Tensor | None = None,
                        block_size: int | None = None) -> torch.Tensor:
    """softmax(Q K^T * scale) V in float64; (B, S, H, D) in and out. ``kept`` (B, H, nQ, nK) restricts each query
    block to its kept key blocks."""
    q, k, v = (x.detach().cpu().double().permute(0, 2, 1, 3) for x in (query, key, value))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if kept is not None:
        sq, sk = q.shape[2], k.shape[2]
        rows = torch.arange(sq) // block_size
        cols = torch.arange(sk) // block_size
        mask = kept[:, :, rows][:, :, :, cols].cpu()
        scores = scores.masked_fill(~mask, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ v).permute(0, 2, 1, 3)


def keep_count(n_blocks: int, sparsity: float) -> int:
    # The lever's formula (h3.levers.sparse_attention.route_blocks): round() first so (1 - 0.7) * 10 keeps 3 blocks.
    return max(1, math.ceil(round((1.0 - sparsity) * n_blocks, 9)))


def route_reference(query, key, block_size: int, sparsity: float) -> torch.Tensor:
    """The dense ranking's top-k key blocks per query block in float64: (B, H, nQ, nK) bool."""
    q, k = query.detach().cpu().double(), key.detach().cpu().double()
    batch, seq, heads, dim = q.shape
    n = -(-seq // block_size)
    pad = n * block_size - seq
    counts = torch.full((n,), float(block_size), dtype=torch.float64)
    counts[-1] = block_size - pad

    def pool(x):
        x = F.pad(x, (0, 0, 0, 0, 0, pad)).view(batch, n, block_size, heads, dim)
        return x.sum(dim=2) / counts.view(1, n, 1, 1)

    scores = torch.einsum("bqhd,bkhd->bhqk", pool(q), pool(k))
    top = scores.topk(keep_count(n, sparsity), dim=-1).indices
    return torch.zeros(batch, heads, n, n, dtype=torch.bool).scatter_(-1, top, True)


# Half-way ties: x / s computed in float32 is off by ~1.2e-7 relative, i.e. up to ~1.5e-5 at |code| 127; a float64
# value within this band of .5 may round either way in a correct op (bf16 inputs land on ties often: their few
# mantissa bits make x / s near-exact halves).
TIE_BAND = 1e-4


def quant_reference_codes(x: torch.Tensor, qmax: float, fp8: bool, dim: int):
    """Symmetric absmax codes, scales and tie mask in float64 along ``dim`` (1: per output channel / per token)."""
    xd = x.detach().cpu().double()
    scale = xd.abs().amax(dim=dim, keepdim=True).clamp(min=1e-12) / qmax
    scaled = (xd / scale).clamp(-qmax, qmax)
    if fp8:
        return scaled.float().to(torch.float8_e4m3fn).double(), scale, None
    tie = ((scaled - scaled.floor()) - 0.5).abs() <= TIE_BAND
    return scaled.round(), scale, tie


# -- attention ops ---------------------------------------------------------------------------------------------------
# Backends whose kernels exist only on CUDA: replaying them on the CPU is not applicable, never a pass.
CUDA_ONLY_BACKENDS = {"_native_flash", "_native_efficient", "_native_cudnn", "sage", "flash", "_flash_3"}


def _dispatch(backend: str):
    def run(inputs: Tensors, device: torch.device, **_):
        from diffusers.models.attention_dispatch import (
            AttentionBackendName, _check_attention_backend_requirements, dispatch_attention_fn)

        name = AttentionBackendName(backend)
        try:
            _check_attention_backend_requirements(name)
        except RuntimeError as exc:
            raise NotApplicable(f"attention backend {backend!r}: {exc}") from None
        q, k, v = (inputs[x].to(device) for x in ("query", "key", "value"))
        out = dispatch_attention_fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, backend=name)
        return OpOutput(out.cpu())

    return run


def _attention_ref(inputs: Tensors, **_) -> OpOutput:
    return OpOutput(attention_reference(inputs["query"], inputs["key"], inputs["value"]))


for _backend in ("native", "_native_math", "_native_flash", "_native_efficient", "_native_cudnn", "flex", "sage",
                 "flash", "_flash_3"):
    register_op(Op(f"attention:{_backend}", "attention", _dispatch(_backend), _attention_ref,
                   description=f"diffusers attention dispatcher, backend {_backend}",
                   requires_cuda=_backend in CUDA_ONLY_BACKENDS))


def _block_sparse_run(inputs: Tensors, device: torch.device, block_size: int, sparsity: float, **_) -> OpOutput:
    lever = lever_module("sparse_attention")
    q, k, v = (inputs[x].to(device) for x in ("query", "key", "value"))
    kv_num, kv_idx = lever.route_blocks(q, k, block_size, sparsity)
    out = lever.block_sparse_attention(q, k, v, kv_num, kv_idx, block_size)
    return OpOutput(out.cpu(), lever.kept_block_mask(kv_num, kv_idx).cpu())


def _block_sparse_ref(inputs: Tensors, block_size: int, sparsity: float, decisions=None, **_) -> OpOutput:
    kept = route_reference(inputs["query"], inputs["key"], block_size, sparsity)
    use = decisions.bool() if decisions is not None and decisions.shape == kept.shape else kept
    return OpOutput(attention_reference(inputs["query"], inputs["key"], inputs["value"], kept=use,
                                        block_size=block_size), kept)


register_op(Op("block_sparse", "attention", _block_sparse_run, _block_sparse_ref,
               description="h3.levers.sparse_attention: top-k key blocks per query block (flex_attention)"))


# -- linear ops ------------------------------------------------------------------------------------------------------
def _linear_run(inputs: Tensors, device: torch.device, **_) -> OpOutput:
    x = inputs["input"].to(device)
    bias = inputs.get("bias")
    out = F.linear(x, inputs["weight"].to(device, x.dtype), None if bias is None else bias.to(device, x.dtype))
    return OpOutput(out.cpu())


def _linear_ref(inputs: Tensors, **_) -> OpOutput:
    bias = inputs.get("bias")
    return OpOutput(F.linear(inputs["input"].double(), inputs["weight"].double(),
                             None if bias is None else bias.double()))


register_op(Op("linear", "linear", _linear_run, _linear_ref, description="F.linear in the captured dtype"))


def _quant_run(inputs: Tensors, device: torch.device, mode: str, **_) -> OpOutput:
    lever = lever_module("quantization")
    if mode == "fp8_w8a8" and device.type != "cuda":
        # The lever refuses FP8 on the CPU (its _scaled_mm there is an emulation); so does the replay.
        raise NotApplicable(f"quant:{mode} needs a GPU with FP8 tensor cores; the replay device is {device}")
    x = inputs["input"].to(device)
    weight = inputs["weight"]
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in inputs, dtype=x.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if "bias" in inputs:
            linear.bias.copy_(inputs["bias"])
    qlinear = lever.QuantizedLinear(linear.to(device), mode).to(device)
    with torch.no_grad():
        out = qlinear(x)
    codes = [qlinear.qweight.detach().cpu().double().flatten()]
    if mode in ("int8_w8a8", "fp8_w8a8"):
        fp8 = mode == "fp8_w8a8"
        xq, _ = lever.quantize_per_token(x.reshape(-1, x.shape[-1]), lever.FP8_MAX if fp8 else lever.INT8_MAX,
                                         lever.FP8 if fp8 else torch.int8)
        codes.append(xq.detach().cpu().double().flatten())
    return OpOutput(out.cpu(), torch.cat(codes))


def _quant_ref(inputs: Tensors, mode: str, decisions=None, **_) -> OpOutput:
    fp8 = mode == "fp8_w8a8"
    qmax = 448.0 if fp8 else 127.0
    w_codes, w_scale, w_tie = quant_reference_codes(inputs["weight"], qmax, fp8, dim=1)
    x = inputs["input"].double()
    x2 = x.reshape(-1, x.shape[-1])
    codes, ties = [w_codes.flatten()], [w_tie]
    x_codes = x_scale = None
    if mode != "int8_weight_only":
        x_codes, x_scale, x_tie = quant_reference_codes(x2, qmax, fp8, dim=1)
        codes.append(x_codes.flatten())
        ties.append(x_tie)
    own = torch.cat(codes)
    ambiguous = None if fp8 else torch.cat([t.flatten() for t in ties])
    if decisions is not None and decisions.shape == own.shape:
        # The op's codes, with float64 scales: a wrong scale still shows as output error.
        used = decisions.double()
        w_codes = used[: w_codes.numel()].view_as(w_codes)
        if x_codes is not None:
            x_codes = used[w_codes.numel():].view_as(x_codes)
    x_deq = x2 if x_codes is None else x_codes * x_scale
    out = x_deq @ (w_codes * w_scale).t()
    if "bias" in inputs:
        out = out + inputs["bias"].double()
    return OpOutput(out.reshape(*x.shape[:-1], -1), own, ambiguous)


for _mode in ("int8_weight_only", "int8_w8a8", "fp8_w8a8"):
    register_op(Op(f"quant:{_mode}", "linear", lambda i, d, _m=_mode, **p: _quant_run(i, d, _m),
                   lambda i, _m=_mode, decisions=None, **p: _quant_ref(i, _m, decisions=decisions),
                   description=f"h3.levers.quantization.QuantizedLinear, {_mode}"))


# -- what a recipe dispatches ------------------------------------------------------------------------------------------
@dataclass
class RecipeOps:
    """The op a recipe dispatches for each captured record (see :func:`ops_for_recipe`)."""

    recipe_name: str
    attention_backend: str = "native"
    sparse: dict[str, Any] | None = None
    quant_mode: str = "none"
    quant_exclude: list[str] = field(default_factory=list)
    overrides: dict[str, OpSpec] = field(default_factory=dict)
    """Kind -> op that replaces whatever the recipe dispatches (tests plant broken ops through this)."""

    def for_record(self, record: dict[str, Any]) -> OpSpec:
        kind = record["kind"]
        if kind in self.overrides:
            return self.overrides[kind]
        module = record["module"]
        component, _, sub = module.partition(".")
        if kind == "attention":
            if component != "transformer":
                return spec("attention:native")  # the recipe's backend is set on the transformer only
            sparse = self.sparse
            if sparse and re.match(r"^transformer_blocks\.\d+\.attn$", sub):
                step = record.get("step") or 0
                if step >= sparse["dense_steps"] and record.get("layer") not in sparse["dense_layers"]:
                    return spec("block_sparse", block_size=sparse["block_size"], sparsity=sparse["sparsity"])
            return spec(f"attention:{self.attention_backend}")
        if kind == "linear":
            if (self.quant_mode != "none" and component == "transformer" and "lora_" not in sub
                    and not any(re.search(p, sub) for p in self.quant_exclude)
                    and _quant_shape_ok(record, self.quant_mode)):
                return spec(f"quant:{self.quant_mode}")
            return spec("linear")
        raise NotApplicable(f"no op replays {kind!r} records (no lever changes that op's math)")


def _quant_shape_ok(record: dict[str, Any], mode: str) -> bool:
    # The lever's own rule: it leaves other shapes in floating point.
    from h3.levers.quantization import kernel_shape_ok

    return kernel_shape_ok(*(record.get("features") or (None, None)), mode)


def ops_for_recipe(recipe: Any) -> RecipeOps:
    """What ``recipe`` (a :class:`h3.recipe.Recipe` or its resolved dict) dispatches. A section the dict lacks (a
    recipe written before that lever existed) takes the lever config's defaults, i.e. off."""
    from h3.levers.attention_backend import AttentionBackendConfig
    from h3.levers.quantization import QuantizationConfig
    from h3.levers.sparse_attention import SparseAttentionConfig

    data = recipe.resolved() if hasattr(recipe, "resolved") else dict(recipe)

    def section(config):
        return config.model_validate(data.get(config.name) or {}, strict=False)

    attention, sparse, quant = (section(c) for c in (AttentionBackendConfig, SparseAttentionConfig, QuantizationConfig))
    ops = RecipeOps(recipe_name=data.get("name", "?"))
    ops.attention_backend = attention.backend
    if sparse.is_on():
        ops.sparse = dict(block_size=sparse.block_size, sparsity=sparse.sparsity, dense_steps=sparse.dense_steps,
                          dense_layers=list(sparse.dense_layers))
    ops.quant_mode = quant.mode
    ops.quant_exclude = list(quant.exclude)
    return ops
