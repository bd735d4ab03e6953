"""The H3 runtime: diffusers' MiniMax-H3 modular pipeline, configured by a recipe, with stage anatomy and records.

``H3Runtime.load("tiny" | "tiny-trained" | "tiny-random" | PATH, recipe)`` gives a runtime;
``runtime.generate(request, out)`` writes one clip (MP4 with 24 fps video and 32 kHz stereo audio) and its
:class:`~h3.record.ClipRecord` next to it.

``tiny`` (the default; ``tiny-trained`` is the same preset) is the trained preset (h3.tiny_trained): a checkpoint in the
Hugging Face layout of ``MiniMaxAI/MiniMax-H3`` shipped in the package (made by ``python -m h3.train``), which makes the
procedural world's shapes and sounds (issue 17). ``tiny-random`` is the random-weight preset (h3.tiny), built once from
its seed and saved in the same layout into a cache folder: faster, with noise-like clips, kept for the tests that need
its speed or its properties. Both load exactly as a downloaded checkpoint does, with
``ModularPipeline.from_pretrained``. Records name the preset that ran, never the alias: a runtime loaded as ``tiny``
says ``tiny-trained`` (:func:`canonical_model`), so ``tiny`` in a record means the random preset of older runs. The
random presets (``h3-random``, ``h3-random-small``: h3.random_model) are the real pipeline at the released or the tiny
configs with seeded weights drawn on the device.
"""


from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from h3 import provenance
from h3.anatomy import StageHooks, synchronize
from h3.atomic import atomic_write_json, sha256_file
from h3.checkpoint import (CHECKPOINT_LAYOUT, CheckpointError, check_checkpoint_dir, checkpoint_identity,
                           ref_partition_is_transformer, save_components, torch_dtype)
from h3.conditioning import pipeline_inputs
from h3.levers import lever_telemetry
from h3.media import ENCODE_THREADS_MIN_PIXELS, encode_mp4
from h3.models import (MODEL_ALIASES, SMALL_MODELS, TINY_MODELS, canonical_model, check_model, model_default_size,
                       model_identity, tiny_checkpoint_dir, tiny_identity, trained_tiny_dir)
from h3.record import ClipRecord, Executed, RequestSpec, ResolvedShape, StageAnatomy, Timings
from h3.post_decode import (FrameStream, Mp4StreamWriter, audio_decoded_first, frames_uint8, pcm_int16,
                             stream_refusal, streaming_decode)
from h3.recipe import Recipe
from h3.request import (FPS, FULL_DEFAULT_SIZE, MAX_FRAMES, MAX_SECONDS, MIN_SECONDS, TINY_DEFAULT_SIZE, DeviceError,
                        GenerateRequest, RequestError, check_device, default_device, resolve_request, snap_num_frames)
from h3.shared_model import SharedModel, SharedModelError, component_settings, shared_recipes_problems
from h3.trajectory import TrajectoryRecorder, trajectory_path

__all__ = [  # the runtime's API, where callers have always imported it from (the parts live in the modules above)
    "CHECKPOINT_LAYOUT", "FPS", "FULL_DEFAULT_SIZE", "MAX_FRAMES", "MAX_SECONDS", "MIN_SECONDS", "MODEL_ALIASES",
    "SMALL_MODELS", "TINY_DEFAULT_SIZE", "TINY_MODELS", "CheckpointError", "DeviceError", "GenerateRequest",
    "H3Runtime", "RequestError", "SharedModelError", "canonical_model", "check_checkpoint_dir", "check_device",
    "check_model", "checkpoint_identity", "default_device", "model_default_size", "model_identity",
    "resolve_request", "save_components", "shared_recipes_problems", "snap_num_frames", "tiny_checkpoint_dir",
    "tiny_identity", "trained_tiny_dir",
]

logger = logging.getLogger(__name__)


def _quiet_progress_bars(blocks: Any) -> None:
    """The denoise loop's tqdm bar would interleave with the suite's own progress display."""
    if hasattr(blocks, "set_progress_bar_config"):
        blocks.set_progress_bar_config(disable=True)
    for child in getattr(blocks, "sub_blocks", {}).values():
        _quiet_progress_bars(child)


