"""opcheck: replay the baseline's real op inputs through the candidate's op and the baseline's op, against float64.

For a pair, the baseline request (same prompt, seed and shape) is regenerated in-process once with op capture
attached (h3.capture) into ``<run>/gates/opcheck/captures/<baseline>/<prompt>-s<seed>/`` — reused by every candidate
and on resume. Every captured input then goes through the op the baseline recipe dispatches and the op the candidate
recipe dispatches (h3.ops.ops_for_recipe), and both are scored against a float64 reference of the *same math* as the
op (h3.ops): cosine similarity, relative L2, max absolute error, bias (signed mean error / RMS of the reference),
NaN/Inf parity with the baseline, and for ops with discrete decisions the flip rate against the reference's
decisions (quantization codes; kept blocks against the float64 dense ranking's top-k). For those ops the errors are
taken against the float64 math *applied to the op's own decisions*, and the decisions are judged by the flip rate:
a single int8 activation code on a rounding tie is a decision, not a 1e-4 arithmetic error; a block mask shifted by
one block is a flip rate near 1.

Budget (relative, per record): the candidate passes when, for relative L2, max abs error (floor scaled by the
reference's max |value|) and |bias|, ``cand_err <= factor * base_err + floor[dtype]``, no NaN/Inf appears that the
baseline does not have, and ``flip_rate <= max_flip_rate``. ``factor`` defaults to 1.5, SGLang's kernel admission
check (issue 5: "the candidate's error may exceed the baseline path's own error by at most a set factor (SGLang's
admission check uses 1.5x)"). The floors keep an exact baseline (error 0) from making every rounding a failure.

A random-input sweep per candidate op (sequence lengths around its block boundaries, 1 and 3 heads; linear rows
around multiples of 8) catches an op that is right on the captured shape and wrong on another.

An op that cannot run on this device (a CUDA kernel on the CPU, a lever module this checkout lacks) makes its rows
``not_applicable`` with the reason, and the pair's status ``not_applicable`` — never a pass. A pair with an imported
clip (``h3eval import``: no recipe to replay) is ``not_applicable`` as a whole, with ``info["reason"]``.

Run it with ``h3eval gate RUNDIR --gates opcheck [--option opcheck.KEY=VALUE ...]`` (:class:`OpcheckOptions`); it needs
the in-process runtime and the model named in run.json. Per pair it writes the usual result plus
``<candidate>/tables/<prompt>-s<seed>.opcheck.{json,csv}``: one row per record (source capture or sweep, op kind,
module, layer, step, shapes, both ops' errors, ratio, flip rate, reasons) and per-op / per-step / per-layer summaries.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gates.base import Gate, GateOptions, GateResult, Metric, MetricSpec, PairContext, register_gate
from h3.atomic import atomic_write_json, atomic_write_text
from h3.capture import CaptureConfig, OpCapture, load_index, load_tensors, parse_selection
from h3.ops import NotApplicable, OpSpec, RecipeOps, get_op, ops_for_recipe, reference_op, run_op, spec

logger = logging.getLogger(__name__)

# SGLang's kernel admission check (issue 5): candidate error <= 1.5x the baseline path's own error.
DEFAULT_FACTOR = 1.5
# Absolute floors on relative error per captured dtype, added to the relative budget so that an exact (or float64-
# accurate) baseline does not turn every rounding of the candidate into a failure. float32: ~80 ulps (eps 1.19e-7;
# round-off of K ~ 5000-term dot products grows ~sqrt(K) = 70x). float16 / bfloat16: about half the unit roundoff
# (2^-11 = 4.9e-4, 2^-8 = 3.9e-3) — rounding an output to bf16 alone costs ~2.2e-3 relative L2, which the baseline
# path pays too, so the factor covers it. A planted 1% scale error (1e-2) fails in float32 and in bfloat16
# (tests/test_opcheck.py, bf16 included).
FLOORS = {"float64": 1e-12, "float32": 1e-5, "float16": 2.5e-4, "bfloat16": 2e-3}
# One decision in a thousand may differ from the float64 reference's (a code on a rounding tie, a top-k near-tie).
MAX_FLIP_RATE = 1e-3
CAPTURE_DIR = Path("gates") / "opcheck" / "captures"
ATTENTION_SWEEP_HEADS = (1, 3)
LINEAR_SWEEP_ROWS = (1, 7, 8, 9, 33)
# Block size whose boundaries the sweep straddles for ops without one (64: SGLang's token alignment, seed 001).
DEFAULT_SWEEP_BLOCK = 64


def error_stats(out: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    """Errors of ``out`` against the float64 reference ``ref``, over the elements finite in both."""
    o, r = out.detach().cpu().double(), ref.detach().cpu().double()
    if o.shape != r.shape:
        return {"shape_mismatch": [list(o.shape), list(r.shape)], "nonfinite": 0, "rel_l2": math.inf,
                "max_abs": math.inf, "bias": math.inf, "cosine": -1.0, "ref_absmax": float(r.abs().max()),
                "_nonfinite_mask": torch.zeros(0, dtype=torch.bool)}
    bad = ~torch.isfinite(o)
    keep = ~bad & torch.isfinite(r)
    o, r = o[keep], r[keep]
    diff = o - r
    ref_norm, out_norm = float(r.norm()), float(o.norm())
    rms = ref_norm / math.sqrt(max(r.numel(), 1))
    rel = float(diff.norm()) / ref_norm if ref_norm > 0 else (0.0 if float(diff.norm()) == 0 else math.inf)
    cosine = float((o * r).sum()) / (out_norm * ref_norm) if out_norm > 0 and ref_norm > 0 else float(out_norm == ref_norm)
    return {
        "rel_l2": rel,
        "max_abs": float(diff.abs().max()) if diff.numel() else 0.0,
        "bias": float(diff.mean()) / rms if rms > 0 and diff.numel() else 0.0,
        "cosine": cosine,
        "nonfinite": int(bad.sum()),
        "ref_absmax": float(r.abs().max()) if r.numel() else 0.0,
        "_nonfinite_mask": bad,
    }


def flip_rate(decisions: torch.Tensor | None, reference: torch.Tensor | None,
              ambiguous: torch.Tensor | None = None) -> float | None:
    """Fraction of decisions that differ from the float64 reference's, not counting exact-tie ones (``ambiguous``)."""
    if decisions is None or reference is None:
        return None
    if decisions.shape != reference.shape:
        return 1.0
    differ = decisions.cpu() != reference.cpu()
    if ambiguous is not None and ambiguous.shape == differ.shape:
        differ = differ & ~ambiguous.cpu()
    return float(differ.double().mean())


