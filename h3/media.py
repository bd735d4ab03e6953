"""Frame preparation, MP4 muxing and decoding (PyAV).

A clip is H.264 (yuv420p) video at 24 fps with 32 kHz stereo AAC audio, the format the seeds' servers return.
Encoding settings are fixed (the encoder's thread count too: one for small frames, eight frame threads without
macroblock-tree rate control for large ones, never the machine's core count) so that identical frames and PCM give a
byte-identical file on any machine with the same PyAV build.
"""

from __future__ import annotations

import logging
import os
from fractions import Fraction
from pathlib import Path

import numpy as np

from h3.atomic import tmp_path_for

logger = logging.getLogger(__name__)

# Determinism: single-threaded libx264 with its defaults gives byte-identical files for identical input at 128x128
# and 256x256; at 64x64 it was seen to produce different bitstreams for the same frames (3 of 15 trials), so the tiny
# preset generates 128x128 (h3.runtime.TINY_DEFAULT_SIZE), and at 960x544 too (macroblock-tree rate control:
# LARGE_X264_PARAMS below; bench/x264_determinism/results/x264_determinism.md), so large frames turn it off. The suite compares
# decoded frames, never codec bytes, across clips.
VIDEO_CODEC = "libx264"
VIDEO_CRF = 18  # visually lossless for H.264; codec noise stays well below acceleration drift (ghosting calibration)
VIDEO_PRESET = "medium"
"""libx264's preset below ``ENCODE_THREADS_MIN_PIXELS`` (the tiny preset's and the tests' clips: their bytes and the
codec noise the ghosting gate was calibrated on are what they always were)."""
VIDEO_PRESET_LARGE = "veryfast"
"""libx264's preset from ``ENCODE_THREADS_MIN_PIXELS`` up. On the H100 host (16 cores, bench/mux_speed) a 15 s
768x1344 clip muxed in 2.34 s against medium's 7.28 s at 8 threads, 0.09 dB lower PSNR against the source and a 5 %
smaller file; faster presets gained under 0.25 s (superfast's file 47 % larger)."""
CONVERT_THREADS_LARGE = 8
"""Threads converting RGB frames to yuv420p ahead of the encoder for large frames (swscale runs outside the GIL; each
frame's conversion is the same call as the serial one, so the bytes are the same). Serial, the conversion was about
5.6 ms a 768x1344 frame: 2 s of a 15 s clip, the mux's floor at any preset."""
ENCODE_THREADS_LARGE = 8
"""libx264 frame threads for frames of ``ENCODE_THREADS_MIN_PIXELS`` and more. A fixed count, not the machine's: with
macroblock-tree rate control off, x264 is deterministic for a given thread count, so a clip's bytes depend only on
its frames and PCM. One thread made
the MP4 mux of a 5 s 544x960 clip take 21-24 s on the H200 host (bench/full_size_ab/results/h200_ab_5s-544x960_s4.md),
longer than the 4-step request before it."""
ENCODE_THREADS_MIN_PIXELS = 320 * 320
"""Below this (the tiny preset's 128x128, the tests' clips) the encoder is single-threaded with x264's defaults: the
bytes of every small clip, and the codec noise the ghosting gate was calibrated on, are what they always were."""
LARGE_X264_PARAMS = "mbtree=0"
"""Large frames also turn off x264's macroblock-tree rate control: with it on, this PyAV build's libx264 gave a
different bitstream for the same frames from one encode to the next at 960x544 (2 of 6 encodes distinct with one
thread, 4 of 6 with eight: bench/x264_determinism/results/x264_determinism.md; at 1344x768 in one probe of two; not at 128x128 or
1024x544; with ``asm=0`` it was stable, so a SIMD path reads memory it did not write). Off, every size and thread
count measured was byte-stable (tests/test_media_encode.py); CRF 18 keeps it visually lossless."""
AUDIO_CODEC = "aac"
AUDIO_BITRATE = 192_000


class MediaError(ValueError):
    """A media file is missing, truncated, corrupt or not what it should be."""


def frames_to_uint8(video: "np.ndarray") -> np.ndarray:
    """(T, H, W, 3) float in [0, 1] -> uint8, rounding half to even like the device-side path."""
    return np.clip(np.rint(video * 255.0), 0, 255).astype(np.uint8)


def pcm_to_int16(audio: np.ndarray) -> np.ndarray:
    """(channels, N) float in [-1, 1] -> (N, channels) int16 interleaved."""
    audio = np.clip(audio, -1.0, 1.0)
    return np.ascontiguousarray(np.rint(audio * 32767.0).astype(np.int16).T)


def encode_threads(height: int, width: int) -> int:
    """libx264's thread count for ``height`` x ``width`` frames (see ``ENCODE_THREADS_LARGE``)."""
    return ENCODE_THREADS_LARGE if height * width >= ENCODE_THREADS_MIN_PIXELS else 1


