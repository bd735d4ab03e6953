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
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from h3 import provenance
from h3.anatomy import StageHooks, synchronize
from h3.atomic import atomic_write_json, sha256_file
from h3.levers import lever_telemetry
from h3.media import encode_mp4
from h3.conditioning import ROLES, ConditioningError, ImageInput, pipeline_inputs, workflow_of
from h3.record import ClipRecord, ConditioningImage, Executed, RequestSpec, ResolvedShape, StageAnatomy, Timings
from h3.recipe import Recipe
from h3.trajectory import TrajectoryRecorder, trajectory_path

logger = logging.getLogger(__name__)

FPS = 24
MIN_SECONDS, MAX_SECONDS = 5.0, 15.0
MAX_FRAMES = 345
"""The longest clip: 17 * 20 + 5 frames = 14.375 s (the next, 362 frames, is 15.083 s)."""
# 128x128, not 64x64: libx264 output was seen to vary run to run on 64x64 frames (uninitialized reads on tiny
# frames; bench notes in h3/media.py), never at 128 or 256.
TINY_DEFAULT_SIZE = (128, 128)
TINY_MODELS = ("tiny", "tiny-trained", "tiny-random")
"""Model names that are presets rather than checkpoint directories."""
MODEL_ALIASES = {"tiny": "tiny-trained"}
"""Names a user may give for a preset, and the preset's own name that runs, records and servers keep."""


def canonical_model(model: str) -> str:
    """The name of the model that ``model`` loads, as records, run manifests and servers write it: ``tiny`` is the
    trained preset, ``tiny-trained``; every other name (``tiny-random``, a random preset, a checkpoint path) is its
    own. Until issue 17 ``tiny`` was the random preset: keeping the alias out of records keeps old and new runs apart
    (a rerun of an old ``tiny`` run is refused, naming the model)."""
    return MODEL_ALIASES.get(model, model)


# MiniMax-H3's own 16:9 canvas (diffusers' resolve_canvas_size(16, 9) with the released short edge 768).
FULL_DEFAULT_SIZE = (768, 1344)

# The components of the t2va workflow and the files each must have in the checkpoint directory.
_WEIGHTS = {
    "diffusers": ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.safetensors.index.json"),
    "transformers": ("model.safetensors", "model.safetensors.index.json"),
}
CHECKPOINT_LAYOUT: dict[str, tuple[str, ...]] = {
    "transformer": ("config.json", "@diffusers"),
    "vae": ("config.json", "@diffusers"),
    "audio_vae": ("config.json", "@diffusers"),
    "text_encoder": ("config.json", "@transformers"),
    "tokenizer": ("tokenizer_config.json", "tokenizer.json|vocab.json"),
    "processor": ("processor_config.json|preprocessor_config.json",),
    "scheduler": ("scheduler_config.json",),
    "audio_scheduler": ("scheduler_config.json",),
}


class CheckpointError(FileNotFoundError):
    """A checkpoint directory is missing or incomplete; the message names what is missing and where."""


class RequestError(ValueError):
    """A generation request H3 cannot run (shape, duration, seed)."""


class DeviceError(RequestError):
    """A ``--device`` this process cannot run on (not a device string torch knows, not a CPU or a CUDA GPU, or a GPU
    this machine does not have); the message says which and what there is."""


def check_device(device: str | None) -> str:
    """``device`` as the runtime will use it (None: the GPU if there is one, else the CPU), or a DeviceError in one
    sentence: checked before any weight loads, so a wrong ``--device`` costs no build and shows no traceback."""
    if device is None:
        return default_device()
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise DeviceError(f"--device {device!r} is not a device; use 'cpu' or 'cuda' (or 'cuda:N')") from None
    if parsed.type == "cpu":
        return str(device)
    if parsed.type != "cuda":
        raise DeviceError(f"--device {device!r}: h3 runs on 'cpu' or 'cuda' (or 'cuda:N'), not {parsed.type!r}")
    if not torch.cuda.is_available():
        built = f"torch {torch.__version__}" + (f" built with CUDA {torch.version.cuda}" if torch.version.cuda
                                                else " built without CUDA")
        raise DeviceError(f"--device {device!r}: no CUDA GPU is visible to this process ({built}); use --device cpu")
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise DeviceError(f"--device {device!r}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")
    return str(device)


