"""Parallel: one request on N ranks. The DiT runs sequence-parallel through diffusers' context-parallel engine
(``ModelMixin.enable_parallelism`` with a ``ContextParallelConfig``: MiniMax-H3's own ``_cp_plan`` shards the packed
sequence and its rotary table at the first block and gathers at the output heads; attention exchanges through
Ulysses all-to-all, ring, or ``ulysses_anything`` for lengths the degree does not divide); the video VAE decodes its
spatiotemporal tiles in parallel (h3/parallel/vae_tiles.py); the text encoder is replicated.

Seed 000: SP2/SP4/SP8 with Qwen3-VL TP and VAE tile parallelism took the final recipe from 72.4 s on one RTX 5090 to
12.5 s on eight (DiT 6.43x, VAE 6.42x, Qwen3-VL 8.98x).

The degree is a number: any N the world has ranks for. ``ulysses_anything`` (the default) takes any packed length
and any head count diffusers can pad (uneven shards, sizes exchanged per call); ``ulysses`` needs N to divide the
head count (56 at full size) and every packed length (bucketing with a multiple of N guarantees it; a request that
does not divide is refused before its first collective); ``ring`` keeps the heads whole and needs an attention
backend that returns the log-sum-exp its merge uses.

What composes, and what is refused at preflight (:meth:`ParallelConfig.composition_problems`):

- **composes**: LoRA (weights), AdaLN precompute (per-row table lookups, the indices sharded by the plan), INT8/FP8
  quantization (per-output-channel weight scales and per-*token* activation scales: a row's arithmetic does not
  depend on which rank holds it), Sage / flash / cuDNN / native SDPA (diffusers registers them as context-parallel
  backends), torch.compile (the attention call is a graph break already, so the exchanges run eagerly between the
  compiled pieces), bucketing (the padding rows are cut out per shard, h3/parallel/attention.py), block-sparse
  attention under Ulysses (routing is per head over the whole sequence, which Ulysses gives each rank), the VAE
  lever, group offload (its hooks and the plan's split hooks sit on the same blocks and do not interact).
- **refused**: step caches (FirstBlockCache, MagCache, TaylorSeer decide to skip a step from a norm of the rank's
  *own* rows: ranks may disagree, one skips a step whose collectives the others wait in, and the request deadlocks
  or diverges); block-sparse attention with ``ring`` (top-k routing needs a head's whole key set, ring never gathers
  it); ``ring`` with a backend that returns no log-sum-exp (native SDPA, flex, math, efficient: diffusers' ring merge
  needs it; on the CPU no backend does, so ring is a GPU kind); plain ``ulysses`` with a bucket the degree does not
  divide; a backend diffusers does not run under context parallelism; a tensor-parallel text encoder (below).

Text encoder: replicated. transformers 5.24's Qwen3-VL plan (``base_model_tp_plan``) shards only the token
embedding, so its tensor parallelism would not split the layers' work, and a home-made plan is what the project
does not write; at degree 2 text encoding is ~1 % of the request (seed 000: 0.956 s of 72.4 s). ``text_encoder =
"tensor_parallel"`` is refused with that reason.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field

from h3.levers.base import ApplyContext, LeverConfig, LeverError, LeverHandle, mark_applied, unmark_applied

if TYPE_CHECKING:
    from h3.record import Executed

logger = logging.getLogger(__name__)

KINDS = ("ulysses", "ring", "ulysses_anything")
# Backends whose diffusers forward op returns the log-sum-exp that ring attention's merge needs (all CUDA-only).
LSE_BACKENDS = ("_native_flash", "_native_cudnn", "flash", "sage", "_flash_3")


class ParallelConfig(LeverConfig):
    """One request on several ranks (recipe section ``[parallel]``): sequence-parallel DiT through diffusers' context
    parallelism, tile-parallel video VAE decode, replicated text encoder. Degree 1 (the default) is one process."""

    name = "parallel"
    signoff_kind = "near"  # the judge a change of this lever implies (h3.recipe.lever_differences)
    signoff_why = "sequence parallelism across ranks: the same sample up to split reductions' rounding"
    omitted_when_default = True  # added after recipes were hashed: a single-process recipe keeps its hash

    degree: int = Field(default=1, ge=1)
    """Ranks of one request (``h3 generate/serve --nproc N`` sets it); any N the work divides."""
    kind: Literal["ulysses", "ring", "ulysses_anything"] = "ulysses_anything"
    """``ulysses_anything`` (the default): Ulysses all-to-all for any packed length and head count (uneven shards);
    ``ulysses``: equal shards only, so every packed length must divide by the degree (bucketing with a multiple of
    it), a request that does not is refused; ``ring``: keys passed around the ranks, for an attention backend that
    returns the log-sum-exp (all CUDA)."""
    vae: Literal["tiles", "replicated"] = "tiles"
    """``tiles``: the video VAE's spatiotemporal tiles scattered over the ranks and gathered (seed 000);
    ``replicated``: every rank decodes the whole video."""
    text_encoder: Literal["replicated", "tensor_parallel"] = "replicated"
    """Every rank encodes the prompt; ``tensor_parallel`` is refused (see the module docstring)."""

    def is_on(self) -> bool:
        return self.degree > 1

    def composition_problems(self, recipe) -> list[str]:
        """Why ``recipe``'s other levers cannot run at this degree (empty: they compose). Checked before weights
        load."""
        if not self.is_on():
            return []
        problems = []
        backend = recipe.attention.backend
        if recipe.cache.kind != "none":
            problems.append(f"cache.kind = {recipe.cache.kind!r} does not compose with parallel.degree = "
                            f"{self.degree}: a step cache decides to skip a step from a norm of the rank's own rows, "
                            "ranks can disagree, and one rank then waits in collectives of a step the others skipped")
        if self.kind == "ring" and recipe.sparse_attention.enabled:
            problems.append("sparse_attention does not compose with parallel.kind = 'ring': top-k block routing needs "
                            "a head's whole key set, which ring attention never gathers (use 'ulysses')")
        if self.kind == "ring" and backend not in LSE_BACKENDS:
            problems.append(f"parallel.kind = 'ring' needs an attention backend that returns the log-sum-exp "
                            f"diffusers' ring merge uses ({', '.join(LSE_BACKENDS)}; all CUDA); attention.backend is "
                            f"{backend!r}")
        if backend not in _cp_backends():
            problems.append(f"attention.backend = {backend!r} does not run under diffusers' context parallelism (it "
                            f"runs: {', '.join(sorted(b for b in _cp_backends() if not b.endswith('hub')))})")
        if self.kind in ("ulysses", "ring") and recipe.bucketing.enabled and recipe.bucketing.multiple % self.degree:
            problems.append(f"bucketing.multiple = {recipe.bucketing.multiple} is not a multiple of parallel.degree = "
                            f"{self.degree}: a padded length would not split into equal shards (choose a multiple of "
                            f"{self.degree}, or parallel.kind = 'ulysses_anything')")
        if self.text_encoder == "tensor_parallel":
            problems.append("parallel.text_encoder = 'tensor_parallel' is not available: transformers' Qwen3-VL "
                            "tensor-parallel plan shards only the token embedding (no layer work is split), and the "
                            "text encoder is ~1% of a request at degree 2 (seed 000); use 'replicated'")
        return problems

    def shared_problems(self) -> list[str]:
        return [f"parallel: a recipe at degree {self.degree} runs on its own {self.degree} ranks (h3 generate/serve "
                f"--nproc {self.degree}), so it cannot take turns on a shared model"]

    def apply(self, pipe, ctx: ApplyContext) -> "ParallelHandle":
        return apply_parallel(pipe, self)

    def check_executed(self, telemetry: dict[str, Any] | None, executed: "Executed") -> list[str]:
        """The degree (ranks, one device each), the kind, the VAE tiles on every rank, the text encoder,
        communication timed per step, and no planted bug. Empty: it ran as configured."""
        applied = isinstance(telemetry, dict) and telemetry.get("applied") is True
        if not self.is_on():
            return [f"parallel: degree 1 configured, but the request ran on {telemetry.get('world_size')} ranks"] \
                if applied else []
        degree = self.degree
        if not applied:
            return [f"parallel: degree {degree} configured, but the request ran in one process"]
        problems = []
        devices = telemetry.get("devices") or []
        if telemetry.get("degree") != degree or telemetry.get("world_size") != degree or len(devices) != degree:
            problems.append(f"degree {degree} configured, ran at {telemetry.get('degree')} on "
                            f"{telemetry.get('world_size')} ranks with devices {devices}")
        gpus = [d for d in devices if str(d).startswith("cuda")]
        if gpus and len(set(gpus)) != len(gpus):
            problems.append(f"ranks shared a GPU: {devices}")
        for key in ("kind", "vae", "text_encoder"):
            wanted = getattr(self, key)
            if telemetry.get(key) != wanted:
                problems.append(f"{key} {wanted!r} configured, ran {telemetry.get(key)!r}")
        if not telemetry.get("comm_s_per_step"):
            problems.append("no communication was timed: the denoising steps did not run through the parallel engine")
        ranks = telemetry.get("ranks") or []
        if len(ranks) != degree:
            problems.append(f"{len(ranks)} ranks reported their anatomy, {degree} configured")
        elif telemetry.get("vae") == "tiles":
            tasks = [(r.get("vae") or {}) for r in ranks]
            if any(not t.get("tasks") for t in tasks) or \
                    sum(t.get("tasks_this_rank", 0) for t in tasks) != tasks[0].get("tasks"):
                problems.append(f"VAE tiles configured, the ranks decoded {[t.get('tasks_this_rank') for t in tasks]} "
                                f"of {tasks[0].get('tasks')} tiles")
        if telemetry.get("planted_bug"):
            problems.append(f"{PLANTED_BUG_RAN} ({telemetry['planted_bug']}): a test of the parallel check, not a run")
        return [f"parallel: {p}" for p in problems]


PLANTED_BUG_RAN = "a planted bug ran"
"""How :meth:`ParallelConfig.check_executed` names a planted bug (the parallel check expects it on a planted run)."""


def at_degree(recipe, degree: int):
    """``recipe`` run on ``degree`` ranks (``--nproc``), its other levers unchanged."""
    return recipe.model_copy(update={"parallel": recipe.parallel.model_copy(update={"degree": int(degree)})})


def _cp_backends() -> set[str]:
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    return set(_AttentionBackendRegistry._supports_context_parallel)


def _resolve_on_cpu(transformer, world):
    """diffusers' ``_resolve_parallel_config`` derives the device as ``rank % torch.accelerator.device_count()``,
    which divides by zero on a CPU-only machine; on the CPU the runtime's device is the CPU, and the mesh is given."""
    from diffusers.models._modeling_parallel import ContextParallelConfig
    from diffusers.models._modeling_parallel import ParallelConfig as DiffusersParallelConfig

    def resolve(config):
        if isinstance(config, ContextParallelConfig):
            config = DiffusersParallelConfig(context_parallel_config=config)
        config.setup(world.rank, world.world_size, torch.device("cpu"), mesh=config.context_parallel_config.mesh)
        transformer._parallel_config = config
        return config

    return resolve