@dataclass
class Budget:
    factor: float = DEFAULT_FACTOR
    floors: dict[str, float] = field(default_factory=lambda: dict(FLOORS))
    max_flip_rate: float = MAX_FLIP_RATE

    def floor(self, dtype: str) -> float:
        return self.floors.get(dtype, self.floors["float32"])

    def judge(self, base: dict[str, Any], cand: dict[str, Any], dtype: str, flips: float | None) -> list[str]:
        """Why the candidate fails the budget (empty: it passes)."""
        floor, k = self.floor(dtype), self.factor
        reasons = []
        if "shape_mismatch" in cand:
            return [f"output shape {cand['shape_mismatch'][0]} != reference {cand['shape_mismatch'][1]}"]
        new_bad = cand["_nonfinite_mask"] & ~base["_nonfinite_mask"] if base["_nonfinite_mask"].shape == \
            cand["_nonfinite_mask"].shape else cand["_nonfinite_mask"]
        if bool(new_bad.any()):
            reasons.append(f"{int(new_bad.sum())} NaN/Inf the baseline op does not produce")
        if cand["rel_l2"] > k * base["rel_l2"] + floor:
            reasons.append(f"rel L2 {cand['rel_l2']:.3g} > {k}x baseline {base['rel_l2']:.3g} + {floor:g}")
        limit = k * base["max_abs"] + floor * cand["ref_absmax"]
        if cand["max_abs"] > limit:
            reasons.append(f"max abs {cand['max_abs']:.3g} > {limit:.3g}")
        if abs(cand["bias"]) > k * abs(base["bias"]) + floor:
            reasons.append(f"bias {cand['bias']:.3g} > {k}x baseline {abs(base['bias']):.3g} + {floor:g}")
        if flips is not None and flips > self.max_flip_rate:
            reasons.append(f"flip rate {flips:.3g} > {self.max_flip_rate:g}")
        return reasons