@dataclass
class GenerateRequest:
    prompt: str
    seed: int
    num_frames: int | None = None
    seconds: float | None = None
    height: int | None = None
    width: int | None = None
    prompt_id: str | None = None
    first_frame: ImageInput | None = None
    """Keyframe the clip starts from (fl2va)."""
    last_frame: ImageInput | None = None
    """Keyframe the clip ends on (fl2va)."""
    reference: ImageInput | None = None
    """Reference image whose subject the clip keeps (ref2va)."""

    @property
    def workflow(self) -> str:
        return workflow_of(self.first_frame, self.last_frame, self.reference)

    def images(self) -> dict[str, ImageInput]:
        """The image inputs present, by role, in role order."""
        return {role: getattr(self, role) for role in ROLES if getattr(self, role) is not None}

    def conditioning_spec(self) -> list[ConditioningImage]:
        return [ConditioningImage(role=role, sha256=image.sha256, width=image.width, height=image.height,
                                  media_type=image.media_type) for role, image in self.images().items()]


def snap_num_frames(num_frames: int) -> int:
    """Snap up to the next ``17 * n + 5`` the video VAE can decode (diffusers' own arithmetic)."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import align_num_frames

    return align_num_frames(num_frames, 17, 5)


def resolve_request(request: GenerateRequest, default_size: tuple[int, int], canvas_multiple: int = 32) -> tuple[int, int, int]:
    """(num_frames, height, width) H3 will generate for ``request``, or a RequestError that says why not."""
    if not isinstance(request.prompt, str) or not request.prompt.strip():
        raise RequestError("the prompt is empty")
    if not isinstance(request.seed, int) or isinstance(request.seed, bool) or request.seed < 0:
        raise RequestError(f"seed must be a non-negative integer, got {request.seed!r}")
    if request.seed >= 2**63:
        raise RequestError(f"seed must be below 2**63, got {request.seed}")
    if request.num_frames is not None and request.seconds is not None:
        raise RequestError("give either num_frames or seconds, not both")
    if request.seconds is not None:
        seconds = request.seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
            raise RequestError(f"seconds must be a finite number, got {seconds!r}")
        if not seconds > 0:
            raise RequestError(f"seconds must be positive, got {seconds}")
        if seconds > MAX_SECONDS:  # checked before seconds * FPS, which overflows for 1e308
            raise RequestError(f"MiniMax-H3 generates {MIN_SECONDS:g} to {MAX_SECONDS:g} s, got {seconds:g} s")
        wanted = max(1, int(round(seconds * FPS)))
    elif request.num_frames is not None:
        if isinstance(request.num_frames, bool) or not isinstance(request.num_frames, int):
            raise RequestError(f"num_frames must be an integer, got {request.num_frames!r}")
        if request.num_frames < 1:
            raise RequestError(f"num_frames must be positive, got {request.num_frames}")
        wanted = int(request.num_frames)
    else:
        wanted = int(MIN_SECONDS * FPS)
    snapped = snap_num_frames(wanted)
    if request.seconds is not None and snapped > MAX_FRAMES and wanted <= MAX_SECONDS * FPS:
        # A duration up to 15 s (360 frames) snaps up to 362 = 15.083 s, past what diffusers accepts: the longest
        # clip below it instead. (An explicit num_frames keeps diffusers' own rule: up to the next 17n+5.)
        snapped = MAX_FRAMES
    duration = snapped / FPS
    if not MIN_SECONDS <= duration <= MAX_SECONDS:
        raise RequestError(
            f"{wanted} frames snap up to {snapped} (17n+5) = {duration:.3f} s at {FPS} fps; MiniMax-H3 generates "
            f"{MIN_SECONDS:g} to {MAX_SECONDS:g} s, i.e. num_frames {int(MIN_SECONDS * FPS)} to {MAX_FRAMES}"
        )
    if (request.height is None) != (request.width is None):
        raise RequestError("give height and width together, or neither")
    height, width = (request.height, request.width) if request.height is not None else default_size
    for label, value in (("height", height), ("width", width)):
        if not isinstance(value, int) or value <= 0 or value % canvas_multiple:
            raise RequestError(f"{label} must be a positive multiple of {canvas_multiple}, got {value}")
    ratio = width / height
    if not 0.25 <= ratio <= 4.0:
        raise RequestError(f"aspect ratio {width}x{height} is outside MiniMax-H3's 1:4 to 4:1")
    try:
        request.workflow
    except ConditioningError as exc:
        raise RequestError(str(exc)) from None
    return snapped, height, width


def check_checkpoint_dir(path: str | os.PathLike) -> Path:
    """Raise CheckpointError naming every missing file of a MiniMax-H3 checkpoint directory (t2va workflow)."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(
            f"checkpoint directory {root} does not exist; put the Hugging Face layout of MiniMaxAI/MiniMax-H3 there "
            "(modular_model_index.json, transformer/, vae/, audio_vae/, text_encoder/, tokenizer/, processor/, "
            "scheduler/, audio_scheduler/)"
        )
    missing: list[str] = []
    if not (root / "modular_model_index.json").is_file():
        missing.append(str(root / "modular_model_index.json"))
    for component, needs in CHECKPOINT_LAYOUT.items():
        folder = root / component
        if not folder.is_dir():
            missing.append(f"{folder}/ (the {component} component)")
            continue
        for need in needs:
            if need.startswith("@"):
                single, index = _WEIGHTS[need[1:]]
                if (folder / single).is_file():
                    continue
                if (folder / index).is_file():
                    import json

                    shards = sorted(set(json.loads((folder / index).read_text()).get("weight_map", {}).values()))
                    missing.extend(str(folder / s) for s in shards if not (folder / s).is_file())
                    continue
                missing.append(f"{folder / single} (or {index} with its shards)")
            elif not any((folder / alt).is_file() for alt in need.split("|")):
                missing.append(str(folder / need.split("|")[0]))
    if missing:
        raise CheckpointError(f"checkpoint {root} is incomplete; missing: " + "; ".join(missing))
    return root