class ParallelHandle(LeverHandle):
    name = "parallel"

    def __init__(self, pipe, config: ParallelConfig, world, parallel_config, devices, vae_decode, comm, plant,
                 removers):
        super().__init__()
        self.pipe, self.config, self.world = pipe, config, world
        self.parallel_config = parallel_config
        self.devices = devices
        self.vae_decode, self.comm, self.plant = vae_decode, comm, plant
        self._removers = removers
        self.comm_per_step: list[float] = []
        self.ranks: list[dict[str, Any]] | None = None
        self._hook = pipe.transformer.register_forward_hook(self._step_done, always_call=True)

    @property
    def writes_output(self) -> bool:
        """Rank 0 writes the files; the other ranks follow."""
        return self.world.is_writer

    def _step_done(self, *_):
        self.comm_per_step.append(self.comm.collect())

    def begin_request(self) -> None:
        self.comm.collect()
        self.comm_per_step = []
        self.ranks = None
        if self.vae_decode is not None:
            self.vae_decode.last = {}

    def finish_request(self, clock) -> None:
        """Gather every rank's anatomy of the pipeline to rank 0 (a collective: every rank calls it once per
        request, right after the pipeline returns)."""
        import torch.distributed as dist

        from h3.parallel.world import control_group

        mine = {
            "rank": self.world.rank, "device": str(self.world.device),
            "text_encode_s": clock.total("text_encode"), "denoise_steps_s": clock.each("denoise_step"),
            "video_decode_s": clock.total("video_decode"), "audio_decode_s": clock.total("audio_decode"),
            "comm_s_per_step": list(self.comm_per_step),
            "vae": dict(self.vae_decode.last) if self.vae_decode is not None else None,
        }
        gathered = [None] * self.world.world_size if self.writes_output else None
        dist.gather_object(mine, gathered, dst=0, group=control_group())
        self.ranks = gathered

    def telemetry(self) -> dict[str, Any]:
        cp = self.parallel_config.context_parallel_config
        return {
            "applied": not self.removed,
            "degree": self.config.degree,
            "kind": self.config.kind,
            "world_size": self.world.world_size,
            "ulysses_degree": cp.ulysses_degree,
            "ring_degree": cp.ring_degree,
            "backend": self.world.backend,
            "devices": self.devices,
            "vae": self.config.vae,
            "text_encoder": self.config.text_encoder,
            "comm_s_per_step": list(self.comm_per_step),
            "ranks": self.ranks,
            "planted_bug": self.plant,
        }

    def _remove(self) -> None:
        self._hook.remove()
        for remover in reversed(self._removers):
            remover()
        unmark_applied(self.pipe.transformer, "parallel")


