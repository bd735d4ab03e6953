"""Issue 23's goals table from the measured rows of bench/h200_goals.py: every goal met, missed or not measured.

    python bench/h200_goals_table.py [--results bench/results] [--raw h200_goals_raw.json --raw ...]

Reads the raw results of bench/h200_goals.py on the H200 (``--raw``, in rising precedence, default
``h200_goals_raw.json``: each row is taken from the last file given that measured it, so calls that measured different
rows combine, and each goal names its file; the vae_decoder lever's variants are shown from every file that timed
them, beside the stock decode of the same process), ``h200_speed_stock.json`` (the chip's measured bf16
and fp8 matmul ceilings), ``h200_recipes_768.json`` (the dense forward's FLOPs at 5 s 768x1344, counted on the same
config) and ``vae_decode_flops.json`` (bench/vae_decode_flops.py: the tiled decode's FLOPs) from ``--results``, and
writes there ``h200_goals.json`` in the issue's form, one entry per goal::

    {"<goal>": {"measured": <s>, "target": <s>, "unit": "s", "met": true|false, "source": "<file>"}}

(a goal not measured: ``"measured": null, "met": null`` and ``"not_measured"`` with the reason; never a number), and
``h200_goals.md``: the verdicts with the achieved TFLOP/s against the ceilings, the requests' stages, provenance.
Bad input (a missing file, a measured row without a finite positive time) is one clear error and exit 3.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from h3.atomic import atomic_write_json, atomic_write_text  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
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
                         "source": f"bench/results/{source}"}
        else:
            reason = row.get("error") or row.get("reason") or "no row in the raw result"
            out[goal] = {"measured": None, "target": target, "unit": "s", "met": None,
                         "source": f"bench/results/{source}", "not_measured": str(reason)}
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
             "- rendered by `python bench/h200_goals_table.py"
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


def main() -> None:
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
    atomic_write_json(args.results / "h200_goals.json", table)
    atomic_write_text(args.results / "h200_goals.md", md)
    print(md, end="")


if __name__ == "__main__":
    main()
