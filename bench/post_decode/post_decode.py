"""Issue 54: where a request's time goes from the end of the video decode to the file, and what streaming the MP4
encode into the decode (h3.post_decode) buys, through ``H3Runtime.generate``.

    python bench/post_decode/post_decode.py [--model tiny-random] [--recipe NAME|TOML] [--steps N] [--shape 5x544x960]
        [--pairs 3] [--device cpu] [--text-encoder resident] [--name NAME]

One process, one loaded model: a first request (streamed) warms it and is not counted, then ``--pairs`` pairs of the
same request (prompt and seed) with the stream off and on, in alternating order. Per request: generation-side and
request-to-file latency, the stages after the denoise (video decode, audio decode, frame prep + D2H, mux/save), the
record's ``post_decode`` entry (chunks, the encoder thread's busy seconds) and the seconds ``generate`` spent after
the file was in place (the record: hashes, its JSON). Per pair: whether the two clips' frames, PCM and MP4 bytes are
the same (the stream must not change a byte: the script exits 1 if a pair decoded the same frames and PCM and wrote
different MP4s). ``--steps`` overrides the recipe's step count (the CPU rehearsal runs 2:
the post-decode stages do not depend on it). Random-weight presets make noise-like frames, libx264's slowest content.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.lib import results  # noqa: E402

PROMPTS = ["a red ball rolls across a wooden floor while a clock ticks",
           "waves break on a rocky shore at dusk, gulls call overhead",
           "a man in a blue coat walks through falling snow and speaks quietly"]
STAGES = ("video_decode", "audio_decode", "frame_prep_d2h", "mux_save")


def run(args) -> dict:
    from h3.recipe import load_recipe, recipe_from_dict
    from h3.request import GenerateRequest
    from h3.runtime import H3Runtime

    recipe = load_recipe(args.recipe)
    if args.steps:
        data = recipe.resolved()
        data["steps"] = args.steps
        recipe = recipe_from_dict({k: v for k, v in data.items() if v is not None}, source=f"{args.recipe}+steps")
    seconds, height, width = (float(v) if i == 0 else int(v) for i, v in enumerate(args.shape.split("x")))
    runtime = H3Runtime.load(args.model, recipe, args.device, text_encoder=args.text_encoder)
    out = Path(tempfile.mkdtemp(prefix="post_decode_"))
    requests = []

    def one(index: int, stream: bool, seed: int, warm: bool) -> dict:
        runtime.stream_mux = stream
        request = GenerateRequest(prompt=PROMPTS[seed % len(PROMPTS)], seed=seed, seconds=seconds, height=height,
                                  width=width)
        path = out / f"{index:02d}-s{seed}-{'on' if stream else 'off'}.mp4"
        start = time.perf_counter()
        record = runtime.generate(request, path)
        wall = time.perf_counter() - start
        stages = record.timings.stage_anatomy
        row = {"index": index, "warm": warm, "seed": seed, "stream": stream, "clip": path.name,
               "generation_side_s": record.timings.generation_side_latency_s,
               "request_to_file_s": record.timings.request_to_file_latency_s,
               "after_file_s": wall - record.timings.request_to_file_latency_s,
               **{f"{s}_s": getattr(stages, s) for s in STAGES},
               "post_decode": record.extra.get("post_decode"), "mp4_bytes": record.mp4_bytes,
               "frames_sha256": record.frames_sha256, "pcm_sha256": record.pcm_sha256, "mp4_sha256": record.mp4_sha256}
        print(f"{index:2d} seed {seed} stream {'on ' if stream else 'off'} gen {row['generation_side_s']:7.2f} s  "
              f"file {row['request_to_file_s']:7.2f} s  decode {row['video_decode_s']:6.2f}  prep "
              f"{row['frame_prep_d2h_s']:6.2f}  mux {row['mux_save_s']:6.2f}  after {row['after_file_s']:5.2f}",
              flush=True)
        return row

    requests.append(one(0, True, 100, warm=False))
    pairs = []
    for p in range(args.pairs):
        order = (False, True) if p % 2 == 0 else (True, False)
        rows = {stream: one(len(requests) + k, stream, p, warm=True) for k, stream in enumerate(order)}
        requests.extend(rows[s] for s in order)
        pairs.append({"seed": p, **{f"same_{k}": rows[False][f"{k}_sha256"] == rows[True][f"{k}_sha256"]
                                    for k in ("frames", "pcm", "mp4")}})
    summary = {}
    for stream in (False, True):
        warm = [r for r in requests if r["warm"] and r["stream"] == stream]
        summary["on" if stream else "off"] = {
            f"{k}_p50": statistics.median(r[k] for r in warm)
            for k in ("generation_side_s", "request_to_file_s", "after_file_s", *(f"{s}_s" for s in STAGES))}
    return {"model": args.model, "recipe": recipe.name, "steps": recipe.steps, "shape": args.shape,
            "device": args.device, "card": _card(args.device), "requests": requests, "pairs": pairs,
            "summary": summary}


def _card(device: str) -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else None


def table(data: dict) -> str:
    keys = ("generation_side_s", "request_to_file_s", *(f"{s}_s" for s in STAGES), "after_file_s")
    lines = [f"{data['model']} `{data['recipe']}` ({data['steps']} DiT steps), {data['shape']}, {data['device']}"
             + (f" ({data['card']})" if data["card"] else "") + f"; warm p50 over {len(data['pairs'])} pairs", "",
             "| stream | " + " | ".join(k[:-2] for k in keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for name in ("off", "on"):
        lines.append(f"| {name} | " + " | ".join(f"{data['summary'][name][k + '_p50']:.2f}" for k in keys) + " |")
    inputs = [p for p in data["pairs"] if p["same_frames"] and p["same_pcm"]]
    lines += ["", f"Pairs whose two requests decoded the same frames and PCM: {len(inputs)} of {len(data['pairs'])} "
              "(a device's decode may differ from run to run); of those, the same MP4 bytes with the stream off and "
              f"on: {sum(p['same_mp4'] for p in inputs)} of {len(inputs)}."]
    return "\n".join(lines)


def stream_changed_bytes(data: dict) -> bool:
    """Whether a pair with the same frames and PCM got different MP4 bytes from the stream (the failure to catch)."""
    return any(p["same_frames"] and p["same_pcm"] and not p["same_mp4"] for p in data["pairs"])


GOAL_S = 2.0
GOAL_SHAPE = "15x768x1344"


def goal_entry(record: dict, source: str) -> tuple[str, dict]:
    """Issue 54's mux goal (<= 2 s at 15 s 768x1344) as the request's own mux stage: the p50 of ``mux_save`` (what is
    left of the encode after the video decode) of the streamed requests, the same requests' serial path (stream off,
    same call, same frames) as the ratio's reference, and the encoder thread's busy seconds beside it (the encode's
    whole cost, hidden under the decode)."""
    if record.get("shape") != GOAL_SHAPE or not record.get("card"):
        raise ValueError(f"{source}: not a {GOAL_SHAPE} record from a card (shape {record.get('shape')!r}, "
                         f"card {record.get('card')!r})")
    on, off = record["summary"]["on"]["mux_save_s_p50"], record["summary"]["off"]["mux_save_s_p50"]
    for value in (on, off):
        if not (isinstance(value, (int, float)) and 0 < value < 3600):
            raise ValueError(f"{source}: mux_save {value!r} is not a time in seconds")
    busy = [r["post_decode"]["encode_busy_s"] for r in record["requests"]
            if r["warm"] and r["stream"] and (r.get("post_decode") or {}).get("streamed")]
    if not busy:
        raise ValueError(f"{source}: no warm streamed request")
    name = f"mux stage of a 15 s 768×1344 request, encode streamed into the decode ({record['card']})"
    return name, {
        "measured": round(on, 3), "target": GOAL_S, "unit": "s", "met": on <= GOAL_S,
        "measured_as": (f"p50 of the request's mux_save stage over {len(busy)} warm streamed requests through "
                        f"H3Runtime.generate (`{record['recipe']}` at {record['steps']} DiT steps on "
                        f"{record['model']}: noise-like frames, libx264's slowest content); the encoder thread was "
                        f"busy {statistics.median(busy):.2f} s p50, under the decode"),
        "card": record["card"], "ratio_to_stock": round(off / on, 3),
        "stock": "the same requests with the stream off (H3_STREAM_MUX=0: encode after the decode), same call",
        "source": source}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--recipe", default="baseline")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--shape", default="5x544x960", help="SECONDSxHEIGHTxWIDTH")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--text-encoder", default="resident")
    parser.add_argument("--name", default=None, help="record name (default post_decode_<device>_<shape>)")
    parser.add_argument("--goal", type=Path, metavar="RECORD",
                        help="write the mux goal's entry from this record into h200_goals.json, and run nothing")
    args = parser.parse_args()
    if args.goal:
        from bench.lib.goals import write_goal_entry

        print(write_goal_entry(__file__, args.goal, goal_entry))
        return 0
    data = run(args)
    name = args.name or f"post_decode_{args.device.split(':')[0]}_{args.shape}"
    json_path, md_path = results.write(name, data, table(data))
    print(table(data))
    print(f"wrote {json_path} and {md_path}")
    return 1 if stream_changed_bytes(data) else 0


if __name__ == "__main__":
    raise SystemExit(main())
