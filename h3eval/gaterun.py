"""Run gates over every (baseline, candidate) pair of a run directory, resumably.

For each pair of ``RunStore.pairs()`` (in order) and each chosen gate, the result goes to
``<run>/gates/<gate>/<candidate>/<prompt_id>-s<seed>.json`` (a :class:`gates.base.GateResult`, written atomically)
and artifacts to the same folder. The loop is pair-major so that the gates of one pair share its decoded clips.

- **Resume**: a result file that parses, names the same gate and pair, is not an error and was computed from the
  same clips (actual MP4 sha256) and gate options (stamped in ``info["inputs"]``) is kept; errored pairs are tried
  again (a missing weight file may have been put in place since). ``force=True`` recomputes everything.
- **Identical pairs**: when both clip records have the same ``frames_sha256`` and ``pcm_sha256`` the generation was
  bit-identical, and any difference after decoding would be codec noise. A gate with an ``identical_result(ctx)``
  method answers without decoding the candidate (fidelity, audio: exactly zero difference, nothing decoded;
  reference_free, prompt_faithfulness: the baseline's clip scored for both sides); other gates are run as usual and
  their result is marked ``identical``. The integrity gate has no such method: a clip can be broken on both sides.
- **Options**: ``key=value`` goes to every chosen gate that knows ``key`` (each gate declares its option schema,
  ``Gate.Options``), ``gate.key=value`` to that gate only. An option no chosen gate knows, or a value its schema
  refuses, is an error before anything runs.
- **Metrics**: a result whose metrics are not among those the gate declares (``Gate.metrics``: name, direction,
  unit) is an error result: the verdict reads the declarations.
- **Side by side**: on a host of 2 cores or more the gates of a pair run in threads, one per core
  (``$H3EVAL_GATE_THREADS`` overrides: 1 runs them one after another), after both clips are decoded at once, on a
  GPU with one BLAS thread (:data:`SIDE_BY_SIDE_BLAS_THREADS`), and the next pairs' clips decode meanwhile
  (:func:`decode_ahead`, :func:`decode_ahead_pairs`); each
  gate's result is the same either way (tests/test_gaterun.py), only the wall time differs. A gate's first
  non-identical pair in a process runs one after another (its lazy imports and model loads, see ``_warm``), and
  identical pairs always do (they are cheap).
- **Bad input**: a missing or unfinished clip, an MP4 whose sha256 no longer matches its record, or a gate that
  raises gives that pair (and gate) a result with ``status="error"`` and the message; the other pairs are still
  scored, and the summary says the run failed so that the command exits non-zero.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


from gates.base import (GATE_RESULT_VERSION, ClipSide, Gate, GateInputError, GateResult, PairContext, PairRef,
                        RunClip, RunContext, RunInfo, get_gate)
from gates.common import blas_controller
from h3.atomic import atomic_write_json, sha256_file
from h3eval.store import (GateResultError, RecordError, RunManifest, RunStore, StoreError, clip_stem, read_clip_record,
                          read_gate_result)
# Options, device and thread settings (checked before a run starts) live in h3eval.gatesetup; importable from here.
from h3eval.gatesetup import (DECODE_AHEAD_ENV, DECODE_AHEAD_PAIRS, GATE_BLAS_THREADS_ENV, GATE_THREADS_ENV,
                              GATE_THREADS_MIN_CORES, SIDE_BY_SIDE_BLAS_THREADS, GateRunError, check_device,
                              check_options, decode_ahead_pairs, gate_workers, options_for, parse_options,
                              side_by_side_blas_threads)

__all__ = ["DECODE_AHEAD_ENV", "DECODE_AHEAD_PAIRS", "GATE_BLAS_THREADS_ENV", "GATE_THREADS_ENV",
           "GATE_THREADS_MIN_CORES", "INPUTS_KEY", "SECONDS_KEY", "SIDE_BY_SIDE_BLAS_THREADS", "ClipSides",
           "GateRunError", "GateRunSummary", "check_device", "check_options", "decode_ahead", "decode_ahead_pairs",
           "evaluate_pair", "gate_workers", "load_valid_result", "options_for", "parse_options", "result_path",
           "run_context", "run_gates", "run_info", "side_by_side_blas_threads"]

logger = logging.getLogger(__name__)


@dataclass
class GateRunSummary:
    """What a gate run did, per gate and overall."""

    run_dir: str
    gates: list[str]
    device: str
    pairs: int
    """Number of (candidate, prompt, seed) pairs in the run."""
    scored: dict[str, int] = field(default_factory=dict)
    """Gate -> results computed in this invocation (including errors)."""
    resumed: dict[str, int] = field(default_factory=dict)
    """Gate -> valid results found on disk and kept."""
    identical: dict[str, int] = field(default_factory=dict)
    flagged: dict[str, int] = field(default_factory=dict)
    not_applicable: dict[str, int] = field(default_factory=dict)
    not_applicable_reasons: dict[str, list[str]] = field(default_factory=dict)
    """Gate -> the distinct reasons its results gave for not applying (said once per gate, not per pair)."""
    errors: list[dict[str, Any]] = field(default_factory=list)
    """One entry per errored (gate, pair): gate, candidate, prompt_id, seed, error, path."""
    seconds: dict[str, list[float]] = field(default_factory=dict)
    """Gate -> the wall seconds of each result it computed in this invocation (``info["gate_s"]``, in pair order)."""

    @property
    def failed(self) -> bool:
        return bool(self.errors)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "failed": self.failed}


def result_path(store: RunStore, gate: str, candidate: str, prompt_id: str, seed: int,
                reference: str | None = None) -> Path:
    """Where the result of ``gate`` on one pair lives: against the baseline, the store's
    :meth:`~h3eval.store.RunStore.gate_result_path`; against a parent ``reference`` (a ladder's rung), its own folder
    (:func:`h3eval.verdict.lineage.result_dir`)."""
    if reference is None:
        return store.gate_result_path(gate, candidate, prompt_id, seed)
    from h3eval.verdict.lineage import result_dir

    return result_dir(store, gate, candidate, reference, None) / f"{clip_stem(prompt_id, seed)}.json"


def load_valid_result(path: Path, gate: str, pair: PairRef, inputs: dict[str, Any] | None = None) -> GateResult | None:
    """The result at ``path`` if it is a finished, non-error result of this gate and pair, made from ``inputs``
    (the clips' actual sha256 and the gate's options, see :func:`_inputs_stamp`) when given; else None."""
    if not path.is_file():
        return None
    try:
        result = read_gate_result(path)
    except GateResultError:
        logger.info("recomputing %s: unreadable result file", path)
        return None
    if result.version != GATE_RESULT_VERSION or result.gate != gate or result.pair != pair:
        return None
    if result.status == "error" or result.error is not None:
        return None
    if inputs is not None and result.info.get(INPUTS_KEY) != inputs:
        logger.info("recomputing %s: its clips or options changed since it was written", path)
        return None
    return result


INPUTS_KEY = "inputs"
"""``info`` key where the runner stamps what a result was computed from, so that resume notices a changed clip."""
SECONDS_KEY = "gate_s"
"""``info`` key of a computed result: the gate's wall seconds on that pair (its clips' decode included where the gate
was the first to ask for them; side by side, the time shared with the pair's other gates). Informative: a resumed
result keeps the figure of the run that computed it, and nothing decides on it."""


def _inputs_stamp(base_sha: str, cand_sha: str, options: dict[str, Any]) -> dict[str, Any]:
    return {
        "baseline_mp4_sha256": base_sha,
        "candidate_mp4_sha256": cand_sha,
        "options": {k: str(v) for k, v in sorted(options.items())},
    }


def run_info(manifest: RunManifest) -> RunInfo:
    """What a gate may know of the run (:class:`gates.base.RunInfo`), from its manifest."""
    return RunInfo(model=manifest.model, recipes=dict(manifest.recipes), baseline=manifest.baseline,
                   candidates=tuple(manifest.candidates),
                   prompt_ids=tuple(manifest.prompts.ids) if manifest.prompts else (), seeds=tuple(manifest.seeds))


def run_context(run_dir: str | Path, gate: str) -> RunContext:
    """What a whole-run gate needs (:class:`gates.base.RunContext`): every clip of the run's recipes (baseline first),
    finished or with why not, and every pair. Raises GateRunError when ``run_dir`` is not a run directory."""
    store = RunStore(run_dir)
    try:
        manifest = store.read_manifest()
    except StoreError as exc:
        raise GateRunError(str(exc)) from exc
    recipes = ([manifest.baseline] if manifest.baseline else []) + list(manifest.candidates)
    if not recipes:
        recipes = list(manifest.recipes)
    clips = []
    for recipe in recipes:
        for pid in (manifest.prompts.ids if manifest.prompts else []):
            for seed in manifest.seeds:
                record = store.read_record(recipe, pid, seed)
                if record is None:
                    clips.append(RunClip(recipe, pid, seed, None, store.unfinished_reason(recipe, pid, seed)))
                    continue
                side = ClipSide(recipe=recipe, mp4=store.clip_path(recipe, pid, seed),
                                record=record.model_dump(mode="json"))
                clips.append(RunClip(recipe, pid, seed, side))
    pairs = [PairRef(baseline=manifest.baseline, candidate=c, prompt_id=p, seed=s) for c, p, s in store.pairs()]
    return RunContext(run_dir=store.root, info=run_info(manifest), gate_dir=store.gate_dir(gate), clips=clips,
                      pairs=pairs)


class ClipSides:
    """Loads and checks the clips of a run once each (the baseline clip appears in every candidate's pairs)."""

    def __init__(self, store: RunStore):
        self.store = store
        self._hashes: dict[tuple[str, int, int], str] = {}

    def sha(self, path: Path) -> str:
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        if key not in self._hashes:
            self._hashes[key] = sha256_file(path)
        return self._hashes[key]

    def load(self, recipe: str, prompt_id: str, seed: int, side: str) -> ClipSide:
        """The clip side, or StoreError naming the file and what is wrong with it."""
        store = self.store
        record_path = store.record_path(recipe, prompt_id, seed)
        name = f"{side} clip {recipe}/{clip_stem(prompt_id, seed)}"
        try:
            record = read_clip_record(record_path, mp4=store.clip_path(recipe, prompt_id, seed), sha256=self.sha)
        except RecordError as exc:
            if exc.problem == "missing":
                error_path = store.error_path(recipe, prompt_id, seed)
                why = ""
                if error_path.is_file():
                    try:
                        why = f": generation failed: {json.loads(error_path.read_text()).get('error')}"
                    except (json.JSONDecodeError, OSError):
                        why = f" (see {error_path})"
                raise StoreError(f"{name} is not finished: {record_path} is missing{why}") from None
            raise StoreError(f"{name}: {exc}") from None
        return ClipSide(recipe=recipe, mp4=store.clip_path(recipe, prompt_id, seed),
                        record=record.model_dump(mode="json"))


def _error_result(gate: str, pair: PairRef, message: str) -> GateResult:
    return GateResult(gate=gate, pair=pair, error=message, status="error")


def _describe(exc: BaseException) -> str:
    from h3.media import MediaError

    # Our own errors already say what is wrong with which file; anything else is a bug or an unforeseen input,
    # so keep its type.
    if isinstance(exc, (GateInputError, MediaError, StoreError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def evaluate_pair(gate: Gate, ctx: PairContext, identical: bool) -> GateResult:
    """One gate on one pair; exceptions become the result's error."""
    try:
        shortcut = getattr(gate, "identical_result", None)
        if identical and callable(shortcut):
            result = shortcut(ctx)
        else:
            result = gate.evaluate(ctx)
            result.identical = result.identical or identical
    except Exception as exc:  # noqa: BLE001 - written into the result and counted as a failure, never dropped
        logger.warning("gate %s on %s/%s-s%s: %s", gate.name, ctx.pair.candidate, ctx.pair.prompt_id, ctx.pair.seed, exc)
        logger.debug("traceback", exc_info=True)
        return _error_result(gate.name, ctx.pair, _describe(exc))
    if result.gate != gate.name or result.pair != ctx.pair:
        return _error_result(gate.name, ctx.pair, f"gate {gate.name} returned a result for another gate or pair")
    broken = gate.declaration_problems(result)
    if broken:
        return _error_result(gate.name, ctx.pair, f"gate {gate.name} broke its declared metrics: " + "; ".join(broken))
    if result.error is not None:
        result.status = "error"
    return result


def run_gates(
    run_dir: str | Path,
    gate_names: list[str],
    device: str = "cpu",
    options: dict[str, Any] | None = None,
    force: bool = False,
    progress: bool = True,
    candidates: list[str] | None = None,
    pairing_gates: dict[tuple[str, str], set[str]] | None = None,
) -> GateRunSummary:
    """Run ``gate_names`` over every pair of the run at ``run_dir`` (only ``candidates``' pairs when given: a judge's
    gates need not run on candidates another judge decides); see the module docstring.

    Pairs: each candidate against the baseline, and a candidate whose recipe names another candidate as its parent
    against that parent too, with the same prompts and seeds (:func:`h3eval.verdict.lineage.pairings`: a ladder's rung
    is judged against the rung below). ``pairing_gates`` maps (reference, candidate) to the gates that comparison needs
    (:func:`h3eval.verdict.lineage.pairing_gates` reads them from a policy); a comparison it leaves out runs none.

    Raises KeyError (unknown gate, with the known ones) or GateRunError before anything is written (also when another
    process is writing into the run: the store's lock).
    """
    store = RunStore(run_dir)
    try:
        manifest = store.read_manifest()
    except StoreError as exc:
        raise GateRunError(str(exc)) from exc
    if manifest.baseline is None:
        raise GateRunError(f"{store.manifest_path}: the run has no baseline recipe, so it has no pairs to gate")
    if not gate_names:
        raise GateRunError("no gate chosen (--gates NAME,...)")
    gates = [get_gate(name) for name in dict.fromkeys(gate_names)]  # KeyError names the known gates
    device = check_device(device)
    gate_workers(1)  # a bad $H3EVAL_GATE_THREADS, $H3EVAL_GATE_BLAS_THREADS or $H3EVAL_DECODE_AHEAD is refused
    side_by_side_blas_threads(device)  # before anything runs
    decode_ahead_pairs()
    options = dict(options or {})
    check_options(gates, options)
    pairs = _pairs(manifest, pairing_gates, candidates)

    def gates_of(reference: str, candidate: str) -> list[Gate]:
        if pairing_gates is None:
            return gates
        return [gate for gate in gates if gate.name in pairing_gates.get((reference, candidate), ())]
    names = [g.name for g in gates]
    summary = GateRunSummary(
        run_dir=str(store.root), gates=names, device=device, pairs=len(pairs),
        scored=dict.fromkeys(names, 0), resumed=dict.fromkeys(names, 0), identical=dict.fromkeys(names, 0),
        flagged=dict.fromkeys(names, 0), not_applicable=dict.fromkeys(names, 0),
    )
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(store.lock("h3eval gate"))  # one process writes gate results into a run at a time
        except StoreError as exc:
            raise GateRunError(str(exc)) from None
        _gate_pairs(store, manifest, pairs, gates, gates_of, device, options, force, progress, summary)
    logger.info(
        "gates %s over %d pairs: %d computed, %d resumed, %d errors",
        ",".join(names), len(pairs), sum(summary.scored.values()), sum(summary.resumed.values()), len(summary.errors),
    )
    return summary


def _pairs(manifest: RunManifest, pairing_gates: dict[tuple[str, str], set[str]] | None,
           candidates: list[str] | None) -> list[tuple[str, str, str, int]]:
    """(reference, candidate, prompt_id, seed) of every comparison to gate, in order (:func:`run_gates`)."""
    from h3eval.verdict.lineage import pairings

    ids = manifest.prompts.ids if manifest.prompts else []
    pairs = [(ref, cand, pid, seed) for ref, cand in pairings(manifest) for pid in ids for seed in manifest.seeds
             if pairing_gates is None or pairing_gates.get((ref, cand))]
    if candidates is not None:
        unknown = sorted(set(candidates) - set(manifest.candidates))
        if unknown:
            raise GateRunError(f"{unknown} are not candidates of this run ({', '.join(manifest.candidates)})")
        pairs = [pair for pair in pairs if pair[1] in candidates]
    return pairs


def _gate_pairs(store: RunStore, manifest: RunManifest, pairs: list[tuple[str, str, str, int]], gates: list[Gate],
                gates_of, device: str, options: dict[str, Any], force: bool, progress: bool,
                summary: GateRunSummary) -> None:
    """The pairs one after another (a line each), the next pairs' clips decoding ahead while a pair's gates run
    (:func:`decode_ahead`); the clip cache is emptied at the end."""
    from gates import media_cache
    from h3eval.progress import PairSteps

    sides = ClipSides(store)
    info = run_info(manifest)
    ahead: dict[int, threading.Thread] = {}  # pair index -> the thread decoding its clips ahead
    try:
        with PairSteps("gates", len(pairs), enabled=progress) as bar:  # a line per pair (h3eval.progress)
            task = bar.add_task("", total=sum(len(gates_of(p[0], p[1])) for p in pairs))
            depth = decode_ahead_pairs()
            for index, (reference, candidate, prompt_id, seed) in enumerate(pairs):
                pair = PairRef(baseline=reference, candidate=candidate, prompt_id=prompt_id, seed=seed)
                pair_gates = gates_of(reference, candidate)
                bar.update(task, pair=f"{candidate}/{clip_stem(prompt_id, seed)}"
                           + (f" vs {reference}" if reference != manifest.baseline else ""), steps=len(pair_gates))

                def start_ahead(index: int = index) -> None:
                    # Called once this pair's own clips are decoded (so they do not share the cores with the next
                    # pairs' decodes): the next ``depth`` pairs' clips decode while its gates run.
                    if not decode_ahead(gates):
                        return
                    for later in range(index + 1, min(len(pairs), index + 1 + depth)):
                        if later not in ahead:
                            ahead[later] = _decode_ahead(store, pairs[later][0], pairs[later][1:], gates)

                try:
                    _run_pair(store, sides, pair_gates, pair, device, options, force, summary, bar, task, info,
                              start_ahead)
                finally:
                    if (thread := ahead.pop(index + 1, None)) is not None:
                        thread.join()  # the next pair's clips are in the cache (the later ones go on decoding)
    finally:
        for thread in ahead.values():
            thread.join()
        media_cache.clear()


def _run_pair(store, sides, gates, pair, device, options, force, summary, bar, task, info, start_ahead) -> None:
    side_error = None
    base = cand = None
    reference = None if pair.baseline == info.baseline else pair.baseline  # a ladder's rung against its parent
    try:
        base = sides.load(pair.baseline, pair.prompt_id, pair.seed, "baseline" if reference is None else "parent")
        cand = sides.load(pair.candidate, pair.prompt_id, pair.seed, "candidate")
    except StoreError as exc:
        side_error = str(exc)

    todo = []
    for gate in gates:
        path = result_path(store, gate.name, pair.candidate, pair.prompt_id, pair.seed, reference)
        gate_options = options_for(gate.name, options, gate.option_names)
        stamp = None if side_error else _inputs_stamp(sides.sha(base.mp4), sides.sha(cand.mp4), gate_options)
        kept = None if force or side_error else load_valid_result(path, gate.name, pair, stamp)
        if kept is not None:
            summary.resumed[gate.name] += 1
            _count(summary, gate.name, kept, path)
            bar.advance(task)
        else:
            todo.append((gate, path, gate_options, stamp))
    if not todo:
        return

    identical = (
        base is not None and cand is not None
        and bool(base.record.get("frames_sha256")) and bool(base.record.get("pcm_sha256"))
        and base.record.get("frames_sha256") == cand.record.get("frames_sha256")
        and base.record.get("pcm_sha256") == cand.record.get("pcm_sha256")
    )
    def score(gate: Gate, path: Path, gate_options: dict[str, Any], stamp: dict[str, Any] | None) -> GateResult:
        if side_error is not None:
            return _error_result(gate.name, pair, side_error)
        artifact_dir = path.parent
        artifact_dir.mkdir(parents=True, exist_ok=True)
        ctx = PairContext(
            run_dir=store.root, pair=pair, baseline=base, candidate=cand, artifact_dir=artifact_dir,
            device=device, options=gate_options, run=info, read_input=store.read_input,
        )
        began = time.perf_counter()
        result = evaluate_pair(gate, ctx, identical)
        result.info[INPUTS_KEY] = stamp
        result.info[SECONDS_KEY] = round(time.perf_counter() - began, 6)
        return result

    def keep(gate: Gate, path: Path, result: GateResult) -> None:
        atomic_write_json(path, result.model_dump(mode="json"))
        summary.scored[gate.name] += 1
        summary.seconds.setdefault(gate.name, []).append(float(result.info.get(SECONDS_KEY, 0.0)))
        _count(summary, gate.name, result, path)
        bar.advance(task)

    workers = gate_workers(len(todo)) if side_error is None and not identical else 1
    with _warm_lock:
        cold = [gate.name for gate, *_ in todo if gate.name not in _warm]
    if workers > 1 and not cold:
        # Side by side: both clips decoded at once first, then the gates in threads (their GPU work, OpenCV, numpy
        # and PyAV release the GIL); results are written and counted here, in the order the gates were asked for.
        from concurrent.futures import ThreadPoolExecutor

        from gates import media_cache

        bar.update(task, description=f"{len(todo)} gates {pair.candidate}/{clip_stem(pair.prompt_id, pair.seed)}")
        media_cache.prefetch([base.mp4, cand.mp4], {n for gate, *_ in todo for n in gate.needs})
        start_ahead()
        blas = side_by_side_blas_threads(device)
        limit = blas_controller().limit(limits=blas, user_api="blas") if blas else contextlib.nullcontext()
        with limit, ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gate") as pool:
            futures = [(gate, path, pool.submit(score, gate, path, gate_options, stamp))
                       for gate, path, gate_options, stamp in todo]
            for gate, path, future in futures:
                keep(gate, path, future.result())
        return
    start_ahead()
    for gate, path, gate_options, stamp in todo:
        bar.update(task, description=f"{gate.name} {pair.candidate}/{clip_stem(pair.prompt_id, pair.seed)}")
        keep(gate, path, score(gate, path, gate_options, stamp))
    if side_error is None and not identical:
        with _warm_lock:
            _warm.update(gate.name for gate, *_ in todo)
        blas_controller()  # built here, in the one thread running, once the gates' libraries are loaded (see _warm)


def decode_ahead(gates: list[Gate]) -> bool:
    """Whether the next pair's clips are decoded while this pair's gates run: where the gates run side by side
    (:func:`gate_workers`) and every one of them has scored a pair in this process (``_warm``: no lazy import in
    flight). A run's per-pair cost is then about the larger of one pair's decode and its gates, not their sum (on the
    H200 host a 5 s 768x1344 pair decoded in 0.9 s and its four gates, side by side, took 0.6 s more)."""
    if gate_workers(len(gates)) <= 1:
        return False
    with _warm_lock:
        return all(gate.name in _warm for gate in gates)


def _decode_ahead(store: RunStore, baseline: str, pair: tuple[str, str, int], gates: list[Gate]) -> threading.Thread:
    """Start decoding ``pair``'s two clips into the clip cache in a background thread (errors are left for the gates,
    which decode again and report them)."""
    from gates import media_cache

    candidate, prompt_id, seed = pair
    paths = [store.clip_path(baseline, prompt_id, seed), store.clip_path(candidate, prompt_id, seed)]
    needs = {n for gate in gates for n in gate.needs}
    thread = threading.Thread(target=media_cache.prefetch, args=(paths, needs), name="decode-ahead", daemon=True)
    thread.start()
    return thread


# Gates that have scored a non-identical pair in this process, one after another. Only those run side by side: a
# gate's first pair does its lazy imports and model loads, and a first import of an extension module (dlopen under
# the GIL) in one thread while another thread's threadpoolctl walks the loaded libraries (dl_iterate_phdr, calling
# back into Python) deadlocked the demo's floor (cv2's first import in fidelity against ghosting's BLAS limit).
_warm: set[str] = set()
_warm_lock = threading.Lock()


def _count(summary: GateRunSummary, gate: str, result: GateResult, path: Path) -> None:
    if result.identical:
        summary.identical[gate] += 1
    if result.flagged:
        summary.flagged[gate] += 1
    if result.status == "not_applicable":
        summary.not_applicable[gate] += 1
        reasons = summary.not_applicable_reasons.setdefault(gate, [])
        reason = result.info.get("reason") or "; ".join(result.info.get("not_applicable") or []) or result.error
        if reason and reason not in reasons:
            reasons.append(reason)
    if result.status == "error" or result.error is not None:
        summary.errors.append(
            dict(gate=gate, candidate=result.pair.candidate, prompt_id=result.pair.prompt_id, seed=result.pair.seed,
                 error=result.error, path=str(path))
        )