SMALL_MODELS = (*TINY_MODELS, "h3-random-small")
"""Models with the tiny preset's small configs and canvas (a CPU clip in seconds)."""


def model_default_size(model: str) -> tuple[int, int]:
    """The (height, width) a request of ``model`` gets when it names none: the tiny preset's small canvas for the
    small models, MiniMax-H3's 768x1344 otherwise."""
    return TINY_DEFAULT_SIZE if model in SMALL_MODELS else FULL_DEFAULT_SIZE


def check_model(model: str) -> None:
    """Raise CheckpointError unless ``model`` is a tiny preset (the trained one present), a random preset or a complete
    checkpoint directory."""
    from h3.random_model import is_random_preset

    if canonical_model(model) == "tiny-trained":
        trained_tiny_dir()
    elif model not in TINY_MODELS and not is_random_preset(model):
        check_checkpoint_dir(model)


def checkpoint_identity(root: Path) -> str:
    """Hash of the files that identify a checkpoint's weights: configs, indexes and weight file sizes."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        digest.update(rel.encode())
        if path.suffix in (".json", ".txt", ".model"):
            digest.update(path.read_bytes())
        else:
            digest.update(str(path.stat().st_size).encode())
    return digest.hexdigest()


def _torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
            "float64": torch.float64}[name]


def tiny_identity() -> str:
    from h3 import tiny

    return tiny.tiny_identity()


def model_identity(model: str) -> str | None:
    """What :meth:`H3Runtime.load` will record as ``model_sha256`` for ``model``, without loading it: the tiny
    presets' identities, a checkpoint directory's (configs and weight sizes); None for a random preset (its weights
    are a function of its name) or a path that is not there (loading will say so). A run stores it so that a resumed
    run refuses clips of other weights under the same model name (a retrained ``tiny-trained``)."""
    from h3.random_model import is_random_preset

    model = canonical_model(model)  # ``tiny`` is the trained preset
    if model == "tiny-random":
        return tiny_identity()
    if model == "tiny-trained":
        from h3.tiny_trained import trained_identity

        try:
            return trained_identity(trained_tiny_dir())
        except CheckpointError:
            return None
    if is_random_preset(model) or not Path(model).is_dir():
        return None
    return checkpoint_identity(Path(model))


def trained_tiny_dir() -> Path:
    """The shipped trained tiny checkpoint, or a CheckpointError that says what is missing and how to make it."""
    from h3.tiny_trained import TRAINED_DIR

    if not (TRAINED_DIR / "modular_model_index.json").is_file():
        raise CheckpointError(
            f"the trained tiny preset is missing: {TRAINED_DIR}/modular_model_index.json (it ships with the package; "
            "train it with `python -m h3.train all --out DIR` and copy DIR/tiny there), or use --model tiny-random")
    return TRAINED_DIR


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def tiny_checkpoint_dir() -> Path:
    """The random-weight tiny preset (``tiny-random``) saved in the real layout; built on first use into the cache
    folder (atomically)."""
    from h3 import tiny

    identity = tiny.tiny_identity()
    cache = Path(os.environ.get("H3_CACHE_DIR", Path.home() / ".cache" / "h3"))
    target = cache / f"tiny-{identity[:16]}"
    if (target / "modular_model_index.json").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cache, prefix=".tiny-"))
    try:
        save_components(tiny.tiny_components(), staging)
        try:
            os.replace(staging, target)
        except OSError:
            # Another process finished first: theirs is identical.
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def save_components(components: dict[str, Any], directory: str | os.PathLike) -> None:
    """Save pipeline components in the Hugging Face layout (ModularPipeline.save_pretrained)."""
    from diffusers.modular_pipelines import MiniMaxH3Blocks

    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(**components)
    pipe.save_pretrained(str(directory))
    _relativize_index(Path(directory))


def _relativize_index(directory: Path) -> None:
    """save_pretrained writes the absolute save path into the index; make the folder relocatable."""
    import json

    index_path = directory / "modular_model_index.json"
    index = json.loads(index_path.read_text())
    for value in index.values():
        if isinstance(value, list) and len(value) == 3 and isinstance(value[2], dict):
            if value[2].get("pretrained_model_name_or_path"):
                value[2]["pretrained_model_name_or_path"] = None
    index_path.write_text(json.dumps(index, indent=2) + "\n")


def _ref_partition_is_transformer(root: Path) -> bool:
    """Whether the checkpoint index points ``transformer_ref`` at the ``transformer/`` folder (one DiT for all)."""
    import json

    try:
        entry = json.loads((root / "modular_model_index.json").read_text()).get("transformer_ref")
    except (OSError, ValueError):
        return False
    return isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], dict) and \
        entry[2].get("subfolder") == "transformer"


def _quiet_progress_bars(blocks: Any) -> None:
    """The denoise loop's tqdm bar would interleave with the suite's own progress display."""
    if hasattr(blocks, "set_progress_bar_config"):
        blocks.set_progress_bar_config(disable=True)
    for child in getattr(blocks, "sub_blocks", {}).values():
        _quiet_progress_bars(child)


class SharedModelError(ValueError):
    """A recipe cannot run on a model that other recipes share in this process (its dtype, or a lever that cannot be
    removed between requests); the message says why and what to do instead."""


def shared_recipes_problems(recipes: list[Recipe]) -> list[str]:
    """Why ``recipes`` cannot take turns on one shared model (checked before any weight loads): one dtype for all,
    every lever removable between requests."""
    from h3.levers import shared_problems

    problems = []
    for recipe in recipes:
        if recipe.dtype != recipes[0].dtype:
            problems.append(f"{recipe.name}: its dtype is {recipe.dtype}, {recipes[0].name}'s is {recipes[0].dtype} "
                            "(one shared model has one dtype)")
        problems += [f"{recipe.name}: {p}" for p in shared_problems(recipe)]
    return problems


def _component_settings(pipe: Any) -> dict[str, dict[str, Any]]:
    """The plain attributes of each component module (what a recipe's ``prepare`` sets, e.g. the VAE's tiling), so
    that removing a shared model's levers can put them back as loaded."""
    plain = (bool, int, float, str, type(None))
    out = {}
    for name in ("transformer", "vae", "audio_vae", "text_encoder"):
        module = getattr(pipe, name, None)
        if module is not None:
            out[name] = {k: v for k, v in vars(module).items()
                         if not k.startswith("_") and (isinstance(v, plain) or (isinstance(v, tuple) and all(
                             isinstance(x, plain) for x in v)))}
    return out


