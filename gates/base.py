"""The gate interface: one small contract every gate implements, and the result file every gate writes.

A gate looks at one (baseline, candidate) clip pair and *reports*: scalar metrics with their direction declared,
per-frame series, artifacts, flags and errors. It never decides the release; the policy does (h3eval.verdict).

Every per-pair result is written to ``<run>/gates/<gate>/<candidate>/<prompt_id>-s<seed>.json`` with the same shape
(:class:`GateResult`), so the verdict, the dashboard and outside scripts read all gates alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

GATE_RESULT_VERSION = 1

Need = Literal["video", "audio", "latents", "runtime"]


class Metric(BaseModel):
    """One scalar with its declared semantics. ``value`` is None when it could not be computed (never zero-filled)."""

    model_config = ConfigDict(extra="forbid")
    value: float | None
    higher_is_better: bool
    unit: str | None = None


class PairRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    baseline: str
    """Recipe name of the baseline side."""
    candidate: str
    """Recipe name of the candidate side."""
    prompt_id: str
    seed: int


class GateResult(BaseModel):
    """The per-pair result of one gate. Same shape for every gate."""

    model_config = ConfigDict(extra="forbid")
    version: int = GATE_RESULT_VERSION
    gate: str
    pair: PairRef
    metrics: dict[str, Metric] = Field(default_factory=dict)
    """Metric name -> value with direction."""
    series: dict[str, list[float | None]] = Field(default_factory=dict)
    """Per-frame (or per-step) series, e.g. ``lpips`` per frame, for plots."""
    flagged: bool = False
    flags: list[str] = Field(default_factory=list)
    """Human-readable reasons the gate flagged the pair."""
    artifacts: list[str] = Field(default_factory=list)
    """Paths of artifacts (PNG heatmaps, strips), relative to the run directory."""
    identical: bool = False
    """True when the pair was short-circuited as bit-identical (raw-frame and PCM hashes equal)."""
    error: str | None = None
    """None, or why the gate could not score this pair (the metrics are then absent or None)."""
    info: dict[str, Any] = Field(default_factory=dict)
    """Gate-specific details (thresholds used, frame indices, versions)."""
    status: Literal["ok", "not_applicable", "error"] = "ok"
    """``not_applicable``: the gate cannot judge this pair here (e.g. a GPU-only op on the CPU), which is never a pass."""


@dataclass
class ClipSide:
    """One side of a pair as a gate sees it: the clip file, its record (a dict) and decoded media on demand."""

    recipe: str
    mp4: Path
    record: dict[str, Any]


@dataclass(frozen=True)
class RunInfo:
    """What a gate may know of the run beyond one pair, handed over by the suite (from the run's manifest): gates
    never open the suite's run store."""

    model: str = ""
    """``tiny`` or the checkpoint path the run's clips were made with."""
    recipes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Recipe name -> the recipe as resolved (every lever explicit)."""
    baseline: str | None = None
    candidates: tuple[str, ...] = ()
    prompt_ids: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()


@dataclass
class PairContext:
    """Everything a gate may need for one pair."""

    run_dir: Path
    pair: PairRef
    baseline: ClipSide
    candidate: ClipSide
    artifact_dir: Path
    """Where this gate writes artifacts for this pair (exists); store paths relative to ``run_dir``."""
    device: str = "cpu"
    options: dict[str, Any] = field(default_factory=dict)
    run: RunInfo = field(default_factory=RunInfo)


@dataclass
class RunClip:
    """One clip a whole-run gate is asked to score: the finished clip, or why there is none."""

    recipe: str
    prompt_id: str
    seed: int
    side: ClipSide | None
    """The finished clip (its record parses and matches the MP4's sha256); None when it is missing."""
    missing: str | None = None
    """Why there is no finished clip (not generated, generation failed with the reason, ...)."""


@dataclass
class RunContext:
    """Everything a gate that scores a whole run at once needs (VBench loads each model once per run)."""

    run_dir: Path
    info: RunInfo
    gate_dir: Path
    """Where this gate writes (``<run>/gates/<gate>/``); per-pair results go to ``<candidate>/<prompt>-s<seed>.json``."""
    clips: list[RunClip]
    """Every clip of the run's recipes × prompts × seeds (baseline first), finished or not."""
    pairs: list[PairRef]


class Gate:
    """Base class: subclasses set ``name``, ``needs`` and implement :meth:`evaluate`."""

    name: ClassVar[str]
    needs: ClassVar[tuple[Need, ...]] = ("video",)
    description: ClassVar[str] = ""

    def evaluate(self, ctx: PairContext) -> GateResult:  # pragma: no cover - interface
        raise NotImplementedError


_REGISTRY: dict[str, type[Gate]] = {}


def register_gate(cls: type[Gate]) -> type[Gate]:
    """Class decorator: make a gate known by its ``name``. Registering a name twice is an error."""
    if not getattr(cls, "name", None):
        raise TypeError(f"{cls.__name__} has no `name`")
    if cls.name in _REGISTRY:
        raise ValueError(f"gate {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    return cls


def known_gates() -> list[str]:
    _import_builtin_gates()
    return sorted(_REGISTRY)


def gate_class(name: str) -> type[Gate]:
    """The class registered under ``name`` (not instantiated: a gate's constructor may load weights)."""
    _import_builtin_gates()
    if name not in _REGISTRY:
        raise KeyError(f"unknown gate {name!r}; known gates: {', '.join(sorted(_REGISTRY)) or '(none)'}")
    return _REGISTRY[name]


def get_gate(name: str) -> Gate:
    """The gate registered under ``name``; unknown names fail with the list of known ones."""
    _import_builtin_gates()
    if name not in _REGISTRY:
        raise KeyError(f"unknown gate {name!r}; known gates: {', '.join(sorted(_REGISTRY)) or '(none)'}")
    return _REGISTRY[name]()


# Gate modules register themselves on import; listed here so that `get_gate` finds them without the caller
# importing each one. One module per gate.
BUILTIN_GATE_MODULES: list[str] = [
    "gates.integrity",
    "gates.fidelity",
    "gates.audio",
    "gates.trajectory",
    "gates.vbench",
    "gates.opcheck",
    "gates.ghosting",
]


def _import_builtin_gates() -> None:
    import importlib

    for module in BUILTIN_GATE_MODULES:
        importlib.import_module(module)
