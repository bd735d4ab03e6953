"""A request's frames from the video VAE's decode to the MP4: uint8 frame preparation on the device, and the MP4
encode streamed chunk by chunk while the decoder still runs (issue 54).

Where the time went (measured; bench/post_decode): on the H100 host the 5 s 544x960 request's 4.1 s between the
generation side and the file was the MP4 encode itself (``mux_save`` 4.09 s; ``frame_prep_d2h`` 0.02 s), on the
noise-like frames of random weights, which cost libx264 about twice what smooth frames do. So the lever is to take
the encode off the request's critical path: diffusers' ``AutoencoderKLMiniMaxH3._decode`` decodes the latent video in
temporal chunks (17 pixel frames each, cross-faded over 5 frames with the next), and a chunk's frames are final as soon
as the cross-fade with the previous chunk is done. :func:`streaming_decode` runs that loop (:func:`_decode_mirror`, the
same calls in the same order; installed only while diffusers' ``_decode`` is the source it mirrors) and hands each
final chunk to :class:`FrameStream`, which applies the decode step's pixel denormalization and the runtime's uint8
rounding to the chunk on the device, copies it into the clip's host buffer and queues it to :class:`Mp4StreamWriter`,
whose thread encodes it while the next chunk decodes. Every operation on a frame is elementwise, so a chunk's uint8
frames are the whole video's, bit for bit; the writer makes the container calls of :func:`h3.media.encode_mp4` in the
same order, so the file is the same bytes (tests/test_runtime_post_decode.py), and the runtime checks the streamed
frames against the pipeline's own output at every chunk boundary before it keeps the file. While it streams, the
decode step runs its audio block first (:func:`audio_decoded_first`), so that the AAC encode (1.3 s for 5 s of
noise-like PCM on the 2-core VM) also overlaps the video's decode instead of forming the tail.

The runtime streams on a GPU only (``H3_STREAM_MUX``, h3.runtime): on the 2-core CPU the decode is CPU work, and the
encoder's threads slowed it by about what they took off the tail (bench/post_decode).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import os
import queue
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from h3.atomic import tmp_path_for

logger = logging.getLogger(__name__)

MIRRORED_DECODE_SHA256 = "5998c354e65ab25da294df3ebe431be76de890bf11edff07ea5ed64035a30c64"
"""sha256 of ``inspect.getsource(AutoencoderKLMiniMaxH3._decode)`` in diffusers 0.42.1, the loop :func:`_decode_mirror`
repeats. Another source (an upgraded diffusers) turns streaming off: the request takes the whole-video path."""


MAX_PAD_FRAMES = 32
"""More frames past the clip's end than a decode's trailing pad (under ``tokens_chunk_size`` x temporal ratio = 20 in
the released geometry) means the decode was not the request's one: the stream gives up, the whole-video path runs."""


def frames_uint8(video: torch.Tensor) -> torch.Tensor:
    """(T, 3, H, W) float in [0, 1] -> (T, H, W, 3) uint8 on the same device, rounding half to even (``torch.round``,
    as ``h3.media.frames_to_uint8``'s ``np.rint``): the runtime's frame preparation, whole video or one chunk."""
    frames = (video.float() * 255.0).round_().clamp_(0, 255).to(torch.uint8)
    return frames.permute(0, 2, 3, 1).contiguous()


def pcm_int16(audio: torch.Tensor) -> torch.Tensor:
    """(2, N) float -> (N, 2) int16 interleaved on the same device (``h3.media.pcm_to_int16``'s arithmetic)."""
    return (audio.float().clamp(-1, 1) * 32767.0).round_().to(torch.int16).t().contiguous()


def decode_source_sha256(vae: Any) -> str:
    return hashlib.sha256(inspect.getsource(type(vae)._decode).encode()).hexdigest()


