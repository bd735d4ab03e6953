"""The full-size goals table (issue 11's goals, each row from its last measurement) and its device driver (issue 52: code that studies and tests share; each study's CLI is bench/<study>/).

Parts, in order: ``h200_goals_table`` (bench/full_size_speed/), ``h200_goals`` (bench/full_size_speed/), ``gate_fraction``
(bench/gates_speed/).
"""

from __future__ import annotations


# ---- h200_goals_table (the CLI: bench/full_size_speed/h200_goals_table.py) -------------------------------------------------


import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from h3.atomic import atomic_write_json, atomic_write_text  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "full_size_speed" / "results"
GOALS_JSON = RESULTS / "h200_goals.json"


def write_goal_entry(study_file: str, record: Path, goal_entry, goals: Path = GOALS_JSON) -> str:
    """Put the entry ``goal_entry(record_data, source)`` builds from the record at ``record`` (a study's result file;
    ``source`` its path from the repository root) into h200_goals.json under its name, atomically; the line to print.
    ``study_file``: the calling script (for the repository root)."""
    import os

    root = Path(study_file).resolve().parents[2]
    name, entry = goal_entry(json.loads(record.read_text()), os.path.relpath(record.resolve(), root))
    table = json.loads(goals.read_text())
    table[name] = entry
    atomic_write_json(goals, table)
    return f"{name}: {json.dumps(entry)}"
RAW = "h200_goals_raw.json"
NOTES = "h200_goals_notes.md"
# (raw row, the goal as its table words it, target seconds), in the order.
GOALS = (
    ("request15", "15 s 768×1344 `turbo4-sparse` request", 30.0),
    ("request544", "5 s 544×960 `turbo4` request, faster than real time", 5.2),
    ("dense768", "dense DiT forward at 5 s 768×1344", 3.3),
    ("sparse768", "85% sparse forward", 1.6),
    ("decode15", "video decode at 15 s 768×1344", 6.0),
)
EXTRA = ("request15all",)
"""Rows of the bench that are not goals of their own: shown beside the goals (the 15 s request with every step
sparse)."""
SHAPE = {"request15all": "15s-768x1344", "request15": "15s-768x1344", "request544": "5s-544x960",
         "dense768": "5s-768x1344", "sparse768": "5s-768x1344", "decode15": "15s-768x1344"}
STAGES = ("text_encode", "denoise", "video_decode", "audio_decode", "frames_pcm_to_host", "mux")


class BadInput(ValueError):
    """A results file is missing or holds a value that cannot be a measurement."""


def _load(results: Path, name: str, required: bool = True) -> dict | None:
    path = results / name
    if not path.is_file():
        if required:
            raise BadInput(f"{path} is missing")
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise BadInput(f"{path} does not hold a JSON object")
    return data


