"""The mux with the AAC track encoded beside the video (h3.media.encode_mp4) against the one-thread encode it
replaced, side by side on one machine: same frames and audio, the two encodes interleaved, each file's bytes compared.

    python bench/mux_threads.py [--clip MP4] [--repeats 10] [--name mux_threads]

The clip (default: a 5 s 128x128 clip of the trained tiny, made here through the runtime) is decoded back to frames
and PCM, which both encoders then write. Writes bench/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clip", default=None)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--name", default="mux_threads")
    args = parser.parse_args()

    from bench import _results
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


if __name__ == "__main__":
    main()
