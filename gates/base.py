"""The gate interface: one small contract every gate implements, and the result file every gate writes.

A gate looks at one (baseline, candidate) clip pair and *reports*: scalar metrics with their direction declared,
per-frame series, artifacts, flags and errors. It never decides the release; the policy does (h3eval.verdict).

Every per-pair result is written to ``<run>/gates/<gate>/<candidate>/<prompt_id>-s<seed>.json`` with the same shape
(:class:`GateResult`), so the verdict, the dashboard and outside scripts read all gates alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from h3.schema import FINITE_NUMBERS

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
    """The model the run's clips were made with (``tiny-trained``, ``tiny-random``, ...) or its checkpoint path."""
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
    read_input: Callable[[str], Any] | None = None
    """The image input (keyframe, reference) a clip record names by sha256, decoded (h3.conditioning.ImageInput):
    the suite's reader of the run's ``inputs/``; raises with the file named when it is missing or altered."""


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
    """Where this gate writes (``<run>/gates/<gate>/``); per-pair results go to
    ``<candidate>/<prompt>-s<seed>.json``."""
    clips: list[RunClip]
    """Every clip of the run's recipes × prompts × seeds (baseline first), finished or not."""
    pairs: list[PairRef]


class UnknownGateError(KeyError):
    """No gate is registered under this name; the message lists the known ones."""


class GateInputError(ValueError):
    """The pair cannot be scored by this gate (mismatched shapes, no audio stream, missing weights, a bad option...).

    The message names the file, field or option; the runner writes it as the pair's ``error`` and scores the other
    pairs (a bad option is refused before the run starts).
    """


@dataclass(frozen=True)
class MetricSpec:
    """A metric a gate declares: its direction (torchmetrics' ``higher_is_better``) and unit."""

    higher_is_better: bool
    unit: str | None = None


class GateOptions(BaseModel):
    """A gate's options as a typed schema with its defaults: unknown names are errors (a typo must not silently run
    the defaults). Values arrive as text from the command line (``-o gate.key=value``) and are parsed (lax mode);
    ``nan`` and ``inf`` are refused for every number (h3/schema.py)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, **FINITE_NUMBERS)


class Gate:
    """Base class: subclasses set ``name``, ``needs``, ``metrics`` and ``Options``, and implement :meth:`evaluate`.

    - ``metrics``: every metric the gate can write, by name, with its declared direction and unit; the runner refuses
      a result whose metrics are not declared (or contradict the declaration), and the verdict checks a policy
      against it (:func:`h3eval.policy.registry_problems`).
    - ``Options``: the gate's option schema (a :class:`GateOptions`); ``option_names`` follows from it. The runner
      checks every chosen gate's options before anything runs; :meth:`parse_options` gives the gate its typed options.
    """

    name: ClassVar[str]
    needs: ClassVar[tuple[Need, ...]] = ("video",)
    description: ClassVar[str] = ""
    metrics: ClassVar[dict[str, MetricSpec]] = {}
    Options: ClassVar[type[GateOptions]] = GateOptions
    option_names: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.option_names = frozenset(cls.Options.model_fields)

    @classmethod
    def parse_options(cls, options: dict[str, Any]) -> GateOptions:
        """``options`` validated against :attr:`Options`; GateInputError names an unknown or malformed option."""
        unknown = sorted(set(options) - cls.option_names)
        if unknown:
            raise GateInputError(f"unknown {cls.name} option(s) {unknown}; known: {sorted(cls.option_names)}")
        try:
            return cls.Options.model_validate(dict(options))
        except ValidationError as exc:
            problems = "; ".join(f"option {'.'.join(str(p) for p in e['loc'])}={e.get('input')!r}: {e['msg']}"
                                 for e in exc.errors())
            raise GateInputError(f"{cls.name}: {problems}") from None

    @classmethod
    def declaration_problems(cls, result: "GateResult") -> list[str]:
        """How ``result`` departs from the metrics this gate declares (undeclared name, other direction or unit)."""
        problems = []
        for name, metric in result.metrics.items():
            spec = cls.metrics.get(name)
            if spec is None:
                problems.append(f"metric {name!r} is not declared (declared: {', '.join(sorted(cls.metrics))})")
            elif metric.higher_is_better != spec.higher_is_better or metric.unit != spec.unit:
                problems.append(f"metric {name!r} is written with higher_is_better={metric.higher_is_better}, "
                                f"unit={metric.unit!r} but declared with higher_is_better={spec.higher_is_better}, "
                                f"unit={spec.unit!r}")
        return problems

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
        raise UnknownGateError(f"unknown gate {name!r}; known gates: {', '.join(sorted(_REGISTRY)) or '(none)'}")
    return _REGISTRY[name]


def get_gate(name: str) -> Gate:
    """The gate registered under ``name``; unknown names fail with the list of known ones."""
    _import_builtin_gates()
    return gate_class(name)()


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
    "gates.reference_free",
    "gates.prompt_faithfulness",
    "gates.keyframe",
]


def _import_builtin_gates() -> None:
    import importlib

    for module in BUILTIN_GATE_MODULES:
        importlib.import_module(module)