def add_video_stream(container, height: int, width: int, fps: int = 24, crf: int = VIDEO_CRF,
                     preset: str | None = None, threads: int | None = None, convert_threads: int | None = None):
    """The H.264 stream of every MP4 h3 writes (``encode_mp4`` and h3.post_decode's streamed writer: one place for
    the settings, so both write the same bytes), and the RGB-to-YUV conversion threads for its frame size. None takes
    the frame size's setting (see ``encode_mp4``)."""
    vstream = container.add_stream(VIDEO_CODEC, rate=fps)
    vstream.width, vstream.height, vstream.pix_fmt = width, height, "yuv420p"
    large = encode_threads(height, width) > 1
    threads = encode_threads(height, width) if threads is None else int(threads)
    convert_threads = (CONVERT_THREADS_LARGE if large else 1) if convert_threads is None else int(convert_threads)
    preset = (VIDEO_PRESET_LARGE if large else VIDEO_PRESET) if preset is None else preset
    if threads < 1 or convert_threads < 1:
        raise MediaError(f"threads must be >= 1, got {threads} (x264) and {convert_threads} (conversion)")
    vstream.codec_context.thread_count = threads
    options = {"crf": str(crf), "preset": preset, "threads": str(threads)}
    if threads > 1:
        vstream.codec_context.thread_type = "FRAME"  # FFmpeg's default for libx264 is slice threads
        options["x264-params"] = LARGE_X264_PARAMS
    vstream.options = options
    return vstream, convert_threads


def add_audio_stream(container, sample_rate: int = 32000):
    """The AAC stereo stream of every MP4 h3 writes."""
    astream = container.add_stream(AUDIO_CODEC, rate=sample_rate)
    astream.codec_context.layout = "stereo"
    astream.bit_rate = AUDIO_BITRATE
    return astream


def encode_mp4(
    path: str | os.PathLike,
    frames: np.ndarray,
    pcm: np.ndarray | None,
    fps: int = 24,
    sample_rate: int = 32000,
    crf: int = VIDEO_CRF,
    preset: str | None = None,
    threads: int | None = None,
    convert_threads: int | None = None,
) -> None:
    """Write ``frames`` (uint8 (T, H, W, 3)) and ``pcm`` (int16 (N, channels)) to an MP4, atomically. ``preset``,
    ``threads`` (libx264's frame threads) and ``convert_threads`` (RGB-to-YUV conversion ahead of the encoder): None
    takes the frame size's setting (``VIDEO_PRESET`` / ``VIDEO_PRESET_LARGE``, ``encode_threads``,
    ``CONVERT_THREADS_LARGE``); others are for bench/mux_speed's sweep.

    The audio is AAC-encoded in a second thread while the video encodes (PyAV releases the GIL inside the codecs; on
    the 2-core CPU the AAC encoder's two-loop search was about half of a tiny clip's mux) and its packets are muxed
    after the video's, where the one-thread encode muxed them: the file is byte-identical either way
    (tests/test_media_encode.py)."""
    import threading

    import av

    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
        raise MediaError(f"frames must be uint8 (T, H, W, 3), got {frames.dtype} {frames.shape}")
    num_frames, height, width, _ = frames.shape
    if height % 2 or width % 2:
        raise MediaError(f"H.264 yuv420p needs even sizes, got {height}x{width}")
    path = Path(path)
    tmp = tmp_path_for(path)
    try:
        with av.open(str(tmp), "w", format="mp4") as container:
            vstream, convert_threads = add_video_stream(container, height, width, fps, crf, preset, threads,
                                                        convert_threads)
            audio_thread, audio_packets, audio_error = None, [], []
            if pcm is not None:
                pcm = np.ascontiguousarray(pcm, dtype=np.int16)
                if pcm.ndim != 2 or pcm.shape[1] != 2:
                    raise MediaError(f"pcm must be int16 (N, 2) stereo, got {pcm.shape}")
                astream = add_audio_stream(container, sample_rate)

                def encode_audio() -> None:
                    try:
                        aframe = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="stereo")
                        aframe.sample_rate = sample_rate
                        aframe.pts = 0
                        aframe.time_base = Fraction(1, sample_rate)
                        audio_packets.extend(astream.encode(aframe))
                        audio_packets.extend(astream.encode())
                    except BaseException as exc:  # re-raised in the calling thread after the join
                        audio_error.append(exc)

                audio_thread = threading.Thread(target=encode_audio, name="aac-encode", daemon=True)
                audio_thread.start()
            try:
                for index, frame in enumerate(_yuv_frames(frames, convert_threads)):
                    frame.pts = index
                    container.mux(vstream.encode(frame))
                container.mux(vstream.encode())
            finally:  # the audio encoder never outlives the container, even when the video's encode failed
                if audio_thread is not None:
                    audio_thread.join()
            if audio_error:
                raise audio_error[0]
            container.mux(audio_packets)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _to_yuv420p(rgb: np.ndarray):
    """One RGB frame as a yuv420p ``av.VideoFrame``. Converted here, not by PyAV inside encode(): its implicit
    conversion was seen to give different bytes for the same frames; an explicit reformat did not. (One
    VideoReformatter shared by the clip's frames, as decode_video uses, gave the same planes but MP4s that differed from
    one encode to the next at 128x160: not used here.)"""
    import av

    return av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")