def _stream_mux_setting(value: str) -> bool | None:
    value = value.strip().lower()
    if value not in ("auto", "0", "1"):
        raise ValueError(f"H3_STREAM_MUX must be auto, 0 or 1, got {value!r}")
    return None if value == "auto" else value == "1"


class H3Runtime(SharedModel):
    """One loaded model configured by one recipe; with ``shared``, a model that several recipes take turns on.

    A shared runtime (``H3Runtime.load(..., shared=True)``) holds one DiT, one text encoder and the two VAEs, and
    :meth:`switch_recipe` removes one recipe's levers and applies the next one's between requests: the levers run in
    their reversible form (the float weights quantization and the AdaLN precompute replace are kept; weights a fused
    LoRA changed are read again from the model's :mod:`weight source <h3.weights>`), and levers two recipes configure
    alike at the same step count stay applied across the switch (two turbo recipes keep their fused LoRA). A recipe
    whose dtype differs from the loaded model's, or with a lever that cannot be removed (group offloading), is refused
    with :class:`SharedModelError`.
    """

    def __init__(self, pipe: Any, recipe: Recipe, model: str, model_sha256: str, device: str, default_size, *,
                 weights: str | None = None, weight_source: Any = None, shared: bool = False,
                 text_encoder: dict[str, Any] | None = None, transformer_dtype: str | None = None):
        self.pipe = pipe
        self.recipe = recipe
        self.model = model
        self.model_sha256 = model_sha256
        self.device = torch.device(device)
        self.default_size = default_size
        self.weights = weights
        """``"random"`` or ``"checkpoint"`` (every record says it under ``weights``)."""
        self.weight_source = weight_source
        self.shared = shared
        self.text_encoder_info = dict(text_encoder or {"residency": "resident"})
        self.loaded_dtype = recipe.dtype
        self.switches: list[dict[str, Any]] = []
        self.final = False
        """Whether the active recipe was applied for good (:meth:`switch_recipe` with ``final``)."""
        self.levers_applied = True
        self._loaded_settings = component_settings(pipe)
        if shared:
            self.check_shareable(recipe)
        self.transformer_dtype = transformer_dtype
        """The caller's override of the recipe's dtype for the transformer (the parallel check's floor twin); each
        record names it (``extra["transformer_dtype"]``) so that configured-versus-executed checks against it."""
        self.ref_partition: str | None = None
        """Why ref2va may run on the loaded DiT, or None: ref2va is refused (its partition is not loaded)."""
        t_levers = time.perf_counter()
        self._apply_recipe()
        self.load_timings: dict[str, float] = {"levers_s": time.perf_counter() - t_levers}
        """Seconds of the one-time load, by part (the loader adds its own parts): every record carries them under
        ``extra["model_load_s"]``, so a run shows where its first request's extra minutes went."""
        _quiet_progress_bars(pipe._blocks)  # `pipe.blocks` is a deep copy
        self.hooks = StageHooks(pipe)
        self.stream_mux: bool | None = _stream_mux_setting(os.environ.get("H3_STREAM_MUX", "auto"))
        """Encode the MP4 while the video decodes (h3.post_decode): None (``H3_STREAM_MUX=auto``, the default) on a
        GPU for frames of ``ENCODE_THREADS_MIN_PIXELS`` and more, where the encode takes seconds and the CPU's cores
        are idle during the decode; True or False always. The clip's bytes are the same either way; each record says
        what ran (``extra["post_decode"]``)."""

    # -- loading -----------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, model: str, recipe: Recipe, device: str | None = None, *, shared: bool = False,
             text_encoder: str = "resident", transformer_dtype: str | None = None) -> "H3Runtime":
        """``model``: ``tiny`` or ``tiny-trained`` (the trained tiny preset), ``tiny-random`` (the random-weight one),
        a random preset (``h3-random``, ``h3-random-small``: :mod:`h3.random_model`) or a checkpoint directory.
        ``shared``: a model several recipes take turns on (:meth:`switch_recipe`). ``text_encoder``: ``resident`` or
        ``offload`` (streamed from host memory, :mod:`h3.residency`). ``transformer_dtype``: run the transformer in
        this dtype instead of the recipe's (the parallel check's higher-precision reference,
        h3eval/parallel_check.py); everything else keeps the recipe's."""
        from h3.random_model import is_random_preset

        device = check_device(device)
        kwargs = dict(shared=shared, text_encoder=text_encoder, transformer_dtype=transformer_dtype)
        model = canonical_model(model)
        if model == "tiny-random":
            return cls.tiny(recipe, device, **kwargs)
        if model == "tiny-trained":
            return cls.tiny_trained(recipe, device, **kwargs)
        if is_random_preset(model):
            return cls.random(model, recipe, device, **kwargs)
        return cls.from_pretrained(model, recipe, device, **kwargs)

    @classmethod
    def tiny(cls, recipe: Recipe, device: str | None = None, **kwargs: Any) -> "H3Runtime":
        """The random-weight tiny preset (h3.tiny, ``tiny-random``), built from its seed into the cache folder."""
        from h3 import tiny

        runtime = cls.from_pretrained(tiny_checkpoint_dir(), recipe, device, _default_size=TINY_DEFAULT_SIZE,
                                      **kwargs)
        runtime.model = "tiny-random"
        runtime.model_sha256 = tiny.tiny_identity()
        runtime.weights = tiny.WEIGHTS
        # The random preset has one DiT, seeded: it stands in for both partitions, and encodes a reference image at
        # the tiny canvas's edge rather than the released 2048 (a 2048-pixel VAE encode would dominate a CPU test).
        runtime.share_ref_partition("the random tiny preset has one DiT")
        runtime.pipe.register_to_config(reference_image_short_edge=TINY_DEFAULT_SIZE[0])
        return runtime

    @classmethod
    def random(cls, model: str, recipe: Recipe, device: str | None = None, *, shared: bool = False,
               text_encoder: str = "resident", transformer_dtype: str | None = None) -> "H3Runtime":
        """A random preset (:mod:`h3.random_model`): the real pipeline at the preset's configs, weights drawn on the
        device in the recipe's dtype (nothing read from disk); ``transformer_dtype`` (see :meth:`load`) converts the
        transformer's drawn weights afterwards."""
        from h3 import random_model
        from h3.levers import keeps_on_cpu, preflight
        from h3.residency import STREAMED_RESIDENCY, TEXT_ENCODER_RESIDENCY, place_text_encoder

        if text_encoder not in TEXT_ENCODER_RESIDENCY:  # before any weight is drawn
            raise ValueError(f"text encoder residency must be one of {', '.join(TEXT_ENCODER_RESIDENCY)}, "
                             f"got {text_encoder!r}")
        configs = random_model.preset(model)
        device = check_device(device)
        preflight(recipe, device)
        dtype = torch_dtype(recipe.dtype)
        # What lives in host memory is drawn on the device one tensor at a time and copied down (the same values as
        # a build on the device): the 62 GiB text encoder streamed, or a component the offload lever streams, never
        # passes through the device whole, so a full-size request fits one 80 GB card.
        on_host = tuple(name for name in ("text_encoder", "transformer", "vae", "audio_vae")
                        if keeps_on_cpu(recipe, name)
                        or (name == "text_encoder" and text_encoder in STREAMED_RESIDENCY))
        t0 = time.perf_counter()
        pipe, source = random_model.random_pipeline(configs, device, dtype, on_host=on_host)
        if transformer_dtype is not None:
            pipe.transformer.to(torch_dtype(transformer_dtype))
        synchronize(device)
        t1 = time.perf_counter()
        placed = None
        for name in ("text_encoder", "transformer", "vae", "audio_vae"):
            module = getattr(pipe, name)
            if keeps_on_cpu(recipe, name):
                module.to("cpu")  # the offload lever streams it from there (built there: a no-op)
            elif name == "text_encoder":
                placed = place_text_encoder(module, device, text_encoder)
        synchronize(device)
        t2 = time.perf_counter()
        runtime = cls(pipe, recipe, model, random_model.identity(configs, dtype, torch.device(device).type), device,
                      configs.default_size, weights="random", weight_source=source, shared=shared,
                      text_encoder=placed, transformer_dtype=transformer_dtype)
        runtime.load_timings = {"build_and_draw_s": t1 - t0, "placement_s": t2 - t1, **runtime.load_timings}
        return runtime

    @classmethod
    def tiny_trained(cls, recipe: Recipe, device: str | None = None, **kwargs: Any) -> "H3Runtime":
        """The trained tiny preset (h3.tiny_trained; ``tiny``, ``tiny-trained``), shipped in the package."""
        from h3.tiny_trained import trained_identity

        root = trained_tiny_dir()
        runtime = cls.from_pretrained(root, recipe, device, _default_size=TINY_DEFAULT_SIZE, **kwargs)
        runtime.model = "tiny-trained"
        runtime.model_sha256 = trained_identity(root)
        return runtime

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, recipe: Recipe, device: str | None = None, _default_size=None, *,
        shared: bool = False, text_encoder: str = "resident", transformer_dtype: str | None = None,
    ) -> "H3Runtime":
        """Load a MiniMax-H3 checkpoint directory (HF layout) offline, through diffusers' modular pipeline."""
        from diffusers.modular_pipelines import ModularPipeline

        from h3.levers import preflight
        from h3.residency import TEXT_ENCODER_RESIDENCY, place_text_encoder
        from h3.weights import CheckpointWeights

        if text_encoder not in TEXT_ENCODER_RESIDENCY:  # before any weight loads
            raise ValueError(f"text encoder residency must be one of {', '.join(TEXT_ENCODER_RESIDENCY)}, "
                             f"got {text_encoder!r}")
        root = check_checkpoint_dir(path)
        device = check_device(device)
        preflight(recipe, device)  # before loading weights: a recipe that cannot run here fails in seconds
        dtype = torch_dtype(recipe.dtype)
        t0 = time.perf_counter()
        pipe = ModularPipeline.from_pretrained(str(root), local_files_only=True)
        pipe.load_components(
            workflow="t2va", dtype=dtype, local_files_only=True, pretrained_model_name_or_path=str(root)
        )
        not_loaded = [name for name in CHECKPOINT_LAYOUT if getattr(pipe, name, None) is None]
        if not_loaded:
            raise CheckpointError(
                f"checkpoint {root}: diffusers could not load {', '.join(not_loaded)} (see the warnings above)"
            )
        if transformer_dtype is not None:
            pipe.transformer.to(torch_dtype(transformer_dtype))
        from h3.levers import keeps_on_cpu

        t1 = time.perf_counter()
        placed = None
        for name in ("transformer", "vae", "audio_vae", "text_encoder"):
            # Under group offloading the lever streams the weights to the device block by block.
            module = getattr(pipe, name)
            if keeps_on_cpu(recipe, name):
                module.eval()
            elif name == "text_encoder":
                placed = place_text_encoder(module, device, text_encoder)
                module.eval()
            else:
                module.to(device).eval()
        synchronize(device)
        t2 = time.perf_counter()
        runtime = cls(pipe, recipe, str(root), checkpoint_identity(root), device, _default_size or FULL_DEFAULT_SIZE,
                      weights="checkpoint", weight_source=CheckpointWeights(root), shared=shared, text_encoder=placed,
                      transformer_dtype=transformer_dtype)
        runtime.load_timings = {"read_weights_s": t1 - t0, "placement_s": t2 - t1, **runtime.load_timings}
        if ref_partition_is_transformer(root):
            runtime.share_ref_partition("the checkpoint's transformer_ref entry names the transformer/ weights")
        return runtime

    def share_ref_partition(self, why: str) -> None:
        """Let ref2va denoise with the loaded ``transformer`` (and so under the recipe's levers), because the
        checkpoint's ``transformer_ref`` partition is the same weights (``why``)."""
        self.pipe.update_components(transformer_ref=self.pipe.transformer)
        self.ref_partition = why

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Save the loaded components in the Hugging Face layout."""
        names = list(CHECKPOINT_LAYOUT)
        save_components({name: getattr(self.pipe, name) for name in names}, directory)

    # -- recipe ------------------------------------------------------------------------------------------------
    def _is_tiny(self) -> bool:
        """A tiny preset, random or trained (by name once loaded, by its folder while loading): the LoRA lever's
        ``@tiny`` and ``@turbo4-tiny`` load only into them."""
        from h3.tiny_trained import TRAINED_DIR

        return (self.model in TINY_MODELS or Path(self.model).name == f"tiny-{tiny_identity()[:16]}"
                or Path(self.model).resolve() == TRAINED_DIR.resolve())

    def _apply_recipe(self, applied: dict | None = None, reversible: bool | None = None) -> None:
        from h3.levers import apply_recipe_levers

        # A shared model on a GPU keeps the float weights a lever replaces where they are (no copy at every switch;
        # the memory accounting counts them); on the CPU the place is the same.
        self.levers = apply_recipe_levers(
            self.pipe, self.recipe, device=self.device, model_sha256=self.model_sha256, is_tiny=self._is_tiny(),
            reversible=self.shared if reversible is None else reversible, keep_on=None,
            weight_source=self.weight_source, applied=applied,
        )

    # -- generation --------------------------------------------------------------------------------------------
    def _record_extra(self) -> dict[str, Any]:
        """What every record of this runtime adds under ``extra``: the text encoder's residency, the transformer's
        dtype when the caller overrode the recipe's, the random weights' notice, and for a shared model the last
        switch and the memory it holds."""
        from h3.random_model import weights_notice

        fit = self._text_encoder_fit()
        extra: dict[str, Any] = {"text_encoder": {**self.text_encoder_info, **(fit.info() if fit else {})},
                                 "model_load_s": {k: round(v, 3) for k, v in self.load_timings.items()}}
        if self.transformer_dtype:
            extra["transformer_dtype"] = self.transformer_dtype
        notice = weights_notice(self.model)
        if notice:
            extra["weights_notice"] = notice
        if self.shared:
            extra["shared_model"] = {"switches": len(self.switches),
                                     "last_switch": self.switches[-1] if self.switches else None,
                                     "memory": self.memory_accounting()}
        return extra

    def _text_encoder_fit(self) -> Any:
        """The ``fit`` residency's state (h3.residency.LayerResidency), or None under another residency."""
        return getattr(self.pipe.components.get("text_encoder"), "_h3_fit", None)

    def resolve(self, request: GenerateRequest) -> tuple[int, int, int]:
        shape = resolve_request(request, self.default_size, self.pipe.canvas_multiple)
        if request.workflow == "ref2va" and self.ref_partition is None:
            raise RequestError(
                f"reference: the ref2va workflow denoises with the checkpoint's transformer_ref/ partition, which this "
                f"runtime ({self.model}) does not load; the recipe's levers apply to one DiT (transformer/). Run "
                "fl2va or t2va requests here")
        return shape

    def _stage_anatomy(self, clock: Any, t0: float, t_pipe_end: float) -> StageAnatomy:
        """The request's stages from the clock: the denoise span runs from the text encoder's end to the first
        decode's start (or the pipeline's end), never shorter than its steps' sum; the video decode excludes the frame
        preparation streamed inside it, which counts in ``frame_prep_d2h``; ``other`` is the pipeline's rest."""
        steps = clock.each("denoise_step")
        text_start = clock.first_start("denoise_step")
        # The first decode's start (a streamed request decodes its audio first: h3.post_decode)
        dec_starts = [t for t in (clock.first_start("video_decode"), clock.first_start("audio_decode"))
                      if t is not None]
        denoise_start = clock.last_end("text_encode") or t0
        denoise_end = min(dec_starts) if dec_starts else t_pipe_end
        anatomy = StageAnatomy(
            text_encode=clock.total("text_encode"),
            denoise_steps=steps,
            denoise=max(denoise_end - denoise_start, sum(steps)) if text_start is not None else 0.0,
            video_decode=clock.exclusive("video_decode", "frame_prep_d2h"),  # less the streamed frame prep in it
            audio_decode=clock.total("audio_decode"),
            frame_prep_d2h=clock.total("frame_prep_d2h"),
            mux_save=clock.total("mux_save"),
        )
        accounted = anatomy.text_encode + anatomy.denoise + anatomy.video_decode + anatomy.audio_decode
        accounted += sum(end - start for name, start, end in clock.intervals  # streamed frame prep, in the pipeline
                         if name == "frame_prep_d2h" and end <= t_pipe_end)
        anatomy.other = max(0.0, (t_pipe_end - t0) - accounted)
        return anatomy

    def _executed(self, clock: Any) -> Executed:
        """What ran: forward passes, attention backends of the denoise steps, dtype, VAE tiling, the levers'
        telemetry."""
        attention = sorted({backend for (stage, backend) in clock.attention_calls if stage == "denoise_step"})
        executed = Executed(
            forward_passes=len(clock.each("denoise_step")),
            attention_backends=attention,
            torch_dtype=str(self.pipe.transformer.dtype).replace("torch.", ""),
            vae_tiling=bool(self.pipe.vae.use_tiling),
            vae_tile=[self.pipe.vae.tile_sample_min_height, self.pipe.vae.tile_sample_min_width]
            if self.pipe.vae.use_tiling else None,
        )
        executed.levers = lever_telemetry(self.levers, self.recipe, executed)
        return executed

    def _clip_record(self, request: GenerateRequest, out: Path, size: tuple[int, int], clock: Any, state: Any,
                     frames: np.ndarray, pcm: np.ndarray, sample_rate: int, peak: int | None, times: dict[str, float],
                     extra: dict | None, frames_sha256: str | None = None) -> ClipRecord:
        """The record of one written clip (``times``: the request's perf_counter marks)."""
        height, width = size
        anatomy = self._stage_anatomy(clock, times["t0"], times["t_pipe_end"])
        executed = self._executed(clock)
        num_text_tokens = int(state.get("prompt_embeds").shape[1])
        num_audio_latents = int(state.get("num_audio_latents") or 0)
        num_latent_frames = int(state.get("num_latent_frames") or 0)
        seq_len = int(state.get("token_tags").shape[0]) if state.get("token_tags") is not None else 0
        record = ClipRecord(
            request=RequestSpec(
                prompt=request.prompt, prompt_id=request.prompt_id, seed=request.seed,
                num_frames=request.num_frames, seconds=request.seconds,
                height=height if request.height is None else request.height,
                width=width if request.width is None else request.width,
                workflow=request.workflow, conditioning=request.conditioning_spec(),
            ),
            shape=ResolvedShape(
                num_frames=int(frames.shape[0]), height=int(frames.shape[1]), width=int(frames.shape[2]), fps=FPS,
                duration_s=frames.shape[0] / FPS, num_latent_frames=num_latent_frames,
                num_audio_latents=num_audio_latents, audio_sample_rate=sample_rate,
                audio_channels=int(pcm.shape[1]), num_audio_samples=int(pcm.shape[0]),
                num_text_tokens=num_text_tokens, sequence_length=seq_len,
            ),
            recipe_name=self.recipe.name,
            recipe=self.recipe.resolved(),
            recipe_sha256=self.recipe.sha256(),
            model=self.model,
            model_sha256=self.model_sha256,
            weights=self.weights,
            # hashed in place (the bytes of tobytes(), without its copy: 0.6 of 1.15 s at 5 s 544x960 on the 2-core VM)
            frames_sha256=frames_sha256 or hashlib.sha256(np.ascontiguousarray(frames)).hexdigest(),
            pcm_sha256=hashlib.sha256(np.ascontiguousarray(pcm)).hexdigest(),
            mp4_sha256=sha256_file(out),
            mp4_bytes=out.stat().st_size,
            timings=Timings(
                stage_anatomy=anatomy,
                generation_side_latency_s=times["t_gen_end"] - times["t0"],
                request_to_file_latency_s=times["t_file"] - times["t_request"],
            ),
            peak_memory_bytes=peak,
            device=str(self.device),
            executed=executed,
            versions=provenance.versions(),
            hardware=provenance.hardware(self.device),
            created_at=provenance.utc_now(),
            extra={**self._record_extra(), **dict(extra or {})},
        )
        return record

    def _writes_output(self) -> bool:
        return all(lever.writes_output for lever in self.levers.values())

    def _open_frame_stream(self, out: Path, num_frames: int, height: int, width: int,
                           clock: Any) -> tuple[FrameStream | None, dict[str, Any]]:
        """The request's :class:`~h3.post_decode.FrameStream` (its MP4 encoded while the video decodes), or None, and
        the record's ``post_decode`` entry saying which and why."""
        why_not = None
        if self.stream_mux is False:
            why_not = "H3_STREAM_MUX=0"
        elif self.stream_mux is None and self.device.type == "cpu":
            # On the CPU the decode is CPU work too: the 2-core VM gained nothing in request-to-file and lost
            # generation-side time to the encoder's threads (bench/post_decode/results/post_decode_cpu_5x544x960.md).
            why_not = "the decode runs on the CPU (auto streams where a device decodes while the CPU encodes)"
        elif self.stream_mux is None and height * width < ENCODE_THREADS_MIN_PIXELS:
            why_not = (f"{height}x{width} frames encode in one thread (auto streams from {ENCODE_THREADS_MIN_PIXELS} "
                       "pixels)")
        elif not self._writes_output():
            why_not = "this rank writes no output"
        else:
            why_not = stream_refusal(self.pipe.vae)
        if why_not is not None:
            return None, {"streamed": False, "why_not": why_not}
        writer = Mp4StreamWriter(out, num_frames, height, width, fps=FPS,
                                 sample_rate=int(self.pipe.audio_sampling_rate))
        stream = FrameStream(writer, num_frames, height, width, tuple(self.pipe.pixel_mean),
                             tuple(self.pipe.pixel_std), timed=lambda: clock.nested("frame_prep_d2h"))
        return stream, {"streamed": True}

    def _frames_after_decode(self, state: Any, stream: FrameStream | None, post_decode: dict[str, Any],
                             out: Path) -> tuple[np.ndarray, np.ndarray, int, FrameStream | None]:
        """The clip's uint8 frames, int16 PCM and sample rate from the pipeline's output: prepared on the device
        (uint8, channel-last) and copied to the host once each; a streamed request has its frames on the host already
        and checks them against the pipeline's output, and a stream that fails the check is dropped (its file
        removed; the answer's stream is None and the whole video is prepared and encoded as without one)."""
        video = state.get("videos")  # (1, T, 3, H, W) float in [0, 1]
        pcm = pcm_int16(state.get("audio")[0]).cpu().numpy()  # audio: (1, 2, N) float
        sample_rate = int(state.get("sampling_rate"))
        if stream is not None:
            problem = stream.check(video[0])
            if problem is None and sample_rate != stream.writer.sample_rate:
                problem = f"sample rate {sample_rate}, the stream opened at {stream.writer.sample_rate}"
            if problem is None and stream.writer.pcm is not None and not np.array_equal(pcm, stream.writer.pcm):
                problem = "the PCM encoding since the audio decode differs from the pipeline's audio"
            post_decode.update(chunks=len(stream.bounds), checked_frames=len(stream.check_indices()))
            if problem is not None:
                logger.warning("streamed MP4 of %s dropped, the whole video is encoded again: %s", out, problem)
                post_decode.update(streamed=False, fallback=problem)
                stream.writer.abort()
                stream.close()
                stream = None
        frames = stream.frames if stream is not None else frames_uint8(video[0]).cpu().numpy()
        return frames, pcm, sample_rate, stream

    @torch.no_grad()
    def generate(
        self, request: GenerateRequest, out: str | os.PathLike, extra: dict | None = None, trajectory: bool = False
    ) -> ClipRecord | None:
        """Generate one clip into ``out`` (.mp4) and its record into ``out`` with .json, both atomically. On a follower
        rank of a parallel runtime (rank > 0) nothing is written and the answer is None.

        With ``trajectory``, the latent trajectory is also written to ``<out>.traj.npz`` (h3.trajectory).
        """
        t_request = time.perf_counter()
        if not self.levers_applied:
            raise SharedModelError(f"recipe {self.recipe.name!r} is not applied to the shared model (its levers failed "
                                   "to apply at the last switch)")
        num_frames, height, width = self.resolve(request)
        out = Path(out)
        recorder = TrajectoryRecorder() if trajectory else None
        fit, fit_key = self._text_encoder_fit(), (self.recipe.name, num_frames, height, width)
        if fit is not None:  # before the clock and the peak's reset: what another shape kept goes back to host memory
            fit.before_request(fit_key)
        with self.hooks.request(self.device) as clock, (
            recorder.attach(self.pipe) if recorder is not None else contextlib.nullcontext()
        ):
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            for lever in self.levers.values():
                lever.begin_request()
            t0 = clock.now()
            stream, post_decode = self._open_frame_stream(out, num_frames, height, width, clock)
            try:
                with contextlib.ExitStack() as streaming:
                    if stream is not None:
                        streaming.enter_context(streaming_decode(self.pipe.vae, stream.on_chunk))
                        post_decode["audio_first"] = streaming.enter_context(
                            audio_decoded_first(self.pipe, stream.on_audio))
                    state = self.pipe(
                        prompt=request.prompt,
                        generator=torch.Generator("cpu").manual_seed(request.seed),
                        num_inference_steps=self.recipe.num_inference_steps,
                        height=height,
                        width=width,
                        num_frames=num_frames,
                        output_type="pt",
                        **pipeline_inputs(request.first_frame, request.last_frame, request.reference),
                    )
                t_pipe_end = clock.now()
                for lever in self.levers.values():
                    lever.finish_request(clock)  # the parallel lever: every rank's anatomy to rank 0 (a collective)
                if not self._writes_output():
                    if fit is not None:
                        fit.after_request(fit_key)
                    return None  # a follower rank of a parallel runtime: rank 0 prepares the frames, writes the files
                with clock.stage("frame_prep_d2h"):
                    frames, pcm, sample_rate, stream = self._frames_after_decode(state, stream, post_decode, out)
                t_gen_end = clock.now()
                peak = int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda" else None
                with clock.stage("mux_save"):
                    if stream is not None:
                        stream.writer.finish(pcm)
                        post_decode["encode_busy_s"] = round(stream.writer.encode_s, 4)
                    else:
                        encode_mp4(out, frames, pcm, fps=FPS, sample_rate=sample_rate)
                t_file = time.perf_counter()
            except BaseException:
                if stream is not None:
                    stream.writer.abort()
                    stream.close()
                raise
        times = {"t0": t0, "t_pipe_end": t_pipe_end, "t_gen_end": t_gen_end, "t_file": t_file, "t_request": t_request}
        frames_sha256 = stream.frames_sha256() if stream is not None else None
        extra = {**dict(extra or {}), "post_decode": post_decode}
        record = self._clip_record(request, out, (height, width), clock, state, frames, pcm, sample_rate, peak, times,
                                   extra, frames_sha256=frames_sha256)
        if recorder is not None:
            recorder.save(trajectory_path(out))
        atomic_write_json(out.with_suffix(".json"), record.model_dump(mode="json"))
        if fit is not None:
            fit.after_request(fit_key)  # after the record: the copy up is no request's time
        return record