def _public(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stats.items() if not k.startswith("_")}


def check_op(inputs: dict[str, torch.Tensor], base_spec: OpSpec, cand_spec: OpSpec, device: str, dtype: str,
             budget: Budget) -> dict[str, Any]:
    """One input through both ops, each against the float64 reference of its own math; a table row."""
    row: dict[str, Any] = {"base_op": base_spec.key, "cand_op": cand_spec.key, "dtype": dtype}
    try:
        base_out = run_op(base_spec, inputs, device)
        cand_out = run_op(cand_spec, inputs, device)
    except NotApplicable as exc:
        row.update(status="not_applicable", reasons=[exc.reason])
        return row
    except Exception as exc:  # noqa: BLE001 - a candidate op that crashes on a shape fails that shape (the sweep's job)
        if not _raised_by_candidate(base_spec, inputs, device):
            raise
        row.update(status="fail", reasons=[f"{cand_spec.key} raised {type(exc).__name__}: {exc}"])
        return row
    base_ref = reference_op(base_spec, inputs, base_out.decisions)
    cand_ref = reference_op(cand_spec, inputs, cand_out.decisions)
    base, cand = error_stats(base_out.out, base_ref.out), error_stats(cand_out.out, cand_ref.out)
    flips = flip_rate(cand_out.decisions, cand_ref.decisions, cand_ref.ambiguous)
    reasons = budget.judge(base, cand, dtype, flips)
    floor = budget.floor(dtype)
    row.update(
        status="fail" if reasons else "pass", reasons=reasons,
        base={k: v for k, v in _public(base).items()}, cand={k: v for k, v in _public(cand).items()},
        rel_l2_ratio=cand["rel_l2"] / max(base["rel_l2"], floor), flip_rate=flips,
    )
    if cand_spec != base_spec and cand_out.out.shape == base_ref.out.shape:
        # How far the candidate's math is from the baseline's (a sparse op's approximation error): reported, not
        # judged here — the trajectory and quality gates judge that.
        row["cand_vs_baseline_math_rel_l2"] = error_stats(cand_out.out, base_ref.out)["rel_l2"]
    return row


def _raised_by_candidate(base_spec: OpSpec, inputs: dict[str, torch.Tensor], device: str) -> bool:
    """After an exception in check_op: True when the baseline op runs fine (so the candidate raised)."""
    try:
        run_op(base_spec, inputs, device)
    except Exception:  # noqa: BLE001 - the baseline's own failure is re-raised by the caller as a gate error
        return False
    return True


def record_inputs(capture_dir: Path, record: dict[str, Any], index: dict[str, Any]) -> dict[str, torch.Tensor]:
    tensors = load_tensors(capture_dir, record["file"])
    if record["kind"] == "linear":
        tensors.update(load_tensors(capture_dir, index["weights"][record["module"]]["file"]))
    return tensors


def replay_capture(capture_dir: Path, base_ops: RecipeOps, cand_ops: RecipeOps, device: str,
                   budget: Budget) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every replayable record of a capture through both recipes' ops: (rows, index)."""
    index = load_index(capture_dir)
    rows = []
    for record in index["records"]:
        if record["kind"] not in ("attention", "linear"):
            continue
        where = {k: record.get(k) for k in ("id", "kind", "module", "layer", "step", "call")}
        shapes = record["shapes"]
        try:
            base_spec, cand_spec = base_ops.for_record(record), cand_ops.for_record(record)
        except NotApplicable as exc:
            rows.append(dict(source="capture", **where, shapes=shapes, status="not_applicable", reasons=[exc.reason]))
            continue
        inputs = record_inputs(capture_dir, record, index)
        row = check_op(inputs, base_spec, cand_spec, device, record["dtype"], budget)
        rows.append(dict(source="capture", **where, shapes=shapes, **row))
    return rows, index