def _yuv_frames(frames: np.ndarray, threads: int):
    """The clip's frames converted in order; with ``threads`` > 1 up to 2 x ``threads`` conversions run ahead of the
    consumer in a pool (bounded: a 15 s 768x1344 clip's yuv frames would hold 560 MB)."""
    if threads == 1:
        for rgb in frames:
            yield _to_yuv420p(rgb)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads, thread_name_prefix="yuv") as pool:
        pending: deque = deque()
        for rgb in frames:
            pending.append(pool.submit(_to_yuv420p, rgb))
            if len(pending) >= 2 * threads:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _open(path: str | os.PathLike):
    import av

    path = Path(path)
    if not path.exists():
        raise MediaError(f"{path}: no such file")
    try:
        return av.open(str(path))
    except av.error.FFmpegError as exc:
        raise MediaError(f"{path}: cannot open as media ({exc})") from exc


def decode_video(path: str | os.PathLike, threads: int = 1, convert_threads: int = 1) -> tuple[np.ndarray, float]:
    """All frames of the first video stream as uint8 (T, H, W, 3) RGB, and the stream's frame rate. ``threads``:
    decoder threads (0: FFmpeg's choice, with frame threading; the frames are the same). ``convert_threads`` > 1
    converts the decoded YUV frames to RGB in that many threads while decoding goes on (swscale, one call a frame,
    outside the GIL: the same bytes; at 768x1344 the conversion costs about as much as the decode)."""
    import threading

    import av
    from av.video.reformatter import VideoReformatter

    with _open(path) as container:
        if not container.streams.video:
            raise MediaError(f"{path}: no video stream")
        stream = container.streams.video[0]
        if threads != 1:
            stream.thread_type = "AUTO"
            stream.codec_context.thread_count = threads
        fps = float(stream.average_rate or stream.guessed_rate or 0)
        # A reformatter per converting thread, reused for every frame (frame.to_ndarray(format=) builds a new
        # swscale context each call: at 128x128 most of the conversion's time); the same bytes.
        local = threading.local()

        def to_rgb(frame) -> np.ndarray:
            reformatter = getattr(local, "reformatter", None)
            if reformatter is None:
                reformatter = local.reformatter = VideoReformatter()
            return reformatter.reformat(frame, format="rgb24").to_ndarray()

        try:
            if convert_threads > 1:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(convert_threads) as pool:
                    pending = [pool.submit(to_rgb, frame) for frame in container.decode(stream)]
                    frames = [f.result() for f in pending]
            else:
                frames = [to_rgb(frame) for frame in container.decode(stream)]
        except av.error.FFmpegError as exc:
            raise MediaError(f"{path}: video does not decode ({exc})") from exc
    if not frames:
        raise MediaError(f"{path}: the video stream has no frames")
    return np.stack(frames), fps


def decode_audio(path: str | os.PathLike) -> tuple[np.ndarray, int]:
    """All samples of the first audio stream as float32 (channels, N) in [-1, 1], and the sample rate."""
    import av

    with _open(path) as container:
        if not container.streams.audio:
            raise MediaError(f"{path}: no audio stream")
        stream = container.streams.audio[0]
        rate = int(stream.rate or stream.codec_context.sample_rate)
        chunks = []
        try:
            for frame in container.decode(stream):
                array = frame.to_ndarray()
                if frame.format.is_planar:
                    chunks.append(array.astype(np.float32, copy=False))
                else:
                    chunks.append(array.reshape(-1, frame.layout.nb_channels).T.astype(np.float32, copy=False))
        except av.error.FFmpegError as exc:
            raise MediaError(f"{path}: audio does not decode ({exc})") from exc
    if not chunks:
        raise MediaError(f"{path}: the audio stream has no samples")
    audio = np.concatenate(chunks, axis=1)
    if audio.dtype.kind == "i" or np.abs(audio).max(initial=0.0) > 1.5:
        audio = audio / 32768.0
    return audio.astype(np.float32), rate


def probe(path: str | os.PathLike) -> dict:
    """Stream facts of a clip, decoding every video frame so the frame count is exact."""
    frames, fps = decode_video(path)
    info = {
        "width": int(frames.shape[2]),
        "height": int(frames.shape[1]),
        "fps": fps,
        "num_frames": int(frames.shape[0]),
        "duration_s": frames.shape[0] / fps if fps else None,
        "has_audio": False,
        "audio_sample_rate": None,
        "audio_channels": None,
        "num_audio_samples": None,
    }
    with _open(path) as container:
        if container.streams.audio:
            audio, rate = decode_audio(path)
            info.update(
                has_audio=True, audio_sample_rate=rate, audio_channels=int(audio.shape[0]),
                num_audio_samples=int(audio.shape[1]),
            )
    return info