def stream_refusal(vae: Any) -> str | None:
    """Why the decode of ``vae`` cannot stream (None: it can)."""
    if "_decode" in vars(vae):
        return "vae._decode is replaced on the instance (the parallel lever's tile decode)"
    if getattr(vae, "use_slicing", False):
        return "the VAE decodes batch slices"
    try:
        digest = decode_source_sha256(vae)
    except (OSError, TypeError) as exc:
        return f"the source of {type(vae).__name__}._decode is not readable ({exc})"
    if digest != MIRRORED_DECODE_SHA256:
        return f"{type(vae).__name__}._decode is not the source this mirror repeats (diffusers changed)"
    return None


def _decode_mirror(vae: Any, z: torch.Tensor, emit: Callable[[torch.Tensor], None]) -> torch.Tensor:
    """diffusers 0.42.1's ``AutoencoderKLMiniMaxH3._decode`` (the same calls, in the same order, on the same tensors),
    calling ``emit`` with each run of frames (1, C, t, H, W) as soon as no later chunk changes it. The runs are the
    output's frames in order, followed by the ``pad_frames`` that the decode cuts off at the end (a consumer that
    knows the clip's length drops them)."""
    tokens_chunk_size = vae.tokens_chunk_size
    token_drop = vae.config.token_drop
    temporal_ratio = vae.temporal_compression_ratio
    chunk_num_frames = tokens_chunk_size * temporal_ratio

    num_tokens = z.shape[2] + token_drop
    pad_tokens = (-num_tokens) % tokens_chunk_size
    num_chunks = (num_tokens + pad_tokens) // tokens_chunk_size - int(token_drop > 0)
    if pad_tokens > 0:
        z = torch.cat([z, z[:, :, -1:].repeat(1, 1, pad_tokens, 1, 1)], dim=2)

    decoded_chunks = []
    overlap = None
    for i in range(num_chunks):
        start = i * tokens_chunk_size
        clip = vae._decode_clip(z[:, :, start : start + tokens_chunk_size + vae.token_overlap])
        for j in range(int(token_drop > 0) + 1):
            frame_start = j * chunk_num_frames
            chunk = clip[:, :, frame_start : frame_start + chunk_num_frames]
            chunk = chunk[:, :, vae.frame_pre_padding :]
            if j == 0:
                if overlap is not None:
                    chunk = vae._blend(overlap, chunk, vae.frame_overlap, dim=-3)
                decoded_chunks.append(chunk)
                emit(chunk)  # final: only the next chunk's j == 0 piece reads the overlap, never this one
            else:
                overlap = chunk
    if overlap is not None:
        decoded_chunks.append(overlap)
        emit(overlap)

    dec = torch.cat(decoded_chunks, dim=2)

    if pad_tokens > 0:
        intra_tail = vae.config.clip_length % temporal_ratio
        num_tokens_before_pad = z.shape[2] - pad_tokens
        pad_frames = sum(
            intra_tail if intra_tail and (num_tokens_before_pad + k) % tokens_chunk_size == 0 else temporal_ratio
            for k in range(pad_tokens)
        )
        dec = dec[:, :, :-pad_frames]
    return dec


