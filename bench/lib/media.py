"""Encoding studies' shared parts: one-thread MP4 encoding and the textured test frames (issue 52: code that studies and tests share; each study's CLI is bench/<study>/).

Parts, in order: ``mux_threads`` (bench/mux_threads/), ``x264_determinism`` (bench/x264_determinism/).
"""

from __future__ import annotations


# ---- mux_threads (the CLI: bench/mux_threads/mux_threads.py) ----------------------------------------------------------


import argparse
import hashlib
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def encode_mp4_one_thread(path, frames: np.ndarray, pcm: np.ndarray, fps: int = 24, sample_rate: int = 32000) -> None:
    """The MP4 encode as h3.media did it before session 13: the same streams and options, the audio encoded and muxed
    after the video in the calling thread (the reference for byte identity; one libx264 thread, small frames)."""
    import av

    from h3.media import AUDIO_BITRATE, AUDIO_CODEC, VIDEO_CODEC, VIDEO_CRF, encode_threads

    if encode_threads(frames.shape[1], frames.shape[2]) != 1:
        raise ValueError("the reference covers the one-thread libx264 sizes only")
    with av.open(str(path), "w", format="mp4") as container:
        vstream = container.add_stream(VIDEO_CODEC, rate=fps)
        vstream.width, vstream.height, vstream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        vstream.codec_context.thread_count = 1
        vstream.options = {"crf": str(VIDEO_CRF), "preset": "medium", "threads": "1"}
        astream = container.add_stream(AUDIO_CODEC, rate=sample_rate)
        astream.codec_context.layout = "stereo"
        astream.bit_rate = AUDIO_BITRATE
        for index in range(frames.shape[0]):
            frame = av.VideoFrame.from_ndarray(frames[index], format="rgb24").reformat(format="yuv420p")
            frame.pts = index
            container.mux(vstream.encode(frame))
        container.mux(vstream.encode())
        aframe = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="stereo")
        aframe.sample_rate, aframe.pts, aframe.time_base = sample_rate, 0, Fraction(1, sample_rate)
        container.mux(astream.encode(aframe))
        container.mux(astream.encode())


def mux_threads_main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clip", default=None)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--name", default="mux_threads")
    args = parser.parse_args()

    from bench.lib import results as _results
    from h3.media import decode_audio, decode_video, encode_mp4, pcm_to_int16

    with tempfile.TemporaryDirectory() as tmp:
        clip = args.clip
        if clip is None:
            from h3.recipe import load_recipe
            from h3.runtime import GenerateRequest, H3Runtime

            clip = str(Path(tmp) / "source.mp4")
            H3Runtime.load("tiny", load_recipe("baseline"), "cpu").generate(GenerateRequest(
                prompt="a green triangle moves left to right while a high tone hums; it bounces twice; the background "
                       "is plain", seed=0), clip)
        frames, fps = decode_video(clip)
        audio, rate = decode_audio(clip)
        pcm = pcm_to_int16(audio)
        times: dict[str, list[float]] = {"threaded": [], "one_thread": []}
        digests: dict[str, set[str]] = {"threaded": set(), "one_thread": set()}
        for i in range(args.repeats):
            for name, encode in (("threaded", encode_mp4), ("one_thread", encode_mp4_one_thread)):
                out = Path(tmp) / f"{name}-{i}.mp4"
                t0 = time.perf_counter()
                encode(out, frames, pcm, fps=int(round(fps)), sample_rate=rate)
                times[name].append(time.perf_counter() - t0)
                digests[name].add(hashlib.sha256(out.read_bytes()).hexdigest())
    median = {k: float(np.median(v)) for k, v in times.items()}
    identical = len(digests["threaded"]) == 1 and digests["threaded"] == digests["one_thread"]
    md = (f"Clip: {args.clip or 'a 5 s 128x128 clip of the trained tiny (baseline, seed 0)'}, {frames.shape[0]} frames "
          f"{frames.shape[1]}x{frames.shape[2]}, {pcm.shape[0]} samples at {rate} Hz stereo; {args.repeats} encodes "
          "each, interleaved.\n\n| encode | median (s) | all (s) |\n|---|---|---|\n")
    for name in times:
        md += f"| {name} | {median[name]:.3f} | {', '.join(f'{t:.3f}' for t in times[name])} |\n"
    md += (f"\nThreaded / one-thread median: {median['threaded'] / median['one_thread']:.2f}. Every file byte-identical"
           f" across both encoders: {identical}.\n")
    payload = {"clip": args.clip, "frames": list(frames.shape), "samples": int(pcm.shape[0]), "rate": rate,
               "times_s": times, "median_s": median, "byte_identical": identical}
    paths = _results.write(args.name, payload, md)
    print(md)
    print("wrote", *paths)
    if not identical:
        raise SystemExit("the two encoders wrote different bytes")


