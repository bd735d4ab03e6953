"""Full-size DiT forward for stock diffusers and each optimized recipe, side by side, in one process on one GPU.

    python bench/h200_recipes_speed.py --out $OUT/recipes.json --shapes 5s-544x960,5s-768x1344 [--repeats 2]
        [--variants stock,turbo4+compile,turbo4-int8,turbo4-int8+compile,turbo4-fp8,turbo4-sparse,turbo4-sparse+sparse85+fp8]

``--variants shipped`` (or ``shipped,<more>``) stands for ``stock`` and every shipped recipe with a DiT forward of its
own, as shipped (see ``shipped_variants``).

A variant is a shipped recipe (``h3/recipes/<name>.toml``) or ``stock`` (bf16, eager, native SDPA: what diffusers does
out of the box), optionally followed by modifiers joined with ``+``:

* ``compile``  — the recipe's ``[compile]`` section switched on (regional: one region per DiT block, inductor);
* ``dynamic``  — the same with ``compile.dynamic = true`` (shape-generic graphs: no recompile per prompt length);
* ``fp8`` / ``int8`` — ``quant.mode`` set to FP8 / INT8 W8A8;
* ``sage`` / ``cudnn`` / ``fa3`` — ``attention.backend`` set to ``sage`` / ``_native_cudnn`` / ``_flash_3`` (FlashAttention-3, bench/device/build_fa3.sh);
* ``fa3fp8`` — FP8 attention through FlashAttention-3 with per-head scales (``[fp8_attention] kernel = "fa3"``), q, k
  and v quantized by one compiled graph; ``fa3fp8eager`` the same with the quantization in eager ops (``quantize =
  "eager"``, the session-9 path);
* ``sparseNN`` — block-sparse attention at NN % sparsity (128-token blocks, dense first step, 128-row buckets);
* ``bucket`` — shape bucketing switched on (128-row buckets: one set of compiled graphs for every prompt length in a
  bucket, attention on the real rows only).

The recipe's levers are applied by the runtime's own :func:`h3.levers.apply_recipe_levers` to a full-size
``MiniMaxH3Transformer3DModel`` (default config, seeded random weights: speed does not depend on weight values), so
what is timed is the code that generates clips. Sections that do not touch the DiT forward are set aside and said so
in the result: the LoRA (a fused LoRA leaves the weights' shapes and the forward's work unchanged; no LoRA file exists
here), the VAE tiles (timed by bench/h200_speed.py), offload (bench/h200_offload.py).

Per variant and shape: the first call (which pays compilation) is excluded and reported; then the median of
``--repeats`` forwards. A recipe with a dense first step (block-sparse) is timed on both kinds of forward: the dense
one and the sparse one, so a request of ``steps`` forwards is ``dense_steps`` dense ones and the rest sparse. The
levers' telemetry and the attention backends the dispatcher actually called are recorded per variant (the
configured-versus-executed evidence). Every variant is removed again before the next (compile caches reset), and
partial results are written after every variant, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from h3.atomic import atomic_write_json  # noqa: E402
from bench.h200_speed import (  # noqa: E402
    SHAPES, build_transformer, count_flops, cuda_time, dit_inputs, latent_geometry, run_record)

DEFAULT_VARIANTS = ("stock,turbo4+compile,turbo4-int8,turbo4-int8+compile,turbo4-fp8,turbo4-fp8+compile,"
                    "turbo4-fp8+cudnn+compile,turbo4-sparse,turbo4-sparse+compile,turbo4-sparse+sparse85+fp8+compile")

# Shipped recipes whose DiT forward is another variant's: the fused LoRA changes no shape or FLOP, so turbo4's forward
# is stock's. Recipes that change only how many forwards run (a step cache, fewer steps), offload (its own bench) and
# the tiny-only demo have no forward of their own to time; the speed table covers each with a sentence.
SAME_FORWARD = {"baseline": "stock", "turbo4": "stock"}
NOT_A_FORWARD = {
    "identity": "every lever off: baseline's forward (`stock`)",
    "fbc-cache": "stock's forward, fewer of them computed (the cache skips steps): not a forward-speed question",
    "fewer-steps": "stock's forward, 8 of them instead of 29",
    "offload-int8-adaln": "`bench/h200_offload.py` at 5 s 544×960 (target row below)",
    "turbo4-tinydemo": "tiny preset only (its LoRA is the seeded '@tiny' one); not a full-size recipe",
    "turbo4-tiny": "trained tiny preset only (its LoRA is the distilled '@turbo4-tiny'); not a full-size recipe",
    "turbo4-tiny-int8": "trained tiny preset only (its LoRA is the distilled '@turbo4-tiny'); not a full-size recipe",
    "fp8-attention-emulated": "a measurement recipe: FP8 attention's rounding emulated through SDPA (slower than stock "
                              "by design); the speed lever is the `fa3fp8` modifier (fp8_attention kernel fa3)",
}


def shipped_variants() -> list[str]:
    """``stock`` and every shipped recipe with a DiT forward of its own, as shipped (no modifier)."""
    from h3.recipe import known_recipes

    return ["stock"] + sorted(n for n in known_recipes() if n not in SAME_FORWARD and n not in NOT_A_FORWARD)


def expand_variants(spec: str) -> list[str]:
    """The comma-separated variant list, with ``shipped`` standing for :func:`shipped_variants`; first use kept."""
    out: list[str] = []
    for item in (v.strip() for v in spec.split(",")):
        for v in (shipped_variants() if item == "shipped" else [item] if item else []):
            if v not in out:
                out.append(v)
    return out


COMPILE_MODES = {"graphs": "reduce-overhead", "autotune": "max-autotune-no-cudagraphs"}
"""Variant modifiers that compile the DiT blocks with one of inductor's mode option sets (h3.levers.compile's
``mode``): ``graphs`` captures each compiled block in CUDA graphs (issue 23: "capture the step in CUDA graphs where
shapes are bucketed"; pair it with ``bucket`` or a bucketing recipe), ``autotune`` autotunes the matmul and fused
kernels without graphs."""


def variant_recipe(variant: str):
    """The Recipe a variant names, with the sections that do not touch the DiT forward set aside (returned)."""
    from h3.recipe import load_recipe

    base, *mods = variant.split("+")
    recipe = load_recipe("baseline" if base == "stock" else base)
    if base == "stock":
        recipe = recipe.model_copy(update={"name": "stock"})
    update: dict = {}
    for mod in mods:
        if mod == "compile":
            update["compile"] = update.get("compile", recipe.compile).model_copy(update={"enabled": True})
        elif mod == "dynamic":  # compile with dynamic shapes: one graph for every prompt length
            update["compile"] = update.get("compile", recipe.compile).model_copy(update={"enabled": True,
                                                                                          "dynamic": True})
        elif mod in COMPILE_MODES:  # inductor's option sets: CUDA graphs of each compiled block, or autotuning
            update["compile"] = update.get("compile", recipe.compile).model_copy(update={"enabled": True,
                                                                                          "mode": COMPILE_MODES[mod]})
        elif mod in ("fp8", "int8"):
            update["quant"] = recipe.quant.model_copy(update={"mode": f"{mod}_w8a8"})
        elif mod in ("sage", "cudnn", "fa3"):
            update["attention"] = recipe.attention.model_copy(
                update={"backend": {"sage": "sage", "cudnn": "_native_cudnn", "fa3": "_flash_3"}[mod]})
        elif mod in ("fa3fp8", "fa3fp8eager"):  # FlashAttention-3's FP8 forward, per-head scales (fp8_attention)
            update["fp8_attention"] = recipe.fp8_attention.model_copy(update={
                "enabled": True, "kernel": "fa3", "quantize": "eager" if mod == "fa3fp8eager" else "compiled"})
        elif mod == "bucket":
            update["bucketing"] = recipe.bucketing.model_copy(update={"enabled": True, "multiple": 128})
        elif mod.startswith("sparse") and mod[len("sparse"):].isdigit():
            update["sparse_attention"] = recipe.sparse_attention.model_copy(update={
                "enabled": True, "block_size": 128, "sparsity": int(mod[len("sparse"):]) / 100.0, "dense_steps": 1})
            update["bucketing"] = recipe.bucketing.model_copy(update={"enabled": True, "multiple": 128})
        else:
            raise ValueError(f"unknown modifier {mod!r} in variant {variant!r}")
    set_aside = {"lora": recipe.lora.enabled, "vae_tiles": dict(recipe.vae.tiles), "offload": recipe.offload.enabled,
                 "adaln_precompute": recipe.adaln.precompute, "cache": recipe.cache.kind}
    from h3.levers.vae import VaeConfig

    update.update(lora=recipe.lora.model_copy(update={"enabled": False}), vae=VaeConfig(),
                  offload=recipe.offload.model_copy(update={"enabled": False}),
                  adaln=recipe.adaln.model_copy(update={"precompute": False}))
    return recipe.model_copy(update=update), set_aside


def configured_of(recipe) -> dict:
    """What a variant configures of the DiT forward, as each result row records it (``configured``)."""
    return {"quant": recipe.quant.mode, "attention": recipe.attention.backend,
            "sparse_attention": recipe.sparse_attention.sparsity if recipe.sparse_attention.enabled else None,
            "dense_steps": recipe.sparse_attention.dense_steps if recipe.sparse_attention.enabled else None,
            "bucketing": recipe.bucketing.multiple if recipe.bucketing.enabled else None,
            "compile": recipe.compile.enabled,
            **({"fp8_attention": recipe.fp8_attention.kernel} if recipe.fp8_attention.enabled else {}),
            **({"compile_mode": recipe.compile.mode} if recipe.compile.enabled and recipe.compile.mode else {})}


def begin_request(handles: dict) -> None:
    for handle in handles.values():
        if hasattr(handle, "begin_request"):
            handle.begin_request()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextlib.contextmanager
def levers_applied(model, recipe, device: str):
    """``recipe``'s levers on ``model`` through the runtime's own ``apply_recipe_levers`` (reversible: the float
    weights are kept); on exit every lever is removed again and dynamo's caches reset, so the next variant starts
    from the stock model."""
    from h3.levers import apply_recipe_levers

    pipe = SimpleNamespace(transformer=model, text_encoder=None, vae=None, audio_vae=None)
    handles = apply_recipe_levers(pipe, recipe, device=device, model_sha256="seeded-random", is_tiny=False,
                                  reversible=True)
    try:
        yield handles
    finally:
        for handle in reversed(list(handles.values())):
            handle.remove()
        torch._dynamo.reset()


def measure_variant(model, inputs: dict, variant: str, repeats: int, device: str = "cuda",
                    count: bool = False, profile: bool = False) -> dict:
    """``count``: count the FLOPs of the first call (only for a variant whose modules are stock nn.Linear).
    ``profile``: after the timed forwards, one more (the sparse kind for a sparse recipe) under torch.profiler, its
    device time by kernel family (bench/kernel_profile.py) in ``row["kernels"]``."""
    from h3.anatomy import observe_attention_dispatch
    from h3.levers import lever_configs, lever_telemetry

    recipe, set_aside = variant_recipe(variant)
    row: dict = {"recipe": recipe.name, "set_aside": set_aside, "steps": recipe.steps,
                 "configured": configured_of(recipe),
                 # The lever sections as run, for the product's own executed checks (h200_recipes_table.py).
                 "levers": {config.name: config.model_dump(mode="json") for config in lever_configs(recipe)}}
    dispatched: list[str] = []
    with levers_applied(model, recipe, device) as handles:
        probe = observe_attention_dispatch(lambda name, kw: dispatched.append(name))
        try:
            sparse = "sparse_attention" in handles
            with torch.no_grad():
                begin_request(handles)
                _sync(device)
                t0 = time.perf_counter()
                if count:
                    row["flops"] = count_flops(model, lambda: model(**inputs))
                else:
                    model(**inputs)  # the dense first step of a sparse recipe, the only step kind of the others
                if sparse:
                    model(**inputs)  # and the first sparse step: both paths compiled before timing
                _sync(device)
                row["first_call_s"] = time.perf_counter() - t0
                row["dispatched_first_call"] = sorted(set(dispatched))
                if device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                if sparse:
                    state = handles["sparse_attention"]

                    def dense_forward():
                        begin_request(handles)  # step 0: dense
                        model(**inputs)

                    def sparse_forward():
                        state.step, state.dense_step = 1, False
                        model(**inputs)

                    times = cuda_time(dense_forward, repeats, warmup=0)
                    row["dense_forward_s"], row["dense_forward_s_all"] = statistics.median(times), times
                    times = cuda_time(sparse_forward, repeats, warmup=0)
                    row["forward_s"], row["forward_s_all"] = statistics.median(times), times
                else:
                    times = cuda_time(lambda: model(**inputs), repeats, warmup=0)
                    row["forward_s"], row["forward_s_all"] = statistics.median(times), times
                    row["dense_forward_s"] = row["forward_s"]
                if device.startswith("cuda"):
                    row["peak_memory_GiB"] = torch.cuda.max_memory_allocated() / 2**30
                if profile and device.startswith("cuda"):
                    from bench.kernel_profile import kernel_breakdown

                    row["kernels"] = kernel_breakdown(sparse_forward if sparse else (lambda: model(**inputs)))
                row["dispatched"] = sorted(set(dispatched))
                row["telemetry"] = {k: v for k, v in lever_telemetry(handles).items() if v.get("applied")}
        finally:
            probe.remove()
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default="5s-768x1344")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default=DEFAULT_VARIANTS)
    parser.add_argument("--shape-variants", action="append", default=[], metavar="SHAPE=V1,V2",
                        help="the variants for one shape instead of --variants (repeatable)")
    parser.add_argument("--shape-repeats", action="append", default=[], metavar="SHAPE=N",
                        help="--repeats for one shape (repeatable)")
    parser.add_argument("--profile", action="store_true",
                        help="one more forward per variant under torch.profiler: device time by kernel family")
    parser.add_argument("--smoke", action="store_true",
                        help="a smoke run of this script on the CPU: the tiny preset's DiT config, float32")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    device = "cpu" if args.smoke else "cuda"
    result = {**run_record(device), "shapes": {}}
    try:
        import sageattention  # noqa: F401
        from importlib.metadata import version

        result["sageattention"] = version("sageattention")
    except ImportError:
        result["sageattention"] = None
    out = Path(args.out)
    model, _ = build_transformer(dtype=torch.float32 if args.smoke else torch.bfloat16, tiny=args.smoke, device=device)
    result["params"] = sum(p.numel() for p in model.parameters())
    result["num_layers"] = model.config.num_layers
    shape_variants = dict(item.split("=", 1) for item in args.shape_variants)
    shape_repeats = {k: int(v) for k, v in (item.split("=", 1) for item in args.shape_repeats)}
    for shape in [s for s in args.shapes.split(",") if s]:
        variants = expand_variants(shape_variants.get(shape, args.variants))
        repeats = shape_repeats.get(shape, args.repeats)
        geo = latent_geometry(*SHAPES[shape])
        inputs = dit_inputs(geo, model.config, device=device,
                            dtype=torch.float32 if args.smoke else torch.bfloat16)
        entry = result["shapes"].setdefault(shape, {"variants": {}})
        entry["sequence_length"] = geo["text_rows"] + geo["audio_rows"] + geo["video_rows"]
        if variants[0] != "stock":  # otherwise stock's first call counts them
            with torch.no_grad():
                entry["flops_dense"] = count_flops(model, lambda: model(**inputs))
        for i, name in enumerate(variants):
            try:
                row = measure_variant(model, inputs, name, repeats, device, count=(i == 0 and name == "stock"),
                                      profile=args.profile)
                if "flops" in row:
                    entry["flops_dense"] = row.pop("flops")
                row["dense_equivalent_tflops"] = entry["flops_dense"]["total"] / row["forward_s"] / 1e12
            except Exception as exc:  # report the failing variant, keep measuring the others
                row = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2500:]}
                torch._dynamo.reset()
            entry["variants"][name] = row
            print(json.dumps({shape: {name: {k: row.get(k) for k in ("forward_s", "dense_forward_s", "first_call_s",
                                                                      "dispatched", "error")}}}), flush=True)
            stock = entry["variants"].get("stock", {}).get("forward_s")
            for r in entry["variants"].values():
                if stock and r.get("forward_s"):
                    r["speedup_vs_stock"] = stock / r["forward_s"]
            atomic_write_json(out, result)
        del inputs
        if device == "cuda":
            torch.cuda.empty_cache()
    print("wrote", out)


if __name__ == "__main__":
    main()