def sweep_shapes(kind: str, op_spec: OpSpec, example: dict[str, Any]) -> list[dict[str, list[int]]]:
    """Shapes the random sweep covers for one op, around its block boundaries."""
    if kind == "attention":
        block = int(op_spec.kwargs.get("block_size", DEFAULT_SWEEP_BLOCK))
        head_dim = example["shapes"]["query"][-1]
        seqs = sorted({1, block - 1, block, block + 1, 2 * block + 1})
        heads = ATTENTION_SWEEP_HEADS
        if op_spec.name == "attention_cp":
            # Under CP the shapes the runtime can run: heads a multiple of the degree, at least a row per rank; the
            # lengths straddle the bucket (the padding cut) or, without one, the degree (the shards' edges).
            degree, multiple = int(op_spec.kwargs["degree"]), int(op_spec.kwargs.get("multiple") or 0)
            if multiple:
                seqs = sorted({s for s in (multiple - 1, multiple + 1, 2 * multiple + 1) if s >= degree})
            elif op_spec.kwargs.get("kind") == "ulysses_anything":
                seqs = [degree, degree + 1, block * degree + 1]
            else:  # equal shards only
                seqs = [degree, 3 * degree, block * degree]
            heads = (degree, 3 * degree)
        return [{"query": [1, s, h, head_dim]} for s in seqs for h in heads]
    in_f, out_f = example.get("features") or [32, 48]
    return [{"input": [1, r, in_f], "weight": [out_f, in_f]} for r in LINEAR_SWEEP_ROWS]


