"""What a gate run is told before it starts, and checked before anything is written: the gates' options
(``key=value`` to every chosen gate that knows ``key``, ``gate.key=value`` to one: :func:`parse_options`,
:func:`options_for`, :func:`check_options`), the device (:func:`check_device`), and from the environment how many
gates of a pair run side by side (:func:`gate_workers`), with how many BLAS threads (:func:`side_by_side_blas_threads`)
and how many pairs' clips decode ahead (:func:`decode_ahead_pairs`). A bad value is a :class:`GateRunError` naming it.
"""

from __future__ import annotations

from typing import Any, Iterable

from gates.base import Gate, GateInputError


class GateRunError(ValueError):
    """The gate run cannot start (not a run directory, no baseline, bad device or option)."""


def parse_options(items: Iterable[str]) -> dict[str, str]:
    """``k=v`` strings -> dict; a key may be scoped to one gate as ``gate.k``."""
    options: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise GateRunError(f"option {item!r} is not KEY=VALUE (or GATE.KEY=VALUE)")
        options[key.strip()] = value.strip()
    return options


def options_for(gate: str, options: dict[str, Any], known: frozenset[str] | None = None) -> dict[str, Any]:
    """The options one gate gets: unscoped ``key`` options it knows (``known``: its ``option_names``; all of them
    when None), overridden by those scoped ``gate.key`` to it. Options scoped to other gates are dropped."""
    resolved = {k: v for k, v in options.items() if "." not in k and (known is None or k in known)}
    prefix = f"{gate}."
    resolved.update({k[len(prefix) :]: v for k, v in options.items() if k.startswith(prefix)})
    return resolved


def check_options(gates: list[Gate], options: dict[str, Any]) -> None:
    """Fail before anything runs on an option no chosen gate knows, or a value a gate's option schema refuses.

    Every gate declares its options (``Gate.Options``). An unscoped ``key`` must be known to at least one chosen gate;
    a scoped ``gate.key`` for a chosen gate must be known to that gate. Scoped options of gates not chosen are
    ignored, so that one option set can serve several runs. Then each chosen gate's share is parsed by its schema.
    """
    declared = {g.name: g.option_names for g in gates}
    for key in options:
        name, dot, option = key.partition(".")
        if dot:
            if name in declared and option not in declared[name]:
                raise GateRunError(f"option {key!r}: gate {name} has no option {option!r}; "
                                   f"known: {sorted(declared[name])}")
        elif not any(key in known for known in declared.values()):
            everything = sorted(set().union(*declared.values())) if declared else []
            raise GateRunError(f"option {key!r} is not an option of the chosen gates ({', '.join(declared)}); "
                               f"known: {everything}")
    for gate in gates:
        try:
            gate.parse_options(options_for(gate.name, options, gate.option_names))
        except GateInputError as exc:
            raise GateRunError(str(exc)) from None


def check_device(device: str) -> str:
    import torch

    if device == "cpu":
        return device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise GateRunError(f"--device {device}: no CUDA device is available here (use --device cpu)")
        return device
    raise GateRunError(f"--device {device!r}: use cpu or cuda")


# -- threads and decode-ahead, from the environment ------------------------------------------------------------------
DECODE_AHEAD_ENV = "H3EVAL_DECODE_AHEAD"
"""Overrides :func:`decode_ahead_pairs` (0 to :data:`gates.media_cache.MAX_DECODE_AHEAD` pairs)."""
DECODE_AHEAD_PAIRS = 1
"""Pairs whose clips decode ahead by default. On the H200 host (16 cores), runs of 8 pairs of 5 s 768x1344 clips, one
call, in the order 1-2-1-2: one pair ahead 0.737-0.897 s a pair (10 warm runs), two pairs ahead 0.836-0.973 s
(bench/gates_speed/results/gpu_s16_s20/gates_speed_gpu_s20_p8_ahead{1,2}{,_b}.md): a second pair's decode competes with the current
pair's gates for the cores and the GIL more than it hides."""