# ---- x264_determinism (the CLI: bench/x264_determinism/x264_determinism.py) ------------------------------------------------


import argparse
import hashlib
import io
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

SIZES = ((128, 128), (544, 960), (768, 1344))
SETTINGS = {
    "1 thread, defaults": (1, None),
    "8 frame threads, defaults": (8, None),
    "8 frame threads, mbtree=0": (8, "mbtree=0"),
}


def textured_frames(num: int, height: int, width: int) -> np.ndarray:
    """A textured pattern drifting one pixel a frame (something for motion estimation to do), uint8 (T, H, W, 3)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    out = []
    for t in range(num):
        r = 127.5 + 100 * np.sin((x + t) / 7.0) * np.cos(y / 11.0)
        g = 127.5 + 90 * np.cos((x - 2 * t) / 13.0 + y / 17.0)
        b = 127.5 + 80 * np.sin((x + y + 3 * t) / 23.0)
        out.append(np.stack([r, g, b], axis=-1))
    return np.clip(np.rint(np.stack(out)), 0, 255).astype(np.uint8)


def encode(yuv: list[np.ndarray], height: int, width: int, threads: int, params: str | None) -> bytes:
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=24)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.thread_count = threads
        if threads > 1:
            stream.codec_context.thread_type = "FRAME"
        options = {"crf": "18", "preset": "medium", "threads": str(threads)}
        if params:
            options["x264-params"] = params
        stream.options = options
        for index, plane in enumerate(yuv):
            frame = av.VideoFrame.from_ndarray(plane, format="yuv420p")
            frame.pts = index
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return buf.getvalue()


def x264_determinism_main() -> None:
    import tempfile

    import av

    from bench.lib import results as _results
    from h3.media import encode_mp4, encode_threads

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--encodes", type=int, default=6)
    parser.add_argument("--frames", type=int, default=24)
    args = parser.parse_args()
    rows = []
    for height, width in SIZES:
        frames = textured_frames(args.frames, height, width)
        yuv = [av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format="yuv420p").to_ndarray() for f in frames]
        for name, (threads, params) in SETTINGS.items():
            digests = {hashlib.sha256(encode(yuv, height, width, threads, params)).hexdigest()
                       for _ in range(args.encodes)}
            rows.append({"size": f"{width}x{height}", "setting": name, "encodes": args.encodes,
                         "distinct": len(digests)})
        with tempfile.TemporaryDirectory() as tmp:
            digests = set()
            for i in range(args.encodes):
                path = Path(tmp) / f"{i}.mp4"
                encode_mp4(path, frames, None)
                digests.add(hashlib.sha256(path.read_bytes()).hexdigest())
        rows.append({"size": f"{width}x{height}", "setting": f"h3.media.encode_mp4 ({encode_threads(height, width)} "
                     "thread(s))", "encodes": args.encodes, "distinct": len(digests)})
        print(rows[-4:])
    table = ["| size | setting | encodes | distinct bitstreams |", "|---|---|---|---|"]
    table += [f"| {r['size']} | {r['setting']} | {r['encodes']} | {r['distinct']} |" for r in rows]
    note = (f"\n\n{args.frames} frames of a drifting texture, CRF 18, preset medium. 1 distinct = byte-stable. "
            "h3.media.encode_mp4 converts RGB to yuv420p per frame itself (the other rows convert once up front).")
    print("wrote", *_results.write("x264_determinism", {"rows": rows, "frames": args.frames}, "\n".join(table) + note))