def _seconds(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BadInput(f"{where}: {value!r} is not a finite positive number of seconds")
    return float(value)


def merge_raws(raws: list[tuple[str, dict]]) -> tuple[dict, dict]:
    """The rows of several raw results (in rising precedence), each from the last file that measured it (a row that
    no file measured: the last file's reason), and the file of each row."""
    rows: dict = {}
    sources: dict = {}
    for name, raw in raws:
        found = raw.get("rows")
        if not isinstance(found, dict):
            raise BadInput(f"{name} has no 'rows' object")
        for key, row in found.items():
            if not isinstance(row, dict):
                raise BadInput(f"{name}: rows.{key} is not an object")
            if row.get("measured") is True or rows.get(key, {}).get("measured") is not True:
                rows[key], sources[key] = row, name
    return rows, sources


def goals(raw: dict, source: str = RAW) -> dict:
    """The issue's form: one entry per goal, from the raw rows (never a number for a row not measured)."""
    rows, sources = merge_raws([(source, raw)])
    return goals_of(rows, sources)


def goals_of(rows: dict, sources: dict) -> dict:
    out = {}
    for key, goal, target in GOALS:
        row, source = rows.get(key) or {}, sources.get(key, RAW)
        if row.get("measured") is True:
            if row.get("shape") != SHAPE[key]:  # a smoke run's rows, say: no verdict on a goal at another shape
                raise BadInput(f"{source}: rows.{key} was measured at {row.get('shape')!r}; the goal is at "
                               f"{SHAPE[key]}")
            measured = _seconds(row.get("measured_s"), f"{source}: rows.{key}.measured_s")
            out[goal] = {"measured": round(measured, 3), "target": target, "unit": "s", "met": measured <= target,
                         "source": f"bench/full_size_speed/results/{source}"}
        else:
            reason = row.get("error") or row.get("reason") or "no row in the raw result"
            out[goal] = {"measured": None, "target": target, "unit": "s", "met": None,
                         "source": f"bench/full_size_speed/results/{source}", "not_measured": str(reason)}
    return out


def _flops_768(recipes: dict | None) -> float | None:
    entry = (recipes or {}).get("shapes", {}).get("5s-768x1344", {})
    total = entry.get("flops_dense", {}).get("total")
    return float(total) if isinstance(total, (int, float)) and math.isfinite(total) and total > 0 else None


def _decode_flops(vae: dict | None, tile: str) -> float | None:
    flops = (vae or {}).get("shapes", {}).get("15s-768x1344", {}).get("tiles", {}).get(tile, {}).get("flops")
    return float(flops) if isinstance(flops, (int, float)) and math.isfinite(flops) and flops > 0 else None


def render(results: Path, raw_names: list[str] | None = None) -> tuple[dict, str]:
    raws = [(name, _load(results, name)) for name in (raw_names or [RAW])]
    rows, sources = merge_raws(raws)
    raw = raws[-1][1]
    stock = _load(results, "h200_speed_stock.json")
    ceil = stock.get("ceilings", {})
    bf16, fp8 = ceil.get("bf16_matmul_tflops"), ceil.get("fp8_matmul_tflops")
    table = goals_of(rows, sources)
    flops768 = _flops_768(_load(results, "h200_recipes_768.json", required=False))
    vae = _load(results, "vae_decode_flops.json", required=False)

    def rate(flops: float | None, seconds: float | None) -> str:
        if not flops or not seconds:
            return "—"
        t = flops / seconds / 1e12
        return f"{t:.0f} TFLOP/s ({t / bf16:.0%} of bf16 {bf16:.0f}, {t / fp8:.0%} of fp8 {fp8:.0f})"

    taken = {name: ", ".join(f"`{k}`" for k, v in sources.items() if v == name) or "none taken" for name, _ in raws}
    lines = ["# Issue 23's goals on one H200, measured as whole requests", "",
             f"- device: {raw.get('device')}; torch {raw.get('torch')} (CUDA {raw.get('cuda')}), diffusers "
             f"{raw.get('diffusers')}, SageAttention {raw.get('sageattention') or 'not installed'}; "
             f"{raw.get('weights')}",
             *[f"- `{name}`: `{r.get('command')}` ({r.get('date')}; driver `bash bench/device/h200_goals.sh OUTDIR`, "
               f"a {r.get('budget_s')} s box); rows {taken[name]}"
               for name, r in raws],
             "- rendered by `python bench/full_size_speed/h200_goals_table.py"
             + "".join(f" --raw {name}" for name, _ in raws if raw_names) + "`",
             f"- DiT recipe of the dense rows: `{raw.get('dense_variant')}` (the runtime's `apply_recipe_levers`, "
             "float weights dropped as the runtime does); ceilings measured on the same chip "
             f"(`h200_speed_stock.json`): bf16 {bf16:.0f}, fp8 {fp8:.0f} TFLOP/s", "",
             "| goal | target | measured | verdict | achieved | row |", "|---|---|---|---|---|---|"]
    for key, goal, target in GOALS:
        entry, row = table[goal], rows.get(key, {})
        if entry["measured"] is None:
            reason = entry["not_measured"]
            lines.append(f"| {goal} | ≤ {target:g} s | — | **not measured**: {reason} | — | `{key}` |")
            continue
        achieved = "—"
        if key == "dense768":
            achieved = rate(flops768, entry["measured"])
        elif key == "sparse768":
            achieved = "dense-equivalent " + rate(flops768, entry["measured"])
        elif key == "decode15":
            achieved = rate(_decode_flops(vae, row.get("best_tile", "")), entry["measured"])
        verdict = "**met**" if entry["met"] else "**missed**"
        lines.append(f"| {goal} | ≤ {target:g} s | {entry['measured']:.2f} s | {verdict} | {achieved} | `{key}` |")
    requests = [(k, rows[k]) for k in ("request544", "request15", "request15all")
                if rows.get(k, {}).get("measured")]
    if requests:
        lines += ["", "## The requests, stage by stage (seconds; the timed request, after a first one that compiled)",
                  "", "| row | variant | " + " | ".join(STAGES) + " | total | first request | mux of smooth frames |",
                  "|---|---|" + "---|" * (len(STAGES) + 3)]
        for key, row in requests:
            timed = row["requests"][0]
            lines.append(f"| `{key}` | `{row.get('variant')}` | "
                         + " | ".join(f"{timed['stages'].get(s, float('nan')):.2f}" for s in STAGES)
                         + f" | {timed['total_s']:.2f} | {row['first_request']['total_s']:.1f} | "
                         f"{row.get('mux_smooth_frames_s', float('nan')):.2f} |")
        lines += ["", "Random weights decode to noise-like frames, the worst case for libx264: the request's own mux "
                  "stage is an upper bound, the mux of smooth moving frames of the same shape a lower one."]
        if rows.get("request15all", {}).get("measured"):
            lines += ["", "`request15all` is not a goal row: the 15 s request with every step sparse (the issue's "
                      "\"sparse attention on every step, without a dense first step\"), beside `request15`'s shipped "
                      "recipe (dense first step)."]
    decode = rows.get("decode15", {})
    if decode.get("measured"):
        lines += ["", "## Video decode at 15 s 768×1344 per tile", "", "| tile | decode (s) | achieved |",
                  "|---|---|---|"]
        for tile, t in decode.get("per_tile", {}).items():
            if t.get("measured"):
                lines.append(f"| {tile} | {t['decode_s']:.2f} | {rate(_decode_flops(vae, tile), t['decode_s'])} |")
            else:
                lines.append(f"| {tile} | not measured: {t.get('reason')} | — |")
    def variant_rows(levers: dict, stock: float, tile: str, where: str, lead: str = "") -> list[str]:
        """A table row per vae_decoder variant: its decode against ``stock`` (the same process's, at ``tile``), the
        first (compiling) decode and the throughput; ``lead`` opens each row (the per-tile table's tile column)."""
        out = []
        for spec, v in levers.items():
            if v.get("measured"):
                d = _seconds(v.get("decode_s"), f"{where}.{spec}.decode_s")
                out.append(f"| {lead}{spec} | {d:.2f} | {stock / d:.2f}x | {v.get('first_s', float('nan')):.1f} | "
                           f"{rate(_decode_flops(vae, tile), d)} |")
            else:
                out.append(f"| {lead}{spec} | not measured: {v.get('error') or v.get('reason')} | | | |")
        return out

    for name, r in raws:  # the lever's variants, from every file that timed them, beside that process's stock decode
        row = (r.get("rows") or {}).get("decode15") or {}
        levers = row.get("levers") or {}
        if not (row.get("measured") is True and levers):
            continue
        tile = row.get("best_tile", "")
        stock = _seconds(row.get("measured_s"), f"{name}: rows.decode15.measured_s")
        lines += ["", f"The `vae_decoder` lever's variants at {tile} (`{name}`; h3/levers/vae_decoder.py; a first "
                  "decode compiles, the second is timed), beside the stock decode of the same process:", "",
                  "| variant | decode (s) | against stock | first decode (s) | achieved |", "|---|---|---|---|---|",
                  f"| stock (eager, unquantized) | {stock:.2f} | 1.00x | — | "
                  f"{rate(_decode_flops(vae, tile), stock)} |"]
        lines += variant_rows(levers, stock, tile, f"{name}: rows.decode15.levers")
    for name, r in raws:  # --lever-tiles: the lever's variants at several tiles, each beside its own stock decode
        per = ((r.get("rows") or {}).get("decode15") or {}).get("lever_tiles") or {}
        if not per:
            continue
        lines += ["", f"The `vae_decoder` lever's variants per tile (`{name}`; a first decode compiles, the second is "
                  "timed), each beside the stock decode at the same tile in the same process:", "",
                  "| tile | variant | decode (s) | against that tile's stock | first decode (s) | achieved |",
                  "|---|---|---|---|---|---|"]
        for tile, t in per.items():
            if not t.get("measured"):
                lines.append(f"| {tile} | — | not measured: {t.get('reason')} | | | |")
                continue
            stock = _seconds(t.get("stock_s"), f"{name}: rows.decode15.lever_tiles.{tile}.stock_s")
            lines.append(f"| {tile} | stock (eager) | {stock:.2f} | 1.00x | — | "
                         f"{rate(_decode_flops(vae, tile), stock)} |")
            lines += variant_rows(t.get("levers") or {}, stock, tile,
                                  f"{name}: rows.decode15.lever_tiles.{tile}.levers", lead=f"{tile} | ")
    for key in ("dense768", "sparse768"):
        row = rows.get(key, {})
        if row.get("measured"):
            extra = f", dense first step {row['dense_step_s']:.2f} s" if "dense_step_s" in row else ""
            lines.append(f"\n- `{key}` (`{row.get('variant')}`): forwards {[round(t, 3) for t in row['forward_s_all']]}"
                         f" s{extra}; first call(s) {row.get('first_call_s', row.get('first_calls_s', 0)):.1f} s "
                         "(compilation of the new shape).")
    notes = results / NOTES
    if notes.is_file():  # written by hand after the call: what it did not reach, what was measured beside it
        lines += ["", notes.read_text().strip()]
    return table, "\n".join(lines) + "\n"


def h200_goals_table_main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--raw", action="append", default=None, help="a raw result in --results (repeatable, oldest "
                        "first; default h200_goals_raw.json)")
    args = parser.parse_args()
    try:
        table, md = render(args.results, args.raw)
    except BadInput as exc:
        print(f"h200_goals_table: {exc}", file=sys.stderr)
        sys.exit(3)
    # the entries other studies wrote (each card's rows: runtime_speed, card_goals, gate_fraction, ...) stay
    path = args.results / "h200_goals.json"
    kept = json.loads(path.read_text()) if path.is_file() else {}
    atomic_write_json(path, {**table, **{k: v for k, v in kept.items() if k not in table}})
    atomic_write_text(args.results / "h200_goals.md", md)
    print(md, end="")


# ---- h200_goals (the CLI: bench/full_size_speed/h200_goals.py) -------------------------------------------------------


import argparse
import contextlib
import gc
import re
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from h3.atomic import atomic_write_json  # noqa: E402
from bench.lib.speed import SHAPES, TEXT_TOKENS, dit_inputs, latent_geometry, run_record  # noqa: E402

ROWS = ("request544", "decode15", "dense768", "sparse768", "request15", "request15all")
# Seconds each row needs on an H200, from bench/full_size_speed/results/h200_recipes_speed.md and h200_speed_stock.json (compile of a
# new shape ~15 s; a 544x960 FP8 forward 1.8 s, 768x1344 5.2 s, 15 s 768x1344 26-35 s; decode 2.8 s / 18.5 s at
# 304x320): a row starts only when the budget left covers its estimate.
DECODE_LEVER_MODS = ("compile", "fp8", "int8")
"""What a --decode-levers variant is made of (h3.levers.vae_decoder: compile, and one W8A8 quantization)."""
REQUEST_ROWS = {"request544", "request15", "request15all"}
"""The rows that run whole requests: only they need the text encoder."""
ESTIMATE_S = {"request544": 45, "decode15": 22, "dense768": 30, "sparse768": 45, "request15": 200, "request15all": 120}
TEXT_SIZE = dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936,
                 rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20]})


