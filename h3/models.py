"""Model names: the tiny presets and their alias, the random presets, checkpoint directories; the default canvas and
the identity (``model_sha256``) each has, and where the tiny presets' checkpoints are.

``tiny`` (the default; ``tiny-trained`` is the same preset) is the trained preset (h3.tiny_trained): a checkpoint in the
Hugging Face layout of ``MiniMaxAI/MiniMax-H3`` shipped in the package (made by ``python -m h3.train``), which makes the
procedural world's shapes and sounds (issue 17). ``tiny-random`` is the random-weight preset (h3.tiny), built once from
its seed and saved in the same layout into a cache folder. Records name the preset that ran, never the alias: a runtime
loaded as ``tiny`` says ``tiny-trained`` (:func:`canonical_model`), so ``tiny`` in a record means the random preset of
older runs. The random presets (``h3-random``, ``h3-random-small``) are h3.random_model's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from h3.checkpoint import CheckpointError, check_checkpoint_dir, checkpoint_identity, save_components
from h3.request import FULL_DEFAULT_SIZE, TINY_DEFAULT_SIZE

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