def _restore_component_settings(pipe: Any, settings: dict[str, dict[str, Any]]) -> None:
    plain = (bool, int, float, str, type(None), tuple)
    for name, values in settings.items():
        module = getattr(pipe, name)
        for key in [k for k, v in vars(module).items() if not k.startswith("_") and isinstance(v, plain)]:
            if key not in values:
                delattr(module, key)
        for key, value in values.items():
            setattr(module, key, value)


class H3Runtime:
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
        self._loaded_settings = _component_settings(pipe)
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
        from h3.residency import TEXT_ENCODER_RESIDENCY, place_text_encoder

        if text_encoder not in TEXT_ENCODER_RESIDENCY:  # before any weight is drawn
            raise ValueError(f"text encoder residency must be one of {', '.join(TEXT_ENCODER_RESIDENCY)}, "
                             f"got {text_encoder!r}")
        configs = random_model.preset(model)
        device = check_device(device)
        preflight(recipe, device)
        dtype = _torch_dtype(recipe.dtype)
        # What lives in host memory is drawn on the device one tensor at a time and copied down (the same values as
        # a build on the device): the 62 GiB text encoder streamed, or a component the offload lever streams, never
        # passes through the device whole, so a full-size request fits one 80 GB card.
        on_host = tuple(name for name in ("text_encoder", "transformer", "vae", "audio_vae")
                        if keeps_on_cpu(recipe, name) or (name == "text_encoder" and text_encoder == "offload"))
        t0 = time.perf_counter()
        pipe, source = random_model.random_pipeline(configs, device, dtype, on_host=on_host)
        if transformer_dtype is not None:
            pipe.transformer.to(_torch_dtype(transformer_dtype))
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
        dtype = _torch_dtype(recipe.dtype)
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
            pipe.transformer.to(_torch_dtype(transformer_dtype))
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
        if _ref_partition_is_transformer(root):
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

    def check_shareable(self, recipe: Recipe) -> None:
        """Raise :class:`SharedModelError` when ``recipe`` cannot take its turn on this shared model."""
        from h3.levers import shared_problems

        problems = []
        if recipe.dtype != self.loaded_dtype:
            problems.append(f"its dtype is {recipe.dtype}, the shared model was loaded in {self.loaded_dtype} (the "
                            "text encoder, VAEs and DiT weights are shared, so one dtype for every recipe)")
        problems += shared_problems(recipe)
        if problems:
            raise SharedModelError(
                f"recipe {recipe.name!r} cannot share this process's model: " + "; ".join(problems)
                + ". Give it its own process (`h3 serve --recipe ...` and `h3eval ab --backend http --url "
                f"{recipe.name}=URL`), or change the recipe.")

    def switch_recipe(self, recipe: Recipe, final: bool = False) -> dict[str, Any]:
        """Make ``recipe`` the active one of a shared model: remove the levers the two recipes do not share (in reverse
        order), then apply the new recipe's. Returns what it did (kept, removed and applied levers, seconds).

        ``final``: the last recipe this model runs; its levers apply for good (quantization drops the float weights
        it replaces, layer by layer), which is what lets an FP8 recipe follow bf16 ones on an 80 GB card. No switch
        follows it."""
        from h3.levers import lever_configs

        if not self.shared:
            raise SharedModelError("switch_recipe needs a runtime loaded with shared=True")
        if self.final:
            raise SharedModelError(f"recipe {self.recipe.name!r} was applied for good (final): no switch follows it")
        self.check_shareable(recipe)
        t0 = time.perf_counter()
        previous = self.recipe.name
        old, new = lever_configs(self.recipe), lever_configs(recipe)
        keep = 0
        # Levers stay only as an unbroken prefix in the order they apply: a later lever may depend on an earlier one.
        for a, b in zip(old, new):
            if a.name != b.name or a.model_dump() != b.model_dump() or self.recipe.steps != recipe.steps:
                break
            keep += 1
        prefix = {c.name for c in old[:keep]}
        removed = [name for name in reversed(list(self.levers)) if name not in prefix]
        # The stage timers wrap the components' methods on top of the levers' own wrappers (a VAE lever wraps
        # ``vae.decode``): off before any lever comes off, so that a lever's removal cannot drop the timer with it
        # (a shared model loaded with turbo4 first lost its video_decode timing at the first switch, and every
        # decode was counted as denoising: 2026-12-01 H200 call), and back on, outermost, once the new levers are on.
        self.hooks.remove()
        for name in removed:
            self.levers.pop(name).remove()
        kept_names = list(self.levers)
        # Settings a recipe makes whether its levers are on or off (the VAE's tiling) back as loaded; every lever's
        # ``prepare`` then sets them for the new recipe, kept levers included.
        _restore_component_settings(self.pipe, self._loaded_settings)
        self.recipe = recipe
        try:
            self._apply_recipe(applied=dict(self.levers), reversible=False if final else None)
            self.final = final
        except BaseException:
            # The new recipe's levers rolled back; leave the model as loaded so the next switch starts clean and no
            # request runs a half-applied recipe.
            self.remove_levers()  # (puts the stage timers back on, outermost)
            self.levers_applied = False
            raise
        self.hooks = StageHooks(self.pipe)
        self.levers_applied = True
        synchronize(self.device)
        info = {"from": previous, "to": recipe.name, "kept": kept_names, "removed": removed,
                "applied": [n for n in self.levers if n not in kept_names], "seconds": time.perf_counter() - t0,
                "final": final}
        self.switches.append(info)
        return info

    def remove_levers(self) -> None:
        """Remove every lever of the active recipe (reverse order) and put the components' settings back: the model
        as loaded. A shared model only (a single-recipe runtime may have dropped what removal needs)."""
        if not self.shared:
            raise SharedModelError("remove_levers needs a runtime loaded with shared=True")
        self.hooks.remove()  # the timers sit on top of the levers' wrappers (see switch_recipe)
        for name in reversed(list(self.levers)):
            self.levers.pop(name).remove()
        _restore_component_settings(self.pipe, self._loaded_settings)
        self.hooks = StageHooks(self.pipe)
        self.levers_applied = False

    def memory_accounting(self) -> dict[str, Any]:
        """Bytes this process holds, by component and where (device / host), plus what the active levers keep
        outside the model: a shared model shows one set of components whatever the number of recipes."""
        from h3.memory import account

        return account(self.pipe, self.levers)

    # -- generation --------------------------------------------------------------------------------------------
    def _record_extra(self) -> dict[str, Any]:
        """What every record of this runtime adds under ``extra``: the text encoder's residency, the transformer's
        dtype when the caller overrode the recipe's, the random weights' notice, and for a shared model the last
        switch and the memory it holds."""
        from h3.random_model import weights_notice

        extra: dict[str, Any] = {"text_encoder": dict(self.text_encoder_info),
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

    def resolve(self, request: GenerateRequest) -> tuple[int, int, int]:
        shape = resolve_request(request, self.default_size, self.pipe.canvas_multiple)
        if request.workflow == "ref2va" and self.ref_partition is None:
            raise RequestError(
                f"reference: the ref2va workflow denoises with the checkpoint's transformer_ref/ partition, which this "
                f"runtime ({self.model}) does not load; the recipe's levers apply to one DiT (transformer/). Run "
                "fl2va or t2va requests here")
        return shape

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
        with self.hooks.request(self.device) as clock, (
            recorder.attach(self.pipe) if recorder is not None else contextlib.nullcontext()
        ):
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            for lever in self.levers.values():
                lever.begin_request()
            t0 = clock.now()
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
            if not all(lever.writes_output for lever in self.levers.values()):
                return None  # a follower rank of a parallel runtime: rank 0 prepares the frames and writes the files
            # Frame preparation on the device (uint8, channel-last), then one device-to-host copy each.
            with clock.stage("frame_prep_d2h"):
                video = state.get("videos")  # (1, T, 3, H, W) float in [0, 1]
                frames_dev = (video[0].float() * 255.0).round_().clamp_(0, 255).to(torch.uint8)
                frames = frames_dev.permute(0, 2, 3, 1).contiguous().cpu().numpy()
                audio = state.get("audio")  # (1, 2, N) float
                pcm_dev = (audio[0].float().clamp(-1, 1) * 32767.0).round_().to(torch.int16)
                pcm = pcm_dev.t().contiguous().cpu().numpy()
            t_gen_end = clock.now()
            peak = int(torch.cuda.max_memory_allocated(self.device)) if self.device.type == "cuda" else None
            with clock.stage("mux_save"):
                sample_rate = int(state.get("sampling_rate"))
                encode_mp4(out, frames, pcm, fps=FPS, sample_rate=sample_rate)
            t_file = time.perf_counter()

        steps = clock.each("denoise_step")
        text_start, dec_start = clock.first_start("denoise_step"), clock.first_start("video_decode")
        denoise_start = clock.last_end("text_encode") or t0
        denoise_end = dec_start if dec_start is not None else t_pipe_end
        anatomy = StageAnatomy(
            text_encode=clock.total("text_encode"),
            denoise_steps=steps,
            denoise=max(denoise_end - denoise_start, sum(steps)) if text_start is not None else 0.0,
            video_decode=clock.total("video_decode"),
            audio_decode=clock.total("audio_decode"),
            frame_prep_d2h=clock.total("frame_prep_d2h"),
            mux_save=clock.total("mux_save"),
        )
        accounted = anatomy.text_encode + anatomy.denoise + anatomy.video_decode + anatomy.audio_decode
        anatomy.other = max(0.0, (t_pipe_end - t0) - accounted)
        attention = sorted({backend for (stage, backend) in clock.attention_calls if stage == "denoise_step"})
        executed = Executed(
            forward_passes=len(steps),
            attention_backends=attention,
            torch_dtype=str(self.pipe.transformer.dtype).replace("torch.", ""),
            vae_tiling=bool(self.pipe.vae.use_tiling),
            vae_tile=[self.pipe.vae.tile_sample_min_height, self.pipe.vae.tile_sample_min_width]
            if self.pipe.vae.use_tiling else None,
        )
        executed.levers = lever_telemetry(self.levers, self.recipe, executed)
        latents = state.get("latents")
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
            frames_sha256=hashlib.sha256(frames.tobytes()).hexdigest(),
            pcm_sha256=hashlib.sha256(pcm.tobytes()).hexdigest(),
            mp4_sha256=sha256_file(out),
            mp4_bytes=out.stat().st_size,
            timings=Timings(
                stage_anatomy=anatomy,
                generation_side_latency_s=t_gen_end - t0,
                request_to_file_latency_s=t_file - t_request,
            ),
            peak_memory_bytes=peak,
            device=str(self.device),
            executed=executed,
            versions=provenance.versions(),
            hardware=provenance.hardware(self.device),
            created_at=provenance.utc_now(),
            extra={**self._record_extra(), **dict(extra or {})},
        )
        del latents
        if recorder is not None:
            recorder.save(trajectory_path(out))
        atomic_write_json(out.with_suffix(".json"), record.model_dump(mode="json"))
        return record