def decode_ahead_pairs() -> int:
    """How many pairs' clips decode ahead while a pair's gates run (where :func:`decode_ahead` allows it):
    ``$H3EVAL_DECODE_AHEAD`` when set, else :data:`DECODE_AHEAD_PAIRS`."""
    from gates.media_cache import MAX_DECODE_AHEAD

    wanted = _env_threads(DECODE_AHEAD_ENV, 0, f"0 to {MAX_DECODE_AHEAD} pairs")
    if wanted is None:
        return DECODE_AHEAD_PAIRS
    if wanted > MAX_DECODE_AHEAD:
        raise GateRunError(f"${DECODE_AHEAD_ENV}={wanted}: 0 to {MAX_DECODE_AHEAD} pairs (the clip cache's bound)")
    return wanted


GATE_THREADS_ENV = "H3EVAL_GATE_THREADS"
"""Overrides :func:`gate_workers` (1: one gate after another; N: up to N gates of a pair side by side)."""
GATE_THREADS_MIN_CORES = 2
"""Cores from which the gates of a pair run side by side by default, one per core up to the number of gates (the
next pair's clips decoding meanwhile: :func:`decode_ahead`); on one core, one after another. On the 2-core CPU the
demo in a fresh process, twice each way, measured its gates 69 / 74 s one at a time against 53 / 50 s two at a time,
its floor 45 / 47 against 38 / 37 s (bench/demo_cpu/results/demo_cpu_s8_threads{1,2}{,_b}.md); on the H200 host (16 cores) a
5 s 768x1344 pair's four gates 1.5 s side by side (gates_speed_gpu_s8_side4.md). A gate's first non-identical pair in
a process still runs one after another (``_warm``: the lazy-import deadlock of session 7)."""


SIDE_BY_SIDE_BLAS_THREADS = 1
"""BLAS threads while a pair's gates run side by side on a GPU (their heavy work is on the GPU; the BLAS's products
are small); ``$H3EVAL_GATE_BLAS_THREADS`` overrides it, 0 leaving the BLAS as it is. With the BLAS's own threads, one
per core, the audio gate's mel projection and the ghosting gate's numpy steps kept the H200 host's 16 cores spinning:
with the limit a 5 s 768x1344 pair's four gates took 0.954 / 1.180 / 0.975 s a pair against 1.110 / 1.211 s without it
in between, CPU 5 s against 10-11 (bench/gates_speed/results/gpu_s16_s20/gates_speed_gpu_s16C_default.md, one call). On the CPU device the
BLAS is left as it is: on the 2-core VM the limit measured no gain (13.1 / 16.1 s a pair against 12.0 / 13.5 s
without it, bench/gates_speed/results/cpu/gates_speed_cpu_s16_*.md: limit / nolimit). The limit is restored when the pair's gates
end."""
GATE_BLAS_THREADS_ENV = "H3EVAL_GATE_BLAS_THREADS"


def side_by_side_blas_threads(device: str) -> int:
    """BLAS threads for a pair's gates side by side on ``device`` (0: no limit): ``$H3EVAL_GATE_BLAS_THREADS`` when
    set, else :data:`SIDE_BY_SIDE_BLAS_THREADS` on a CUDA device and no limit on the CPU."""
    wanted = _env_threads(GATE_BLAS_THREADS_ENV, 0, "0 (no limit) or more")
    if wanted is None:
        return SIDE_BY_SIDE_BLAS_THREADS if str(device).startswith("cuda") else 0
    return wanted


def gate_workers(n_gates: int) -> int:
    """How many gates of one pair run at once: ``$H3EVAL_GATE_THREADS`` when set, else one per core up to the number
    of gates on a host of :data:`GATE_THREADS_MIN_CORES` cores or more, else 1."""
    import os

    wanted = _env_threads(GATE_THREADS_ENV, 1, "at least 1 thread")
    if wanted is None:
        cores = os.cpu_count() or 1
        wanted = cores if cores >= GATE_THREADS_MIN_CORES else 1
    return max(1, min(wanted, n_gates))


def _env_threads(name: str, least: int, rule: str) -> int | None:
    """The whole number of threads in ``$name`` (None when unset); a value that is not one, or under ``least``, is
    refused naming the variable."""
    import os

    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        wanted = int(raw)
    except ValueError:
        raise GateRunError(f"${name}={raw!r} is not a whole number of threads") from None
    if wanted < least:
        raise GateRunError(f"${name}={raw!r}: {rule}")
    return wanted