def random_inputs(kind: str, shape: dict[str, list[int]], dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    if kind == "attention":
        q, k, v = (torch.randn(shape["query"], generator=gen, dtype=torch.float64) for _ in range(3))
        return {"query": q.to(dtype), "key": k.to(dtype), "value": v.to(dtype)}
    out_f, in_f = shape["weight"]
    return {"input": torch.randn(shape["input"], generator=gen, dtype=torch.float64).to(dtype),
            "weight": (torch.randn(out_f, in_f, generator=gen, dtype=torch.float64) / math.sqrt(in_f)).to(dtype),
            "bias": torch.randn(out_f, generator=gen, dtype=torch.float64).to(dtype)}


def sweep_op(kind: str, base_spec: OpSpec, cand_spec: OpSpec, example: dict[str, Any], device: str, dtype: str,
             budget: Budget, seed: int = 0) -> list[dict[str, Any]]:
    rows = []
    for i, shape in enumerate(sweep_shapes(kind, cand_spec, example)):
        inputs = random_inputs(kind, shape, getattr(torch, dtype), seed + i)
        row = check_op(inputs, base_spec, cand_spec, device, dtype, budget)
        rows.append(dict(source="sweep", kind=kind, module=None, layer=None, step=None, call=None,
                         shapes={k: list(v.shape) for k, v in inputs.items()}, **row))
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-op, per-step and per-layer counts of pass/fail/not applicable and the worst ratio."""
    tables: dict[str, dict[str, dict[str, Any]]] = {"by_op": {}, "by_step": {}, "by_layer": {}}
    keys = {"by_op": lambda r: f"{r.get('kind')}:{r.get('cand_op', '?')}",
            "by_step": lambda r: "sweep" if r["source"] == "sweep" else str(r.get("step")),
            "by_layer": lambda r: "sweep" if r["source"] == "sweep" else str(r.get("layer"))}
    for name, key in keys.items():
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            groups[key(row)].append(row)
        for group, members in sorted(groups.items()):
            ratios = [m["rel_l2_ratio"] for m in members if "rel_l2_ratio" in m]
            tables[name][group] = {
                "records": len(members),
                "failed": sum(m["status"] == "fail" for m in members),
                "not_applicable": sum(m["status"] == "not_applicable" for m in members),
                "worst_rel_l2_ratio": max(ratios) if ratios else None,
            }
    return tables


CSV_COLUMNS = ["source", "id", "kind", "module", "layer", "step", "call", "shapes", "dtype", "base_op", "cand_op",
               "status", "base_rel_l2", "cand_rel_l2", "rel_l2_ratio", "cand_max_abs", "cand_bias", "cand_cosine",
               "cand_nonfinite", "flip_rate", "cand_vs_baseline_math_rel_l2", "reasons"]


def rows_csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        flat = dict(row)
        for side in ("base", "cand"):
            for k, v in (row.get(side) or {}).items():
                flat[f"{side}_{k}"] = v
        flat["shapes"] = ";".join(f"{k}={'x'.join(map(str, v))}" for k, v in (row.get("shapes") or {}).items())
        flat["reasons"] = " | ".join(row.get("reasons") or [])
        writer.writerow(flat)
    return buffer.getvalue()


class OpcheckOptions(GateOptions):
    factor: float = DEFAULT_FACTOR
    """Budget factor on the baseline op's own error (SGLang's 1.5)."""
    max_flip_rate: float = MAX_FLIP_RATE
    """Largest fraction of decisions that may differ from the float64 reference's."""
    floor_float32: float | None = None
    """Absolute floor on relative error for float32 records (default: the budget's own per-dtype floor)."""
    floor_bfloat16: float | None = None
    floor_float16: float | None = None
    steps: str = "first,middle,last"
    """Denoising steps to capture: 'all', or a list of indices / first / middle / last."""
    layers: str = "first,middle,last"
    """Transformer layers to capture, same syntax."""
    kinds: str = "attention,linear"
    """Op kinds to capture, comma-separated from attention, linear."""
    max_mb: float = 512
    """Capture size budget in MiB."""
    sweep: bool = True
    """Run the random-shape sweep."""
    attention_op: str | None = None
    """Replace the candidate's attention op by this registered op (h3.ops): to check one kernel."""
    linear_op: str | None = None
    """Replace the candidate's linear op by this registered op."""


