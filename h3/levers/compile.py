"""torch.compile of MiniMax-H3's DiT blocks, one region per block (regional compilation, as diffusers'
``compile_repeated_blocks``, which would also compile the two token-refiner blocks).

Only the DiT blocks: they hold all of the forward's work, and under the bucketing lever they see the bucket's length
only. The token refiner's blocks run on the prompt's text rows alone, whose count changes with every prompt, so
compiled they would recompile at every new prompt length (found on the CPU: 4 new graphs at the second length of a
bucket) while saving nothing measurable (2 blocks over tens of rows against 50 over tens of thousands).

Telemetry counts what dynamo really did: every graph the backend was handed (first compiles and recompiles alike,
counted by wrapping the backend) and dynamo's own recompile counter. Seed 001: a kernel compiled per exact token count
cost 12-14 s per new prompt length, so recompiles per request are what to watch in a server.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from h3.levers.base import ApplyContext, LeverConfig, LeverError, LeverHandle, counts, mark_applied, unmark_applied

if TYPE_CHECKING:
    from h3.record import Executed

logger = logging.getLogger(__name__)


class CompileConfig(LeverConfig):
    """Regional torch.compile of the DiT blocks, one region per block (recipe section ``[compile]``)."""

    name = "compile"
    signoff_kind = "near"  # the judge a change of this lever implies (h3.recipe.lever_differences)
    signoff_why = "torch.compile fuses kernels that round differently: the same sample up to rounding"

    enabled: bool = False
    backend: str = "inductor"
    mode: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None

    def is_on(self) -> bool:
        return self.enabled

    def apply(self, pipe, ctx: ApplyContext) -> "CompileHandle":
        # Last in the registry so that it traces the final modules. The levers' call counters hold inside the compiled
        # blocks (h3.levers.base.new_counter).
        return apply_compile(pipe.transformer, self)

    def check_telemetry(self, telemetry: dict[str, Any], executed: "Executed") -> list[str]:
        """The DiT blocks compiled as regions, with the configured backend."""
        (regions,), problems = counts(telemetry, "compiled_regions")
        if not problems and regions < 1:
            problems.append("no region was compiled")
        if telemetry.get("backend") != self.backend:
            problems.append(f"recipe asks for backend {self.backend!r}, the lever compiled with "
                            f"{telemetry.get('backend')!r}")
        return problems


COMPILED_BLOCKS = ("MiniMaxH3TransformerBlock",)


def _regions(transformer) -> list[torch.nn.Module]:
    return [m for m in transformer.modules() if m.__class__.__name__ in COMPILED_BLOCKS]


class CountingBackend:
    """A dynamo backend that counts the graphs it compiles and delegates to the configured backend."""

    def __init__(self, backend: str, mode: str | None):
        from torch._dynamo import lookup_backend

        self.name = backend
        self.inner = lookup_backend(backend)
        self.mode = mode
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        if self.mode is not None:
            from torch._inductor import compile_fx

            # `mode` is an inductor option set; torch.compile applies it the same way for a string backend.
            with torch._inductor.config.patch(torch._inductor.list_mode_options(self.mode)):
                return compile_fx.compile_fx(gm, example_inputs)
        return self.inner(gm, example_inputs)


def _recompiles() -> int:
    from torch._dynamo.utils import counters

    return int(sum(counters["recompiles"].values()))


class CompileHandle(LeverHandle):
    name = "compile"

    def __init__(self, transformer, config: CompileConfig, backend: CountingBackend, regions: int):
        super().__init__()
        self.transformer, self.config, self.backend, self.regions = transformer, config, backend, regions
        self._graphs_at_start = 0
        self._recompiles_at_start = _recompiles()
        self._recompiles_at_apply = self._recompiles_at_start

    def begin_request(self) -> None:
        self._graphs_at_start = self.backend.graphs
        self._recompiles_at_start = _recompiles()

    def telemetry(self) -> dict[str, Any]:
        return {
            "applied": not self.removed,
            "backend": self.config.backend,
            "dynamic": self.config.dynamic,
            "compiled_regions": self.regions,
            "graphs_compiled_total": self.backend.graphs,
            "graphs_compiled_this_request": self.backend.graphs - self._graphs_at_start,
            "recompiles_total": _recompiles() - self._recompiles_at_apply,
            "recompiles_this_request": _recompiles() - self._recompiles_at_start,
        }

    def _remove(self) -> None:
        for module in _regions(self.transformer):
            # nn.Module.compile set an instance attribute over the class's None: drop it, leave the module as loaded.
            module.__dict__.pop("_compiled_call_impl", None)
        unmark_applied(self.transformer, "compile")


_BACKENDS: dict[str, CountingBackend] = {}
"""One counting backend per compile config in this process. dynamo's compiled graphs live on the code they compiled
and are guarded on the backend object: applying the lever again with the same backend (a shared model switching back
to a compiled recipe) finds them, where a new backend would compile every graph again at the next request."""


def counting_backend(config: CompileConfig) -> CountingBackend:
    key = config.model_dump_json()
    if key not in _BACKENDS:
        _BACKENDS[key] = CountingBackend(config.backend, config.mode)
    return _BACKENDS[key]


def apply_compile(transformer, config: CompileConfig) -> CompileHandle:
    if config.mode is not None and config.backend != "inductor":
        raise LeverError(f"compile.mode {config.mode!r} is an inductor option; backend is {config.backend!r}")
    try:
        backend = counting_backend(config)
    except Exception as exc:  # dynamo raises InvalidBackend with the list of known ones
        raise LeverError(f"compile.backend {config.backend!r} is not available: {exc}") from exc
    regions = _regions(transformer)
    if not regions:
        raise LeverError(f"compile found no {'/'.join(COMPILED_BLOCKS)} in {type(transformer).__name__}")
    mark_applied(transformer, "compile")
    for module in regions:
        module.compile(backend=backend, fullgraph=config.fullgraph, dynamic=config.dynamic)
    return CompileHandle(transformer, config, backend, len(regions))