def apply_parallel(pipe, config: ParallelConfig) -> "ParallelHandle":
    """Make ``pipe`` one rank of a degree-``config.degree`` runtime. The process must be a rank of a world of that
    size (h3.parallel.world.init_world, which ``--nproc`` runs)."""
    import torch.distributed as dist
    from diffusers.hooks.context_parallel import remove_context_parallel
    from diffusers.models._modeling_parallel import ContextParallelConfig
    from torch.distributed.device_mesh import init_device_mesh

    from h3.parallel.comm import CommTimer, install_gloo_uneven_gather
    from h3.parallel.plants import install_plant, requested_plant
    from h3.parallel.vae_tiles import TileParallelDecode
    from h3.parallel.world import control_group, current_world

    degree, kind = config.degree, config.kind
    if kind not in KINDS:
        raise LeverError(f"parallel.kind {kind!r} is not one of {', '.join(KINDS)}")
    world = current_world()
    if world is None or world.world_size != degree:
        have = "a single process" if world is None else f"one of {world.world_size} ranks"
        raise LeverError(f"the recipe runs at parallel.degree = {degree}, but this runtime is {have}: start it with "
                         f"--nproc {degree}")
    transformer = pipe.transformer
    heads = int(transformer.config.num_attention_heads)
    if kind == "ulysses" and heads % degree:
        raise LeverError(f"parallel.kind = 'ulysses' splits the {heads} attention heads over the ranks; {degree} does "
                         "not divide them (use 'ulysses_anything' or 'ring')")
    if kind == "ulysses_anything" and heads % degree:
        pad = degree - heads % degree
        if pad >= (heads + pad) // degree:
            raise LeverError(f"ulysses_anything pads {heads} heads to a multiple of {degree} and needs the padding "
                             f"({pad}) below the heads per rank ({(heads + pad) // degree}); use fewer ranks")
    device_type = world.device.type
    mark_applied(transformer, "parallel")
    removers = []
    try:
        ring = degree if kind == "ring" else 1
        ulysses = 1 if kind == "ring" else degree
        mesh = init_device_mesh(device_type, (ring, ulysses), mesh_dim_names=("ring", "ulysses"))
        cp = ContextParallelConfig(ring_degree=ring, ulysses_degree=ulysses,
                                   ulysses_anything=kind == "ulysses_anything", mesh=mesh)
        if device_type == "cpu":
            transformer._resolve_parallel_config = _resolve_on_cpu(transformer, world)
        try:
            transformer.enable_parallelism(config=cp)
        except (ValueError, RuntimeError) as exc:
            raise LeverError(f"diffusers refused context parallelism: {exc}") from exc
        finally:
            transformer.__dict__.pop("_resolve_parallel_config", None)
        parallel_config = transformer._parallel_config

        def undo_cp():
            remove_context_parallel(transformer, transformer._cp_plan)
            for module in transformer.modules():
                processor = getattr(module, "processor", None)
                if processor is not None and getattr(processor, "_parallel_config", None) is parallel_config:
                    processor._parallel_config = None
            transformer._parallel_config = None

        removers.append(undo_cp)
        if kind != "ulysses_anything":
            hook = transformer.register_forward_pre_hook(_divisible(degree, kind), with_kwargs=True)
            removers.append(hook.remove)
        if device_type == "cpu":
            removers.append(install_gloo_uneven_gather())
        comm = CommTimer(world.device).install()
        removers.append(comm.remove)
        vae_decode = None
        if config.vae == "tiles":
            vae_decode = TileParallelDecode(pipe.vae)
            removers.append(vae_decode.remove)
        elif config.vae != "replicated":
            raise LeverError(f"parallel.vae {config.vae!r} is not 'tiles' or 'replicated'")
        plant = requested_plant()
        if plant == "a2a_permutation" and kind == "ring":
            raise LeverError("the a2a_permutation plant breaks the Ulysses exchange, which ring attention does not use "
                             "(plant rope_offset there)")
        if plant is not None:
            logger.warning("rank %d: PLANTED BUG %r is active (a test of the parallel check)", world.rank, plant)
            removers.append(install_plant(plant, transformer, world.world_size, world.rank))
        devices = [None] * world.world_size
        dist.all_gather_object(devices, str(world.device), group=control_group())
    except BaseException:
        for remover in reversed(removers):
            remover()
        unmark_applied(transformer, "parallel")
        raise
    logger.info("rank %d: %s degree %d on %s", world.rank, kind, degree, devices)
    return ParallelHandle(pipe, config, world, parallel_config, devices, vae_decode, comm, plant, removers)


def _divisible(degree: int, kind: str):
    def check(_module, args, kwargs):
        position_ids = kwargs.get("position_ids")
        if position_ids is not None and position_ids.shape[0] % degree:
            raise LeverError(
                f"parallel.kind = {kind!r} splits the packed sequence into {degree} equal shards; this request's "
                f"{position_ids.shape[0]} rows do not divide (switch bucketing on with a multiple of {degree}, or use "
                "parallel.kind = 'ulysses_anything')")
        return args, kwargs

    return check