@register_gate
class OpcheckGate(Gate):
    name = "opcheck"
    needs = ("runtime",)
    description = ("replays the baseline's captured op inputs through the candidate's and the baseline's ops against "
                   "float64 (budget: factor x baseline error + dtype floor), plus a random-shape sweep")
    Options = OpcheckOptions
    metrics = {"records": MetricSpec(higher_is_better=True), "failed_records": MetricSpec(higher_is_better=False),
               "worst_rel_l2_ratio": MetricSpec(higher_is_better=False),
               "worst_cosine": MetricSpec(higher_is_better=True), "flip_rate_max": MetricSpec(higher_is_better=False),
               "not_applicable_records": MetricSpec(higher_is_better=False)}

    def __init__(self) -> None:
        # Per-run state across pairs: one loaded runtime per (model, recipe, device), one sweep per op pair.
        self._runtimes: dict[tuple[str, str, str], Any] = {}
        self._sweeps: dict[tuple, list[dict[str, Any]]] = {}

    # -- capture -----------------------------------------------------------------------------------------------
    def _runtime(self, model: str, recipe: dict[str, Any], device: str):
        import json

        from h3.recipe import recipe_from_dict
        from h3.runtime import H3Runtime

        key = (model, json.dumps(recipe, sort_keys=True), device)
        if key not in self._runtimes:
            self._runtimes.clear()  # one model in memory at a time
            self._runtimes[key] = H3Runtime.load(model, recipe_from_dict(recipe, source=f"run.json recipe"), device)
        return self._runtimes[key]

    def capture(self, ctx: PairContext, model: str, recipe: dict[str, Any], options: OpcheckOptions) -> Path:
        """The pair's baseline capture directory, regenerating the baseline request with capture on if needed."""
        stem = f"{ctx.pair.prompt_id}-s{ctx.pair.seed}"
        directory = ctx.run_dir / CAPTURE_DIR / ctx.pair.baseline / stem
        if (directory / "index.json").is_file():
            return directory
        from h3.runtime import GenerateRequest

        runtime = self._runtime(model, recipe, ctx.device)
        layers = len(runtime.pipe.transformer.transformer_blocks)
        config = CaptureConfig(
            kinds=tuple(options.kinds.split(",")),
            steps=parse_selection(options.steps, runtime.recipe.steps),
            layers=parse_selection(options.layers, layers),
            max_bytes=int(options.max_mb * 2**20),
        )
        req = ctx.baseline.record.get("request") or {}
        if not isinstance(req.get("prompt"), str) or not isinstance(req.get("seed"), int):
            raise ValueError(f"baseline record of {ctx.baseline.mp4.name} has no request prompt/seed to regenerate "
                             "for op capture")
        request = GenerateRequest(prompt=req["prompt"], seed=int(req["seed"]), num_frames=req.get("num_frames"),
                                  seconds=req.get("seconds"), height=req.get("height"), width=req.get("width"),
                                  prompt_id=req.get("prompt_id"))
        staging = directory.with_name(f".{stem}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        capture = OpCapture(staging / "capture", config, meta={"recipe": ctx.pair.baseline, "prompt_id": ctx.pair.prompt_id,
                                                                "seed": ctx.pair.seed, "device": ctx.device})
        with capture.attach(runtime.pipe):
            record = runtime.generate(request, staging / "clip.mp4")
        capture.meta["frames_sha256"] = record.frames_sha256
        capture.meta["reproduces_baseline_clip"] = record.frames_sha256 == ctx.baseline.record.get("frames_sha256")
        capture.write_index()
        directory.parent.mkdir(parents=True, exist_ok=True)
        (staging / "capture").rename(directory)  # the finished capture appears at once, never half-written
        shutil.rmtree(staging, ignore_errors=True)
        return directory

    # -- gate --------------------------------------------------------------------------------------------------
    def evaluate(self, ctx: PairContext) -> GateResult:
        result = GateResult(gate=self.name, pair=ctx.pair)
        options = self.parse_options(ctx.options)
        budget = Budget(factor=options.factor, max_flip_rate=options.max_flip_rate)
        for dtype in ("float32", "bfloat16", "float16"):
            if getattr(options, f"floor_{dtype}") is not None:
                budget.floors[dtype] = getattr(options, f"floor_{dtype}")
        recipes = {}
        for side in (ctx.pair.baseline, ctx.pair.candidate):
            if side not in ctx.run.recipes:
                result.status, result.error = "error", f"{ctx.run_dir / 'run.json'}: no resolved recipe {side!r}"
                return result
            recipes[side] = ctx.run.recipes[side]
        imported = [side for side, recipe in recipes.items() if "imported_from" in recipe]
        if imported:
            result.status = "not_applicable"
            result.info["reason"] = (
                f"cannot apply to imported clips ({' and '.join(imported)}: made by another stack): opcheck replays op "
                "inputs captured from this runtime through each recipe's kernels, and an imported clip has no recipe "
                "here")
            return result
        base_ops, cand_ops = ops_for_recipe(recipes[ctx.pair.baseline]), ops_for_recipe(recipes[ctx.pair.candidate])
        for kind in ("attention", "linear"):
            if getattr(options, f"{kind}_op"):
                name = getattr(options, f"{kind}_op")
                get_op(name)  # unknown names fail with the known ones
                cand_ops.overrides[kind] = spec(name)

        capture_dir = self.capture(ctx, ctx.run.model, recipes[ctx.pair.baseline], options)
        rows, index = replay_capture(capture_dir, base_ops, cand_ops, ctx.device, budget)
        if options.sweep:
            rows += self._sweep(rows, index, base_ops, cand_ops, ctx.device, budget)
        return self._result(ctx, result, rows, index, capture_dir, budget)

    def _sweep(self, rows, index, base_ops, cand_ops, device, budget) -> list[dict[str, Any]]:
        records = {r["id"]: r for r in index["records"]}
        out = []
        seen = set()
        for row in rows:
            if row["source"] != "capture" or "cand_op" not in row:
                continue
            record = records[row["id"]]
            base_spec, cand_spec = base_ops.for_record(record), cand_ops.for_record(record)
            key = (record["kind"], base_spec, cand_spec, record["dtype"], tuple(record.get("features") or ()),
                   tuple(record["shapes"].get("query", [])[-1:]), device)
            if key in seen:
                continue
            seen.add(key)
            if key not in self._sweeps:
                self._sweeps[key] = sweep_op(record["kind"], base_spec, cand_spec, record, device, record["dtype"],
                                             budget)
            out.extend(self._sweeps[key])
        return out

    def _result(self, ctx, result, rows, index, capture_dir, budget) -> GateResult:
        ran = [r for r in rows if r["status"] in ("pass", "fail")]
        failed = [r for r in rows if r["status"] == "fail"]
        na = [r for r in rows if r["status"] == "not_applicable"]
        flips = [r["flip_rate"] for r in ran if r.get("flip_rate") is not None]
        result.metrics = {
            "records": Metric(value=float(len(ran)), higher_is_better=True),
            "failed_records": Metric(value=float(len(failed)) if ran else None, higher_is_better=False),
            "worst_rel_l2_ratio": Metric(value=max((r["rel_l2_ratio"] for r in ran), default=None),
                                         higher_is_better=False),
            "worst_cosine": Metric(value=min((r["cand"]["cosine"] for r in ran), default=None), higher_is_better=True),
            "flip_rate_max": Metric(value=max(flips) if flips else None, higher_is_better=False),
            "not_applicable_records": Metric(value=float(len(na)), higher_is_better=False),
        }
        tables = summarize(rows)
        stem = f"{ctx.pair.prompt_id}-s{ctx.pair.seed}"
        # In a subfolder: the verdict reads every *.json beside the per-pair results as a result (and warns on others).
        artifact = ctx.artifact_dir / "tables" / f"{stem}.opcheck.json"
        artifact.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(artifact, {"budget": {"factor": budget.factor, "floors": budget.floors,
                                                "max_flip_rate": budget.max_flip_rate},
                                     "capture": str(capture_dir.relative_to(ctx.run_dir)), **tables, "rows": rows})
        csv_path = artifact.with_suffix(".csv")
        atomic_write_text(csv_path, rows_csv(rows))
        result.artifacts = [str(p.relative_to(ctx.run_dir)) for p in (artifact, csv_path)]
        result.info = {
            **result.info,
            "by_op": tables["by_op"],
            "budget": {"factor": budget.factor, "floors": budget.floors, "max_flip_rate": budget.max_flip_rate},
            "capture": {"dir": str(capture_dir.relative_to(ctx.run_dir)), "records": len(index["records"]),
                        "complete": index["complete"], "dropped": len(index["dropped"]),
                        "reproduces_baseline_clip": index["meta"].get("reproduces_baseline_clip"),
                        # VAE decoder blocks can be captured (kinds=...,vae_block) but no lever changes their math,
                        # so there is no candidate op to replay them through.
                        "not_replayed": sum(r["kind"] not in ("attention", "linear") for r in index["records"])},
        }
        if failed:
            result.flagged = True
            for row in failed[:10]:
                where = "sweep" if row["source"] == "sweep" else f"{row['module']} step {row['step']}"
                result.flags.append(f"{row['cand_op']} on {where} {row['shapes']}: " + "; ".join(row["reasons"]))
            if len(failed) > 10:
                result.flags.append(f"... and {len(failed) - 10} more failed records (see {result.artifacts[0]})")
        if na:
            result.status = "not_applicable"
            result.info["not_applicable"] = sorted({reason for r in na for reason in r["reasons"]})
        elif not ran:
            result.status, result.error = "error", f"the capture in {capture_dir} has no attention or linear records"
        return result