@contextlib.contextmanager
def default_dtype(dtype):
    """Build modules directly in ``dtype``: a 33 B model built in float32 first would need 133 GB."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def keep_in_fp32(model) -> None:
    """diffusers' loading rule (``from_pretrained(torch_dtype=bfloat16)``): a parameter or persistent buffer stays
    float32 when a ``_keep_in_fp32_modules`` entry is one of the dot-separated parts of its name. Per tensor, not per
    module: the VAE decoder's ``scale1`` / ``scale2`` are parameters, and in bfloat16 they left the residual stream in
    bfloat16 where the runtime's is float32, so the float32 ``norm_out`` refused it (the 2026-12-01 goals call)."""
    from h3.random_model import _keeps_float32

    persistent = set(model.state_dict().keys())
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + [
                (n, b) for n, b in model.named_buffers() if n in persistent]:
            if tensor.is_floating_point() and _keeps_float32(model, name):
                tensor.data = tensor.data.float()


def build(smoke: bool, device: str, dtype) -> SimpleNamespace:
    """The four components with seeded random weights: full size, or the tiny preset's configs (``smoke``)."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    from h3 import tiny

    torch.manual_seed(0)
    with default_dtype(dtype), torch.device(device):
        transformer = MiniMaxH3Transformer3DModel(**(tiny.TRANSFORMER_CONFIG if smoke else {})).eval()
        vae = AutoencoderKLMiniMaxH3(**(tiny.VAE_CONFIG if smoke else {})).eval()
        audio_vae = AutoencoderKLMiniMaxH3Audio(**(tiny.AUDIO_VAE_CONFIG if smoke else dict(
            latents_mean=[0.0] * 32, latents_std=[1.0] * 32))).eval()
    for model in (transformer, vae, audio_vae):  # as from_pretrained(torch_dtype=bfloat16) loads them
        keep_in_fp32(model)
    text_config = (dict(tiny.TEXT_ENCODER_CONFIG["text_config"], vocab_size=1000) if smoke else TEXT_SIZE)
    return SimpleNamespace(transformer=transformer, vae=vae, audio_vae=audio_vae, text_encoder=None,
                           text_config=Qwen3VLConfig(text_config=text_config), text_cls=Qwen3VLForConditionalGeneration)


def build_text_encoder(parts: SimpleNamespace, device: str, dtype) -> None:
    """The text encoder, built after the DiT's levers dropped its float weights (both would not fit in bf16)."""
    torch.manual_seed(1)
    with default_dtype(dtype), torch.device(device):
        parts.text_encoder = parts.text_cls(parts.text_config).eval()


def dense_variant() -> str:
    try:
        import sageattention  # noqa: F401

        return "turbo4-fp8-sage-compile"
    except ImportError:
        return "turbo4-fp8+compile"


def apply_variant(parts: SimpleNamespace, variant: str, device: str, handles: dict | None = None,
                  reversible: bool = False) -> dict:
    """``variant``'s DiT levers through the runtime's own code; ``handles`` of a previous variant are removed first
    (all but a non-reversible quantization, whose FP8 linears then stay: the new variant must not quantize again)."""
    from h3.levers import apply_recipe_levers

    from bench.lib.speed import variant_recipe

    recipe, _ = variant_recipe(variant)
    if handles:
        for name, handle in reversed(list(handles.items())):
            if name != "quant":
                handle.remove()
        torch._dynamo.reset()
        if "quant" in handles:
            recipe = recipe.model_copy(update={"quant": recipe.quant.model_copy(update={"mode": "none"})})
    pipe = SimpleNamespace(transformer=parts.transformer, text_encoder=None, vae=None, audio_vae=None)
    new = apply_recipe_levers(pipe, recipe, device=device, model_sha256="seeded-random", is_tiny=False,
                              reversible=reversible)
    if handles and "quant" in handles:
        new["quant"] = handles["quant"]
    return new


def begin_request(handles: dict) -> None:
    for handle in handles.values():
        if hasattr(handle, "begin_request"):
            handle.begin_request()