@contextlib.contextmanager
def streaming_decode(vae: Any, emit: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """While open, ``vae._decode`` is :func:`_decode_mirror` calling ``emit`` (an instance attribute, removed on
    exit). The caller checks :func:`stream_refusal` first."""
    vae._decode = lambda z: _decode_mirror(vae, z, emit)
    try:
        yield
    finally:
        del vae._decode


@contextlib.contextmanager
def audio_decoded_first(pipe: Any, on_audio: Callable[[torch.Tensor], None]) -> Iterator[bool]:
    """While open, the pipeline's decode step runs its audio block before its video block (diffusers'
    ``MiniMaxH3DecodeStep``: the two read separate latents and write separate outputs, so the values are the same in
    either order), and ``on_audio`` receives the audio VAE's output ((2, 1, N), the stereo channels as a batch) as it
    returns: the AAC encode then runs while the video decodes instead of after it. Yields whether the step had the
    two blocks it expects (if not, nothing is changed and ``on_audio`` is never called)."""
    from h3.anatomy import wrap_method

    decode = getattr(getattr(pipe, "_blocks", None), "sub_blocks", {}).get("decode")
    blocks = getattr(decode, "sub_blocks", None)
    if blocks is None or list(blocks) != ["video", "audio"]:
        yield False
        return

    def make(original: Callable) -> Callable:
        def decode_audio(*args, **kwargs):
            out = original(*args, **kwargs)
            on_audio(out[0] if isinstance(out, tuple) else out.sample)
            return out

        return decode_audio

    decode.sub_blocks = type(blocks)([("audio", blocks["audio"]), ("video", blocks["video"])])
    handle = wrap_method(pipe.audio_vae, "decode", make)
    try:
        yield True
    finally:
        handle.remove()
        decode.sub_blocks = blocks


class Mp4StreamWriter:
    """:func:`h3.media.encode_mp4`'s file, written from frames that arrive in chunks: :meth:`put` queues a chunk of
    uint8 (t, H, W, 3) frames and returns at once; a thread converts and encodes them in order and muxes the packets;
    :meth:`finish` encodes the PCM beside the video's tail, muxes the audio after the video and moves the file into
    place. The container sees encode_mp4's calls in encode_mp4's order (streams added video then audio with the same
    settings, video packets, the video flush, the audio packets), so the bytes are the same.

    The frames handed to :meth:`put` must stay unchanged until :meth:`finish` returns (the thread reads them)."""

    def __init__(self, path: str | os.PathLike, num_frames: int, height: int, width: int, fps: int = 24,
                 sample_rate: int = 32000):
        import av

        from h3 import media

        if height % 2 or width % 2:
            raise media.MediaError(f"H.264 yuv420p needs even sizes, got {height}x{width}")
        self.path, self.shape, self.sample_rate = Path(path), (int(num_frames), int(height), int(width)), sample_rate
        self.tmp = tmp_path_for(self.path)
        self.container = av.open(str(self.tmp), "w", format="mp4")
        try:
            vstream, self.convert_threads = media.add_video_stream(self.container, height, width, fps)
            astream = media.add_audio_stream(self.container, sample_rate)
            # The header now, from this thread: PyAV's start_encoding opens every stream's codec, which the first
            # video mux would otherwise do on the video thread while the audio thread may be encoding.
            self.container.start_encoding()
        except BaseException:
            self.abort()
            raise
        self.vstream, self.astream = vstream, astream
        self.queued = 0
        self.encode_s = 0.0
        """Seconds the video thread spent converting and encoding (waits for the next chunk excluded)."""
        self._chunks: queue.SimpleQueue = queue.SimpleQueue()
        self._error: list[BaseException] = []
        self._closed = False
        self._audio: threading.Thread | None = None
        self._audio_packets: list = []
        self.pcm: np.ndarray | None = None
        self._thread = threading.Thread(target=self._encode_video, name="mp4-stream", daemon=True)
        self._thread.start()

    def put(self, frames: np.ndarray) -> None:
        if self._closed:
            raise RuntimeError("the stream is finished")
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[1:] != (*self.shape[1:], 3):
            raise ValueError(f"chunk must be uint8 (t, {self.shape[1]}, {self.shape[2]}, 3), got {frames.dtype} "
                             f"{frames.shape}")
        if self.queued + len(frames) > self.shape[0]:
            raise ValueError(f"{self.queued + len(frames)} frames queued for a {self.shape[0]}-frame clip")
        self.queued += len(frames)
        self._chunks.put(frames)

    def _frames(self) -> Iterator[np.ndarray]:
        while True:
            wait = time.perf_counter()
            chunk = self._chunks.get()
            self.encode_s -= time.perf_counter() - wait
            if chunk is None:
                return
            yield from chunk

    def _encode_video(self) -> None:
        from h3.media import _yuv_frames

        start = time.perf_counter()
        try:
            for index, frame in enumerate(_yuv_frames(self._frames(), self.convert_threads)):
                frame.pts = index
                self.container.mux(self.vstream.encode(frame))
            self.container.mux(self.vstream.encode())
        except BaseException as exc:  # re-raised by finish()
            self._error.append(exc)
            while self._chunks.get() is not None:  # drain, so that finish() and abort() never wait on it
                pass
        finally:
            self.encode_s += time.perf_counter() - start

    def _end_video(self) -> None:
        if not self._closed:
            self._closed = True
            self._chunks.put(None)
        self._thread.join()

    def start_audio(self, pcm: np.ndarray) -> None:
        """Start encoding ``pcm`` (int16 (N, 2)) in its own thread now, while the video goes on (the runtime decodes
        the audio before the video when it streams)."""
        import av

        from h3.media import MediaError

        if self._audio is not None:
            raise RuntimeError("the audio is already encoding")
        pcm = np.ascontiguousarray(pcm, dtype=np.int16)
        if pcm.ndim != 2 or pcm.shape[1] != 2:
            raise MediaError(f"pcm must be int16 (N, 2) stereo, got {pcm.shape}")
        self.pcm = pcm

        def encode_audio() -> None:
            try:
                aframe = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="stereo")
                aframe.sample_rate = self.sample_rate
                aframe.pts = 0
                aframe.time_base = Fraction(1, self.sample_rate)
                self._audio_packets.extend(self.astream.encode(aframe))
                self._audio_packets.extend(self.astream.encode())
            except BaseException as exc:  # re-raised by finish()
                self._error.append(exc)

        self._audio = threading.Thread(target=encode_audio, name="aac-encode", daemon=True)
        self._audio.start()

    def finish(self, pcm: np.ndarray) -> None:
        """Encode ``pcm`` (int16 (N, 2)) beside the video's tail unless :meth:`start_audio` has it already (then it
        must be the same samples), mux it after the video and move the file into place; on any error nothing is left
        at the path."""
        from h3.media import MediaError

        try:
            if self.queued != self.shape[0]:
                raise MediaError(f"{self.queued} of {self.shape[0]} frames were streamed")
            if self._audio is None:
                self.start_audio(pcm)
            elif not np.array_equal(np.asarray(pcm), self.pcm):
                raise MediaError("the PCM differs from the one encoding since start_audio")
            try:
                self._end_video()
            finally:
                self._audio.join()
            if self._error:
                raise self._error[0]
            self.container.mux(self._audio_packets)
            self.container.close()
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Stop the threads, close the container and remove the temporary file (idempotent)."""
        thread = getattr(self, "_thread", None)
        if thread is not None:
            self._end_video()
        audio = getattr(self, "_audio", None)
        if audio is not None:
            audio.join()
        with contextlib.suppress(Exception):
            self.container.close()
        self.tmp.unlink(missing_ok=True)


class FrameStream:
    """One request's frames as the decoder finishes them: :meth:`on_chunk` (the decode mirror's ``emit``) applies the
    decode step's arithmetic (diffusers' ``MiniMaxH3VideoDecodeStep``: ``(video.float() * pixel_std + pixel_mean)
    .clamp(0, 1)``) and :func:`frames_uint8` to the chunk on the device, copies it into :attr:`frames` (the clip's host
    buffer), queues it to the writer and to a hashing thread (the record's ``frames_sha256``, computed while the decode
    goes on). :meth:`check` then compares the frames around every chunk boundary with the pipeline's own output."""

    def __init__(self, writer: Mp4StreamWriter, num_frames: int, height: int, width: int,
                 pixel_mean: tuple[float, ...], pixel_std: tuple[float, ...],
                 timed: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):
        from concurrent.futures import ThreadPoolExecutor

        self.writer = writer
        self.frames = np.empty((num_frames, height, width, 3), np.uint8)
        self.pixel_mean, self.pixel_std = pixel_mean, pixel_std
        self.filled = 0
        self.bounds: list[int] = []
        """Index of each chunk's first frame."""
        self.dropped = 0
        """Frames decoded past the clip's length (the decode's trailing pad, which it cuts off)."""
        self.problem: str | None = None
        self._timed = timed
        self._digest = hashlib.sha256()
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="frames-sha256")  # one worker: chunks in order
        self._hashed: list = []

    def on_chunk(self, chunk: torch.Tensor) -> None:
        if self.problem is not None:
            return
        if (chunk.shape[0], chunk.shape[1], *chunk.shape[3:]) != (1, 3, *self.frames.shape[1:3]):
            self.problem = f"decoded chunk {tuple(chunk.shape)} does not fit the {self.frames.shape} clip"
            return
        take = min(chunk.shape[2], len(self.frames) - self.filled)
        self.dropped += chunk.shape[2] - take
        if self.dropped > MAX_PAD_FRAMES:
            self.problem = f"the decode gave {self.dropped} frames more than the clip's {len(self.frames)}"
            return
        if take == 0:
            return
        with self._timed():
            mean = torch.tensor(self.pixel_mean, device=chunk.device).view(1, -1, 1, 1, 1)
            std = torch.tensor(self.pixel_std, device=chunk.device).view(1, -1, 1, 1, 1)
            video = (chunk[:, :, :take].float() * std + mean).clamp(0, 1)
            frames = frames_uint8(video[0].permute(1, 0, 2, 3))
            end = self.filled + take
            host = self.frames[self.filled:end]
            torch.from_numpy(host).copy_(frames)  # device to host, synchronous
            self.bounds.append(self.filled)
            self.writer.put(host)
            self._hashed.append(self._hasher.submit(self._digest.update, host))
            self.filled = end

    def on_audio(self, audio: torch.Tensor) -> None:
        """The audio VAE's output ((2, 1, N)) as :func:`audio_decoded_first` hands it over: its PCM (the decode step's
        ``audio.float().permute(1, 0, 2)``, then :func:`pcm_int16`) starts encoding now; the runtime checks it against
        the pipeline's own audio at the end."""
        try:
            with self._timed():
                pcm = pcm_int16(audio.float().permute(1, 0, 2)[0]).cpu().numpy()
            self.writer.start_audio(pcm)
        except Exception as exc:  # the request goes on; the whole-video path writes the clip (the record says why)
            self.problem = f"the early audio encode did not start: {type(exc).__name__}: {exc}"

    def frames_sha256(self) -> str:
        """sha256 of :attr:`frames`' bytes (as ``hashlib.sha256(frames.tobytes())``), once every chunk is hashed."""
        for future in self._hashed:
            future.result()
        self._hasher.shutdown()
        return self._digest.hexdigest()

    def close(self) -> None:
        self._hasher.shutdown(wait=True)

    def check_indices(self) -> list[int]:
        """The frames :meth:`check` compares: the first and last of every chunk."""
        ends = [b - 1 for b in self.bounds[1:]] + [self.filled - 1]
        return sorted({i for pair in zip(self.bounds, ends) for i in pair if 0 <= i < len(self.frames)})

    def check(self, video: torch.Tensor) -> str | None:
        """Compare the streamed frames with ``video`` ((T, 3, H, W) float, the pipeline's output) at every chunk's
        first and last frame; the problem found, or None."""
        if self.problem is not None:
            return self.problem
        if self.filled != len(self.frames) or video.shape[0] != len(self.frames):
            return f"{self.filled} frames streamed, the pipeline returned {video.shape[0]}"
        idx = self.check_indices()
        reference = frames_uint8(video[torch.tensor(idx, device=video.device)]).cpu().numpy()
        bad = [i for i, ref in zip(idx, reference) if not np.array_equal(ref, self.frames[i])]
        if bad:
            return f"streamed frames {bad[:5]} differ from the pipeline's output"
        return None