class Request:
    """One whole request at ``shape``: its inputs built once (seeded), run by :meth:`__call__`."""

    def __init__(self, parts: SimpleNamespace, shape: str, steps: int, device: str, dtype, tile: tuple[int, int]):
        self.parts, self.shape, self.steps, self.device = parts, shape, steps, device
        self.dtype, self.tile = dtype, tile
        self.num_frames, self.height, self.width = SHAPES[shape]
        self.geo = latent_geometry(*SHAPES[shape])
        self.inputs = dit_inputs(self.geo, parts.transformer.config, device=device, dtype=dtype)
        g = torch.Generator(device="cpu").manual_seed(2)
        lh, lw = self.geo["latent_hw"]
        vae_cfg = parts.vae.config
        self.video_latents = torch.randn(1, vae_cfg.latent_channels, self.geo["latent_frames"], lh, lw,
                                         generator=g).to(device, dtype)
        self.audio_latents = torch.randn(2, parts.audio_vae.config.latent_channels, self.geo["audio_latents"],
                                         generator=g).to(device, dtype)
        vocab = parts.text_config.text_config.vocab_size
        self.ids = torch.randint(0, vocab - 1, (1, TEXT_TOKENS), generator=g).to(device)

    def __call__(self, handles: dict, out_dir: Path) -> dict:
        from h3.media import encode_mp4

        stages: dict[str, float] = {}
        sync(self.device)
        t0 = last = time.perf_counter()

        def mark(name: str) -> None:
            nonlocal last
            sync(self.device)
            now = time.perf_counter()
            stages[name] = now - last
            last = now

        with torch.no_grad():
            self.parts.text_encoder.model(input_ids=self.ids, output_hidden_states=True)
            mark("text_encode")
            begin_request(handles)
            inputs = dict(self.inputs)
            sigmas = torch.linspace(1.0, 0.0, self.steps + 1)
            for i in range(self.steps):
                inputs["timestep"] = torch.tensor([float(sigmas[i])] * 2, device=self.device)
                video, audio = self.parts.transformer(**inputs)[:2]
                dt = float(sigmas[i + 1] - sigmas[i])
                inputs["hidden_states"] = inputs["hidden_states"] + dt * video.to(inputs["hidden_states"].dtype)
                inputs["audio_hidden_states"] = (inputs["audio_hidden_states"]
                                                 + dt * audio.to(inputs["audio_hidden_states"].dtype))
            mark("denoise")
            self.parts.vae.enable_tiling(tile_sample_min_height=self.tile[0], tile_sample_min_width=self.tile[1])
            frames = self.parts.vae.decode(self.video_latents, return_dict=False)[0]
            mark("video_decode")
            pcm = self.parts.audio_vae.decode(self.audio_latents, return_dict=False)[0]
            mark("audio_decode")
            frames = ((frames[0].float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0)
            host = torch.empty(frames.shape, dtype=torch.uint8, pin_memory=self.device.startswith("cuda"))
            host.copy_(frames)
            pcm = (pcm.float().clamp(-1, 1) * 32767).round().to(torch.int16).reshape(-1, pcm.shape[-1]).T.cpu()
            mark("frames_pcm_to_host")
        encode_mp4(out_dir / f"{self.shape}.mp4", host.numpy()[: self.num_frames], np.ascontiguousarray(pcm.numpy()))
        mark("mux")
        return {"total_s": time.perf_counter() - t0, "stages": stages, "frames": int(min(host.shape[0],
                                                                                         self.num_frames)),
                "video_shape": list(frames.shape), "pcm_shape": list(pcm.shape)}


def mux_smooth(req: Request, out_dir: Path) -> float:
    """The mux alone on smooth moving frames of the request's shape. Random weights decode to noise, the worst case
    for libx264 (on this machine's CPU: 5.8x slower than smooth frames at 544x960), so the request's own mux stage is
    an upper bound; a generated clip compresses like natural video, between the two."""
    from h3.media import encode_mp4

    yy, xx = np.mgrid[0:req.height, 0:req.width]
    frames = np.stack([np.stack([(xx + 4 * t) % 256, (yy + 2 * t) % 256, ((xx + yy) // 2) % 256], -1)
                       for t in range(req.num_frames)]).astype(np.uint8)
    pcm = np.zeros((round(req.num_frames / 24 * 32000), 2), np.int16)
    t0 = time.perf_counter()
    encode_mp4(out_dir / "smooth.mp4", frames, pcm)
    return time.perf_counter() - t0


def stock_forward(parts: SimpleNamespace, shape: str, repeats: int, device: str, dtype) -> dict:
    """Stock diffusers' DiT forward at ``shape`` before any lever: the bare model as built (bf16, eager, diffusers'
    default attention), its first call apart, then ``repeats + 1`` timed; the reference of the forward rows' ratios."""
    geo = latent_geometry(*SHAPES[shape])
    inputs = dit_inputs(geo, parts.transformer.config, device=device, dtype=dtype)
    out: dict = {"shape": shape, "variant": "stock: the bare bf16 DiT, eager, diffusers' default attention, no lever"}
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        t0 = time.perf_counter()
        time_forward(parts, inputs, 1, device)
        out["first_call_s"] = time.perf_counter() - t0
        times = time_forward(parts, inputs, max(1, repeats + 1), device)
        out.update(measured=True, forward_s_all=times, measured_s=statistics.median(times))
    except Exception as exc:  # an out-of-memory on a small card: the rows still run, without a stock ratio
        out.update(measured=False, error=f"{type(exc).__name__}: {exc}"[:800])
    if device == "cuda":
        out["peak_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    del inputs
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def time_forward(parts, inputs: dict, repeats: int, device: str, before=None) -> list[float]:
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            if before:
                before()
            sync(device)
            t0 = time.perf_counter()
            parts.transformer(**inputs)
            sync(device)
            times.append(time.perf_counter() - t0)
    return times


def h200_goals_main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, default=270.0, help="the time box, from the start of the process")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--decode-tiles", default="304x320")
    parser.add_argument("--decode-levers", default="", help="vae_decoder variants timed after the stock decode at "
                        "its best tile, comma-separated: compile, fp8, int8, compile+fp8, ...")
    parser.add_argument("--lever-tiles", default="", help="tiles at which the --decode-levers variants are timed, "
                        "comma-separated (default: the stock decode's best tile); each tile's stock decode is "
                        "timed too")
    parser.add_argument("--repeats", type=int, default=1, help="timed requests / forwards per row after the first")
    parser.add_argument("--decode-repeats", type=int, default=1, help="timed decodes per tile and variant (the "
                        "median is the figure; a variant's first decode, which compiles, is apart)")
    parser.add_argument("--stock", action="store_true", help="time stock diffusers' DiT forward in the same process "
                        "first (the bare bf16 model: eager, its own attention, no lever) at dense768's shape, the "
                        "reference of the dense and sparse rows' ratios on this card (the decode's stock is its "
                        "eager 256x256 tile: name it in --decode-tiles)")
    parser.add_argument("--dense-extra", default="", help="more DiT variants timed at dense768's shape after it "
                        "(e.g. turbo4-fp8-sage-compile+graphs: CUDA graphs of each compiled block), comma-separated")
    parser.add_argument("--smoke", action="store_true", help="the tiny preset's configs on the CPU, float32")
    args = parser.parse_args()
    start = time.perf_counter()
    left = lambda: args.budget_s - (time.perf_counter() - start)  # noqa: E731
    device = "cpu" if args.smoke else "cuda"
    dtype = torch.float32 if args.smoke else torch.bfloat16
    shapes = {"request544": "5s-544x960", "decode15": "15s-768x1344", "dense768": "5s-768x1344",
              "sparse768": "5s-768x1344", "request15": "15s-768x1344", "request15all": "15s-768x1344"}
    if args.smoke:
        shapes = {k: "smoke-64x64" for k in shapes}
    torch.backends.cuda.matmul.allow_tf32 = False
    # A second shape must recompile static graphs, not switch the compiled blocks to dynamic shapes (slower forward,
    # 48 s first call in h200_recipes_768_eager.json's +dynamic row).
    torch._dynamo.config.automatic_dynamic_shapes = False
    out = Path(args.out)
    result: dict = {**run_record(device), "budget_s": args.budget_s, "rows": {}, "steps": 4}
    try:
        import sageattention  # noqa: F401
        from importlib.metadata import version

        result["sageattention"] = version("sageattention")
    except ImportError:
        result["sageattention"] = None
    rows = [r for r in args.rows.split(",") if r]
    for r in rows:
        if r not in ROWS:
            parser.error(f"unknown row {r!r}; rows are {', '.join(ROWS)}")
    for flag, specs in (("--lever-tiles", args.lever_tiles), ("--decode-tiles", args.decode_tiles)):
        for spec in [v for v in specs.split(",") if v]:
            if not re.fullmatch(r"[1-9][0-9]*x[1-9][0-9]*", spec):
                parser.error(f"{flag} {spec!r}: a tile is HEIGHTxWIDTH in pixels, e.g. 304x320")
            if min(int(v) for v in spec.split("x")) <= 64:  # the VAE's default overlap (h3.levers.vae.VaeConfig)
                parser.error(f"{flag} {spec!r}: a tile must exceed the VAE's 64 px overlap (a narrower one never "
                             "covers the frame: the decode would not return)")
    if args.lever_tiles and not args.decode_levers:
        parser.error("--lever-tiles times the --decode-levers variants: name them")
    for spec in [v for v in args.decode_levers.split(",") if v]:  # else a typo would time the stock decode under it
        mods = spec.split("+")
        if any(m not in DECODE_LEVER_MODS for m in mods) or sum(m in ("fp8", "int8") for m in mods) > 1:
            parser.error(f"--decode-levers {spec!r}: a variant is compile, fp8 or int8 joined by '+' (one quantization)")
    result["dense_extra"] = {}
    for r in ROWS:
        result["rows"][r] = {"shape": shapes[r], "measured": False,
                             "reason": "not asked for (--rows)" if r not in rows else "not reached"}
    atomic_write_json(out, result)
    mux_dir = Path(tempfile.mkdtemp(prefix="h3goals"))
    t = time.perf_counter()
    parts = build(args.smoke, device, dtype)
    result["build_dit_vae_s"] = time.perf_counter() - t
    if args.stock and {"dense768", "sparse768"} & set(rows):
        result["stock"] = {"dense768": stock_forward(parts, shapes["dense768"], args.repeats, device, dtype)}
        atomic_write_json(out, result)
        print("stock", result["stock"], flush=True)
    variant = "turbo4" if args.smoke else dense_variant()  # FP8 is refused on the CPU
    result["dense_variant"] = variant
    t = time.perf_counter()
    handles = apply_variant(parts, variant, device)
    result["apply_levers_s"] = time.perf_counter() - t
    t = time.perf_counter()
    if REQUEST_ROWS & set(rows):
        build_text_encoder(parts, device, dtype)
        result["build_text_s"] = time.perf_counter() - t
    else:  # the forward and decode rows never encode text; a 62 GiB encoder would not fit an 80 GB card beside them
        result["build_text_s"] = None
        result["text_encoder"] = "not built: no request row asked for"
    if device == "cuda":
        result["resident_GiB"] = torch.cuda.memory_allocated() / 2**30
    atomic_write_json(out, result)
    tile = (304, 320)

    def run_row(name: str, fn) -> None:
        row = result["rows"][name]
        if name not in rows:
            return
        if left() < ESTIMATE_S[name] and not args.smoke:
            row["reason"] = f"out of the time box: {left():.0f} s left, the row needs about {ESTIMATE_S[name]} s"
            atomic_write_json(out, result)
            return
        t0 = time.perf_counter()
        try:
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            row.update(fn())
            row["measured"] = True
            row.pop("reason", None)
        except Exception as exc:  # keep what the other rows measure
            row["error"] = f"{type(exc).__name__}: {exc}"
            row["traceback"] = traceback.format_exc()[-2500:]
            row["reason"] = "failed"
        row["wall_s"] = time.perf_counter() - t0
        if device == "cuda":
            row["peak_GiB"] = torch.cuda.max_memory_allocated() / 2**30
        atomic_write_json(out, result)
        print(name, {k: v for k, v in row.items() if k != "traceback"}, flush=True)

    def request_row(shape: str, steps: int, hs: dict) -> dict:
        req = Request(parts, shape, steps, device, dtype, tile)
        first = req(hs, mux_dir)
        timed = [req(hs, mux_dir) for _ in range(args.repeats)]
        best = min(timed, key=lambda r: r["total_s"])
        return {"variant": variant, "tile": list(tile), "first_request": first, "requests": timed,
                "measured_s": statistics.median(r["total_s"] for r in timed), "fastest": best,
                "mux_smooth_frames_s": mux_smooth(req, mux_dir)}

    run_row("request544", lambda: request_row(shapes["request544"], 4, handles))

    def decode_row() -> dict:
        geo = latent_geometry(*SHAPES[shapes["decode15"]])
        lh, lw = geo["latent_hw"]
        g = torch.Generator(device="cpu").manual_seed(3)
        z = torch.randn(1, parts.vae.config.latent_channels, geo["latent_frames"], lh, lw, generator=g).to(device,
                                                                                                             dtype)
        def one_decode() -> float:
            with torch.no_grad():
                sync(device)
                t0 = time.perf_counter()
                parts.vae.decode(z, return_dict=False)
                sync(device)
            return time.perf_counter() - t0

        def timed_decode() -> float:  # the median of --decode-repeats decodes
            return statistics.median(one_decode() for _ in range(max(1, args.decode_repeats)))

        per_tile = {}
        for spec in args.decode_tiles.split(","):
            th, tw = (int(v) for v in spec.split("x"))
            if per_tile and left() < ESTIMATE_S["decode15"]:
                per_tile[spec] = {"measured": False, "reason": f"out of the time box: {left():.0f} s left"}
                continue
            parts.vae.enable_tiling(tile_sample_min_height=th, tile_sample_min_width=tw)
            per_tile[spec] = {"measured": True, "decode_s": timed_decode()}
        done = {k: v["decode_s"] for k, v in per_tile.items() if v.get("measured")}
        best = min(done, key=done.get)
        # the vae_decoder lever's variants at the best tile, after the stock decode: a first decode compiles, the
        # second is timed (h3.levers.vae_decoder)
        from h3.levers.vae_decoder import VaeDecoderConfig, apply_vae_decoder

        def lever_variants() -> dict:
            levers = {}
            for spec in [v for v in args.decode_levers.split(",") if v]:
                if left() < 2 * ESTIMATE_S["decode15"]:
                    levers[spec] = {"measured": False, "reason": f"out of the time box: {left():.0f} s left"}
                    continue
                mods = spec.split("+")
                config = VaeDecoderConfig(compile="compile" in mods,
                                          quant=next((f"{m}_w8a8" for m in mods if m in ("fp8", "int8")), "none"))
                try:
                    handle = apply_vae_decoder(parts.vae, config, allow_cpu_fp8=args.smoke)
                    try:
                        first = one_decode()
                        levers[spec] = {"measured": True, "first_s": first, "decode_s": timed_decode(),
                                        "decode_repeats": max(1, args.decode_repeats),
                                        "telemetry": handle.telemetry()}
                    finally:
                        handle.remove()
                except Exception as exc:  # keep the row: the stock decode is measured
                    levers[spec] = {"measured": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
            return levers

        th, tw = (int(v) for v in best.split("x"))
        parts.vae.enable_tiling(tile_sample_min_height=th, tile_sample_min_width=tw)
        levers = lever_variants() if not args.lever_tiles else {}
        # --lever-tiles: the variants at each of those tiles, beside that tile's own stock decode (the best tile for
        # a compiled decoder need not be the eager one's)
        lever_tiles = {}
        for spec in [v for v in args.lever_tiles.split(",") if v]:
            if left() < 3 * ESTIMATE_S["decode15"]:
                lever_tiles[spec] = {"measured": False, "reason": f"out of the time box: {left():.0f} s left"}
                continue
            th, tw = (int(v) for v in spec.split("x"))
            parts.vae.enable_tiling(tile_sample_min_height=th, tile_sample_min_width=tw)
            lever_tiles[spec] = {"measured": True, "stock_s": timed_decode(), "levers": lever_variants()}
        return {"per_tile": per_tile, "best_tile": best, "measured_s": done[best], "levers": levers,
                "lever_tiles": lever_tiles,
                "note": "one decode per tile, VAE eager (uncompiled)"
                        + ("; the VAE had run 304x320 tiles at 544x960 in the request row first (cuDNN autotune warm)"
                           if "request544" in rows else "; no request row ran before it (the first tile's decode warms "
                           "cuDNN's autotune)")
                        + "; `levers`: the vae_decoder lever's variants at the best tile (not the row's figure); "
                          "`lever_tiles`: the variants at each --lever-tiles tile, beside that tile's stock decode"}

    run_row("decode15", decode_row)

    def dense_row() -> dict:
        geo = latent_geometry(*SHAPES[shapes["dense768"]])
        inputs = dit_inputs(geo, parts.transformer.config, device=device, dtype=dtype)
        t0 = time.perf_counter()
        time_forward(parts, inputs, 1, device)
        first = time.perf_counter() - t0
        times = time_forward(parts, inputs, max(1, args.repeats + 1), device)
        return {"variant": variant, "first_call_s": first, "forward_s_all": times,
                "measured_s": statistics.median(times), "sequence_length": geo["text_rows"] + geo["audio_rows"]
                + geo["video_rows"]}

    run_row("dense768", dense_row)

    def sparse_row() -> dict:
        nonlocal handles
        sparse_variant = "turbo4-sparse+sparse85" if args.smoke else "turbo4-sparse+sparse85+compile"
        handles = apply_variant(parts, sparse_variant, device, handles)
        geo = latent_geometry(*SHAPES[shapes["sparse768"]])
        inputs = dit_inputs(geo, parts.transformer.config, device=device, dtype=dtype)
        state = handles["sparse_attention"]

        def dense_first():
            begin_request(handles)

        def sparse_next():
            state.step, state.dense_step = 1, False

        t0 = time.perf_counter()
        time_forward(parts, inputs, 1, device, dense_first)
        time_forward(parts, inputs, 1, device, sparse_next)
        first = time.perf_counter() - t0
        dense = time_forward(parts, inputs, 1, device, dense_first)
        sparse = time_forward(parts, inputs, max(1, args.repeats + 1), device, sparse_next)
        from h3.levers import lever_telemetry

        tel = lever_telemetry(handles).get("sparse_attention", {})
        return {"variant": sparse_variant + ("" if args.smoke else " on the FP8 linears of " + variant),
                "first_calls_s": first, "dense_step_s": dense[0], "forward_s_all": sparse,
                "measured_s": statistics.median(sparse), "telemetry": {k: v for k, v in tel.items()
                                                                        if isinstance(v, (int, float, str))}}

    run_row("sparse768", sparse_row)

    def request15_row() -> dict:
        if "sparse_attention" not in handles:
            raise RuntimeError("the 15 s request needs the sparse row's levers")
        row = request_row(shapes["request15"], 4, handles)
        row["variant"] = "turbo4-sparse+sparse85+compile on FP8 linears (dense first step)"
        return row

    run_row("request15", request15_row)

    def request15all_row() -> dict:
        if "sparse_attention" not in handles:
            raise RuntimeError("the 15 s request needs the sparse row's levers")
        state = handles["sparse_attention"]
        state.config = state.config.model_copy(update={"dense_steps": 0})
        row = request_row(shapes["request15all"], 4, handles)
        from h3.levers import lever_telemetry

        tel = lever_telemetry(handles).get("sparse_attention", {})
        row["variant"] = "turbo4-sparse+sparse85+compile on FP8 linears, every step sparse (dense_steps 0)"
        row["telemetry"] = {k: v for k, v in tel.items() if isinstance(v, (int, float, str))}
        return row

    run_row("request15all", request15all_row)
    # further dense variants last: a failure there (CUDA graphs' memory, say) cannot cost a goal row
    for extra in [v for v in args.dense_extra.split(",") if v]:
        if left() < 2 * ESTIMATE_S["dense768"]:
            result["dense_extra"][extra] = {"measured": False, "reason": f"out of the time box: {left():.0f} s left"}
            continue
        try:
            handles = apply_variant(parts, extra, device, handles)
            result["dense_extra"][extra] = {"measured": True, **dense_row(), "variant": extra}
        except Exception as exc:  # keep the rows: the next variant re-applies its levers
            result["dense_extra"][extra] = {"measured": False, "error": f"{type(exc).__name__}: {exc}"[:800]}
        atomic_write_json(out, result)
        print(extra, result["dense_extra"][extra], flush=True)
    result["wall_s"] = time.perf_counter() - start
    atomic_write_json(out, result)
    print("wrote", out, "in", round(result["wall_s"], 1), "s", flush=True)


# ---- gate_fraction (the CLI: bench/gates_speed/gate_fraction.py) ------------------------------------------------------
# Issue 54: every per-pair release gate over real decoded clips of the fast recipe at 5 s 768x1344, at most 2 % of its
# generation; one call of bench/device/gate_fraction.sh into results/gpu_fraction/NAME.{json,md} and the goals' entry.
# A pair's gating time is what `h3eval gate` prints for it ("gates: i/n pairs, <candidate>/<pair> (X s)": every chosen
# gate on that pair, clips decoded once, inside the process: the interpreter's start and imports are not counted); the
# warm figure is the median over the pairs of the runs after the first (the first loads LPIPS and warms the kernels);
# the generation time is the candidate's warm generation-side p50 from the run's speed.json (mixed protocol).

import tarfile
from datetime import datetime, timezone

ROOT_DIR = Path(__file__).resolve().parents[2]
GATE_FRACTION_RESULTS = ROOT_DIR / "bench" / "gates_speed" / "results" / "gpu_fraction"
GATE_FRACTION_TARGET = 0.02
"""The issue's bound: all release gates at most 2 % of generation for the fast recipe at 5 s 768x1344."""
GATE_PAIR_LINE = re.compile(r"gates: \d+/\d+ pairs, (?P<cand>[^/\s]+)/(?P<pair>\S+) \((?P<s>[0-9.]+) s\)")


def _gf_positive(value, what: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise BadInput(f"{what}: not a positive finite number ({value!r})")
    return float(value)


def gate_pair_seconds(log: str) -> dict[str, float]:
    """Each pair's gating seconds as one ``h3eval gate`` log prints them."""
    return {f"{m['cand']}/{m['pair']}": _gf_positive(float(m["s"]), f"pair {m['pair']}") for m in GATE_PAIR_LINE.finditer(log)}


def read_gate_call(tgz: Path) -> dict:
    """The call's gate logs, gate_times.json, speed.json and card, from the tarball."""
    if not tgz.is_file():
        raise BadInput(f"{tgz}: missing (the call returns gate_fraction.tgz)")
    out: dict = {"logs": {}}
    with tarfile.open(tgz) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            text = tar.extractfile(member).read().decode("utf-8", "replace")
            name = member.name
            if re.fullmatch(r"gate_\d+\.log", name):
                out["logs"][int(name[5:-4])] = text
            elif re.fullmatch(r"run/gates/[^/]+/[^/]+/[^/]+\.json", name):
                out.setdefault("results", {})[name] = json.loads(text)
            elif re.fullmatch(r"run_serial/gates/[^/]+/[^/]+/[^/]+\.json", name):
                out.setdefault("serial_results", {})[name] = json.loads(text)
            elif name in ("gate_times.json", "run/speed.json", "card.txt"):
                out[name] = json.loads(text) if name.endswith(".json") else text.strip()
    for need in ("gate_times.json", "run/speed.json"):
        if need not in out:
            raise BadInput(f"{tgz}: holds no {need}")
    return out


def per_gate_seconds(results: dict[str, dict]) -> dict[str, list[float]]:
    """Gate -> its wall seconds on each pair of the call's last gate run (``info["gate_s"]`` of the results in
    run/gates, pair order; written by h3eval.gaterun since session 33, absent before)."""
    out: dict[str, list[float]] = {}
    for name in sorted(results):
        value = (results[name].get("info") or {}).get("gate_s")
        if value is not None:
            out.setdefault(name.split("/")[-3], []).append(_gf_positive(float(value), f"{name} gate_s"))
    return out


def summarize_gate_call(call: dict) -> dict:
    """The warm per-pair gating time, the candidate's generation time and their ratio."""
    times = call["gate_times.json"]
    cand = times.get("candidate")
    runs = {i: gate_pair_seconds(log) for i, log in sorted(call["logs"].items())}
    # Each `h3eval gate` is a new process whose first pair runs its gates one after another with their lazy imports
    # and model loads (h3eval.gaterun's _warm); a signoff of 16+ pairs pays that once. Warm: the pairs after the
    # first of each run after the first.
    warm = [s for i, pairs in runs.items() if i > 1 for s in list(pairs.values())[1:]]
    if not warm:
        raise BadInput("no warm gate run (a run after the first) printed a pair after its first")
    mixed = call["run/speed.json"].get("protocols", {}).get("mixed", {})
    row = mixed.get(cand)
    if not isinstance(row, dict) or row.get("status") != "ok":
        raise BadInput(f"speed.json: the candidate {cand!r} has no ok row in the mixed protocol")
    gen = _gf_positive(row["generation_side_latency_s"]["p50"], f"{cand} generation-side p50")
    gate = statistics.median(warm)
    card = call.get("card.txt") or ""
    secs, height, width = (str(times.get("shape", "? ? ?")).split() + ["?", "?", "?"])[:3]
    return {"candidate": cand, "gates": times.get("gates"), "device": times.get("device"), "shape": f"{secs} s {height}x{width}",
            "card": card.split(",")[0] if "nvidia-smi" not in card and card else "no GPU (a CPU rehearsal)", "pairs_per_run": {str(i): p for i, p in runs.items()},
            "gate_runs": times.get("walls_s"), "gate_s_per_pair_warm_median": gate, "warm_pairs": len(warm),
            "generation_side_p50_s": gen, "generation_requests": row.get("n"), "fraction": gate / gen,
            "per_gate_s_last_run": per_gate_seconds(call.get("results", {})),
            "per_gate_s_serial": per_gate_seconds(call.get("serial_results", {})),
            "target": GATE_FRACTION_TARGET, "met": gate / gen <= GATE_FRACTION_TARGET}


def _gate_goal_entry(data: dict, source: str):
    card = data["card"]
    name = f"gate fraction: every per-pair release gate over a {data['shape']} `{data['candidate']}` pair ({card})"
    return name, {"target": f"<= {GATE_FRACTION_TARGET:.0%} of generation", "measured": round(data["fraction"], 4),
                  "gate_s_per_pair": round(data["gate_s_per_pair_warm_median"], 3),
                  "generation_side_p50_s": round(data["generation_side_p50_s"], 3), "card": card,
                  "met": data["met"], "record": source, "date": data["date"]}


def _per_gate_table(data: dict) -> str:
    per = data.get("per_gate_s_last_run") or {}
    if not per:
        return ""
    serial = data.get("per_gate_s_serial") or {}
    rows = "".join(f"| {g} | {' / '.join(f'{v:.2f}' for v in vs)} |"
                   + (f" {' / '.join(f'{v:.2f}' for v in serial.get(g, []))} |" if serial else "") + "\n"
                   for g, vs in per.items())
    head = "| gate | s per pair, last run |" + (" s per pair, one gate after another |" if serial else "")
    return ("\nEach gate's wall seconds on the run's pairs (`info.gate_s`; in the last run side by side with the pair's "
            "other gates after the first pair" + ("; then a run on a copy with the gates one after another, "
            "`GF_SERIAL=1`, whose first pair is cold" if serial else "") + "):\n\n" + head + "\n|---|---|"
            + ("---|" if serial else "") + "\n" + rows)


def gate_fraction_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Record one call of bench/device/gate_fraction.sh")
    ap.add_argument("--from", dest="src", type=Path, required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--goals", type=Path, default=None, help="h200_goals.json to update (default: the shipped one)")
    args = ap.parse_args(argv)
    try:
        data = summarize_gate_call(read_gate_call(args.src / "gate_fraction.tgz"))
    except (BadInput, KeyError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    data.update(date=datetime.now(timezone.utc).isoformat(timespec="seconds"), command=args.command,
                commit=args.commit)
    GATE_FRACTION_RESULTS.mkdir(parents=True, exist_ok=True)
    record = GATE_FRACTION_RESULTS / f"{args.name}.json"
    atomic_write_json(record, data)
    atomic_write_text(GATE_FRACTION_RESULTS / f"{args.name}.md", (
        f"# {args.name}: gates as a fraction of generation\n\n- date: {data['date']}\n- card: {data['card']}\n"
        f"- commit: {args.commit}\n- command: `{args.command}`\n- gates: {data['gates']} on {data['device']}\n\n"
        f"Warm gating per pair (median of {data['warm_pairs']} pairs of runs 2+): "
        f"**{data['gate_s_per_pair_warm_median']:.2f} s**; `{data['candidate']}` generation-side p50 "
        f"{data['generation_side_p50_s']:.2f} s ({data['generation_requests']} requests): **{data['fraction']:.1%}** "
        f"(target <= {GATE_FRACTION_TARGET:.0%}: {'met' if data['met'] else 'missed'}).\n"
        f"Warm: every pair after the first of each `h3eval gate` run after the first (a run's first pair pays the "
        f"process's lazy imports and model loads, once per signoff).\n" + _per_gate_table(data)))
    kwargs = {"goals": args.goals} if args.goals else {}
    print(write_goal_entry(__file__, record, _gate_goal_entry, **kwargs))
    return 0


# ---- card_goals (the CLI: bench/card_goals/card_goals.py) --------------------------------------------------------------
# Issue 54: the forward and decode goals on the card a call lands on (an H100 or an H200), each beside stock diffusers
# timed in the same process (`h200_goals.py --stock`): the dense and 85 % sparse DiT forwards at 5 s 768x1344 against
# the bare bf16 forward, the 15 s 768x1344 video decode of the shipped recipes (compiled decoder, 304x320 tiles)
# against the eager decode at stock's 256x256 tiles. One entry per goal in h200_goals.json, named with its card.

CARD_GOALS_RESULTS = ROOT_DIR / "bench" / "card_goals" / "results"
SHIPPED_DECODE = ("304x320", "compile")
"""The decode turbo4-fp8-sage-compile and turbo4-sparse ship: the compiled decoder blocks at 304x320 tiles."""
STOCK_TILE = "256x256"
"""stock4's (and the baseline's) VAE tile."""


def _measured(row, where: str) -> float | None:
    """A row's seconds when it says it was measured (a finite positive number, else BadInput), else None."""
    if not isinstance(row, dict) or row.get("measured") is not True:
        return None
    key = "measured_s" if "measured_s" in row else "decode_s"
    return _seconds(row.get(key), f"{where}.{key}")


def _card_entry(goal: str, card: str, measured: float | None, stock_s: float | None, target: float,
                **info) -> tuple:
    name = f"{goal} ({card})"
    if measured is None:
        return name, {"measured": None, "target": target, "unit": "s", "met": None, "card": card, **info}
    entry = {"measured": round(measured, 3), "target": target, "unit": "s", "met": measured <= target, "card": card,
             "ratio_to_stock": round(stock_s / measured, 3) if stock_s is not None else None, **info}
    return name, entry


def card_goal_entries(raw: dict, source: str) -> dict[str, dict]:
    """The entries one ``--stock`` call gives: each goal it measured (or says why not) with its card and its ratio to
    the stock figure of the same process; BadInput for a value that cannot be a measurement."""
    card = raw.get("device")
    if not isinstance(card, str) or not card or card.startswith("cpu"):
        raise BadInput(f"{source}: 'device' {card!r} names no card (a CPU smoke run is not a goal's figure)")
    rows = raw.get("rows")
    if not isinstance(rows, dict):
        raise BadInput(f"{source} has no 'rows' object")
    for key in ("dense768", "sparse768", "decode15"):
        row = rows.get(key) or {}
        if row.get("measured") is True and row.get("shape") != SHAPE[key]:
            raise BadInput(f"{source}: rows.{key} was measured at {row.get('shape')!r}; the goal is at {SHAPE[key]}")
    stock_row = (raw.get("stock") or {}).get("dense768")
    stock = _measured(stock_row, f"{source}: stock.dense768")
    common = {"source": source, "date": raw.get("date"), "stock": (
        "stock diffusers' forward in the same process before any lever: the bare bf16 DiT, eager, its own attention"
        if stock is not None else f"not measured: {(stock_row or {}).get('error') or 'no --stock'}")}
    out = {}
    dense, sparse = rows.get("dense768") or {}, rows.get("sparse768") or {}
    for key, goal, target, row in (("dense768", "dense DiT forward at 5 s 768×1344", 3.3, dense),
                                   ("sparse768", "85% sparse forward at 5 s 768×1344", 1.6, sparse)):
        secs = _measured(row, f"{source}: rows.{key}")
        timed = len(row.get("forward_s_all") or [])
        name, entry = _card_entry(goal, card, secs, stock, target, variant=row.get("variant"), **common,
                                  measured_as=f"median of {timed} forwards after the first (which compiles)")
        if secs is None:
            entry["not_measured"] = str(row.get("error") or row.get("reason") or "no row")
        out[name] = entry
    dec = rows.get("decode15") or {}
    tile, lever = SHIPPED_DECODE
    per_tile = dec.get("per_tile") or {}
    stock_dec = _measured(per_tile.get(STOCK_TILE), f"{source}: rows.decode15.per_tile.{STOCK_TILE}")
    shipped = ((dec.get("lever_tiles") or {}).get(tile) or {}).get("levers", {}).get(lever)
    secs = _measured(shipped, f"{source}: rows.decode15.lever_tiles.{tile}.levers.{lever}")
    name, entry = _card_entry(
        "video decode at 15 s 768×1344", card, secs, stock_dec, 6.0, source=source, date=raw.get("date"),
        variant=f"the shipped decode: compiled decoder blocks, {tile} tiles (turbo4-fp8-sage-compile, turbo4-sparse)",
        stock=f"the eager decode at stock's {STOCK_TILE} tiles, same process" if stock_dec is not None
        else f"not measured: no {STOCK_TILE} tile in --decode-tiles",
        measured_as=f"median of {(shipped or {}).get('decode_repeats', 1)} decodes after the first (which compiles)")
    if secs is None:
        entry["not_measured"] = str((shipped or {}).get("error") or dec.get("error") or dec.get("reason")
                                    or "no compiled 304x320 decode (--decode-levers compile --lever-tiles 304x320)")
    out[name] = entry
    return out


def _card_table(raw: dict, entries: dict) -> str:
    lines = ["| goal | measured (s) | target (s) | met | x stock | stock (s) | variant |", "|---|---|---|---|---|---|---|"]
    for name, e in entries.items():
        stock = (f"{e['measured'] * e['ratio_to_stock']:.2f}" if e.get("ratio_to_stock") and e["measured"] else "—")
        lines.append(f"| {name} | {e['measured'] if e['measured'] is not None else 'not measured'} | {e['target']} | "
                     f"{ {True: 'met', False: 'missed', None: '—'}[e['met']]} | "
                     f"{str(e.get('ratio_to_stock') or '—') + ('x' if e.get('ratio_to_stock') else '')} | {stock} | "
                     f"{e.get('variant') or ''} |")
    extra = raw.get("dense_extra") or {}
    if extra:
        lines += ["", "Further dense variants at the same shape, after the dense row (same process):", "",
                  "| variant | forward (s) | first call (s) | x stock |", "|---|---|---|---|"]
        stock = (raw.get("stock") or {}).get("dense768", {}).get("measured_s")
        for v, r in extra.items():
            if r.get("measured"):
                s = _seconds(r.get("measured_s"), f"dense_extra.{v}.measured_s")
                lines.append(f"| {v} | {s:.3f} | {r.get('first_call_s', float('nan')):.1f} | "
                             + (f"{stock / s:.2f}x |" if stock else "— |"))
            else:
                lines.append(f"| {v} | not measured: {r.get('error') or r.get('reason')} | | |")
    return "\n".join(lines)


def card_goals_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Record one `h200_goals.py --stock` call as the goals of its card")
    ap.add_argument("--from", dest="src", type=Path, required=True, help="the call's files (h200_goals_raw.json)")
    ap.add_argument("--name", required=True)
    ap.add_argument("--command", required=True, help="the device call, as run")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--goals", type=Path, default=None, help="h200_goals.json to update (default: the shipped one)")
    ap.add_argument("--results", type=Path, default=CARD_GOALS_RESULTS)
    args = ap.parse_args(argv)
    try:
        raw = _load(args.src, "h200_goals_raw.json")
        record = args.results / f"{args.name}.json"
        entries = card_goal_entries(raw, str(record.relative_to(ROOT_DIR)) if record.is_relative_to(ROOT_DIR)
                                    else str(record))
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    data = {**raw, "call": args.command, "commit": args.commit, "entries": entries,
            "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    args.results.mkdir(parents=True, exist_ok=True)
    atomic_write_json(record, data)
    atomic_write_text(args.results / f"{args.name}.md", (
        f"# {args.name}: the forward and decode goals on one {raw['device']}\n\n- date: {raw.get('date')}\n"
        f"- commit: {args.commit}\n- call: `{args.command}`\n"
        f"- torch {raw.get('torch')}, CUDA {raw.get('cuda')}, diffusers {raw.get('diffusers')}, "
        f"SageAttention {raw.get('sageattention')}; {raw.get('weights')}\n\n" + _card_table(raw, entries) + "\n"))
    goals_path = args.goals or GOALS_JSON
    table = json.loads(goals_path.read_text())
    table.update(entries)
    atomic_write_json(goals_path, table)
    for name, entry in entries.items():
        print(f"{name}: {json.dumps(entry)}")
    return 0
