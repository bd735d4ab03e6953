"""The ``folder`` backend: clips made by another stack (LightX2V, ComfyUI, SGLang...) brought into a run.

Clips are paired by name, ``<prompt_id>-s<seed>.mp4`` in the baseline and each candidate folder, or by a manifest
(JSONL). A manifest holds two kinds of line:

- a **clip line**, one per clip: ``side`` ("baseline" or the candidate's name), ``file``, ``prompt_id``, ``seed``,
  optional ``prompt``, ``generation_side_latency_s``, ``request_to_file_latency_s``, ``peak_memory_mb`` and
  ``sglang_perf_dump`` (the JSON that SGLang's ``--perf-dump-path`` wrote for that request: its
  ``total_duration_ms``, the pipeline's wall time without saving the file, is the clip's generation-side latency);
- a **side line** (no ``file``): ``side`` and any of ``kind`` (the candidate's signoff kind: exact, near or
  resample), ``parent`` (the recipe it is judged against by lineage: the baseline or another candidate) and
  ``timings`` (a timing file for that side, below).

Every path in a manifest (``file``, ``timings``, ``sglang_perf_dump``) is relative to the manifest and stays inside
its folder: an absolute path or one with a ``..`` part is refused (a manifest names its own clips, not files
elsewhere on the machine). The manifest is strict: a seed is an integer and never a boolean, a number is finite and
positive, an unknown key is an error, each named with its line; a manifest that names no clip is an error.

Declarations on the command line do the same for folders paired by name: ``--kind NAME=KIND``, ``--parent
NAME=PARENT`` and ``--timings NAME=FILE`` (NAME as in ``--candidate-dir NAME=DIR``; ``--timings`` also takes the
baseline's name). A **timing file** is a JSON object from clip (``<prompt_id>-s<seed>``, with or without ``.mp4``) to
its generation-side latency in seconds, or to an object with ``generation_side_latency_s`` and/or
``request_to_file_latency_s``; every number finite, above 0 and at most :data:`MAX_LATENCY_S`. The kind goes into
the run's resolved recipe as ``[signoff] kind`` and the parent as its top-level ``parent``, where the verdict reads
them for recipes made here. Declarations given to a rerun replace those on disk (the clips are kept); those not given
are kept. Without any timing, the speed check says so and judges nothing.

Each clip is decoded (frames and PCM hashed, ``extra["hash_source"] = "decoded"``) and copied atomically into
``clips/<recipe>/``. A candidate clip with no baseline partner, or whose shape, fps or duration differs from its
partner's, is not imported: it becomes a clear error in the run record and the rest continues. One process imports
into a run at a time (the store's lock).

With a prompt suite (``--prompts``), each clip's request is its suite line: the prompt text, and for fl2va / ref2va
suites the workflow and the sha256 of each keyframe or reference image, which the run keeps under ``inputs/`` (so
the keyframe gate can score imported clips against the images they were made from). A clip whose prompt id is not
in the suite is not imported.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from h3.atomic import tmp_path_for
from h3.media import MediaError
from h3.record import ClipRecord, ConditioningImage, RequestSpec
from h3eval.backends import foreign_record, write_record
# What an import is told (folders, the manifest, declarations, timing files): h3eval.backends.folder_inputs;
# importable from here.
from h3eval.backends.folder_inputs import (CLIP_NAME, LATENCY_KEYS, MAX_LATENCY_S, MAX_PEAK_MEMORY_MB, SIDE_KEYS,
                                           TIMING_KEY, Declarations, FolderClip, ManifestLine, SideLine,
                                           check_declarations, inside, parse_declarations, read_manifest,
                                           read_sglang_perf_dump, read_timing_file, scan_folder, side_name)
from h3eval.runner import RunError, run_differences
from h3eval.store import ClipError, PromptSuiteRef, RunManifest, RunStore, read_finished_record, utc_now

__all__ = ["CLIP_NAME", "IDENTITY_KEYS", "LATENCY_KEYS", "MAX_LATENCY_S", "MAX_PEAK_MEMORY_MB", "SIDE_KEYS",
           "TIMING_KEY", "Declarations", "FolderClip", "ManifestLine", "SideLine", "check_declarations",
           "import_folders", "inside", "parse_declarations", "read_manifest", "read_sglang_perf_dump",
           "read_timing_file", "resolved_recipe", "scan_folder", "side_name"]

logger = logging.getLogger(__name__)

def _import_clip(store: RunStore, clip: FolderClip, source: str, line: Any = None) -> ClipRecord:
    """``line``: the clip's prompt-suite line (h3eval.prompts.Prompt), whose text and images the record takes."""
    out = store.clip_path(clip.side, clip.prompt_id, clip.seed)
    tmp = tmp_path_for(out)
    try:
        shutil.copyfile(clip.path, tmp)
        peak = clip.timings.get("peak_memory_mb")
        record = foreign_record(
            tmp, recipe_name=clip.side, recipe={"name": clip.side, "imported_from": str(source)},
            request=RequestSpec(prompt=clip.prompt or "", prompt_id=clip.prompt_id, seed=clip.seed, height=0, width=0),
            model="imported", generation_side_latency_s=clip.timings.get("generation_side_latency_s"),
            request_to_file_latency_s=clip.timings.get("request_to_file_latency_s"),
            peak_memory_bytes=int(peak * 2**20) if peak is not None else None, device="imported",
            extra={"imported_from": str(clip.path), "warmup": False},
        )
        if line is not None:
            record.request.prompt = clip.prompt or line.prompt
            record.request.workflow = line.workflow
            record.request.conditioning = [ConditioningImage(role=role, sha256=image.sha256, width=image.width,
                                                             height=image.height, media_type=image.media_type)
                                           for role, image in line.images.items()]
        elif not clip.prompt:
            record.extra["unreported"].append("request.prompt")
        record.request.height, record.request.width = record.shape.height, record.shape.width
        tmp.replace(out)
    except MediaError as exc:
        tmp.unlink(missing_ok=True)
        # The decoder names the file it read, a temporary copy: the user knows the clip by its source.
        raise MediaError(str(exc).replace(str(tmp), str(clip.path)).replace(tmp.name, clip.path.name)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    write_record(out, record)
    return record


def _same_form(a: ClipRecord, b: ClipRecord) -> list[str]:
    diffs = []
    for key in ("width", "height", "fps", "num_frames"):
        if getattr(a.shape, key) != getattr(b.shape, key):
            diffs.append(f"{key} {getattr(a.shape, key)} vs {getattr(b.shape, key)}")
    if abs(a.shape.duration_s - b.shape.duration_s) > 1.0 / max(a.shape.fps, 1) and not diffs:
        diffs.append(f"duration {a.shape.duration_s:.3f} s vs {b.shape.duration_s:.3f} s")
    return diffs


def _apply_timing_files(declared: Declarations, by_side: dict[str, dict[tuple[str, int], FolderClip]]) -> None:
    for side, path in declared.timings.items():
        for key, values in read_timing_file(path).items():
            clip = by_side[side].get(key)
            if clip is None:
                raise RunError(f"timing file {path} times {key[0]}-s{key[1]}, which {side} has no clip for")
            for name, value in values.items():
                if name in clip.timings and clip.timings[name] != value:
                    raise RunError(f"{side}/{key[0]}-s{key[1]}: {name} is {clip.timings[name]} in the manifest and "
                                   f"{value} in timing file {path}")
                clip.timings[name] = value


def _apply_timings(record: ClipRecord, timings: dict[str, float]) -> bool:
    """Put the declared ``timings`` into a finished clip's record (a rerun that brings timings); True if it changed."""
    changed = False
    unreported = record.extra.setdefault("unreported", [])
    for key in LATENCY_KEYS:
        if key in timings and (getattr(record.timings, key) != timings[key] or f"timings.{key}" in unreported):
            setattr(record.timings, key, timings[key])
            if f"timings.{key}" in unreported:
                unreported.remove(f"timings.{key}")
            changed = True
    if "peak_memory_mb" in timings and record.peak_memory_bytes != int(timings["peak_memory_mb"] * 2**20):
        record.peak_memory_bytes, changed = int(timings["peak_memory_mb"] * 2**20), True
    return changed


IDENTITY_KEYS = ("name", "imported_from")
"""The keys of an imported recipe that say which clips it is; its declarations (signoff kind, parent) may change."""


def _sha(recipe: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def resolved_recipe(identity: dict[str, Any], kind: str | None, parent: str | None, how: str) -> dict[str, Any]:
    """An imported side's resolved recipe: where its clips came from, ``[signoff] kind`` and top-level ``parent``
    where declared (the keys the verdict reads for recipes made here)."""
    recipe = dict(identity)
    if kind is not None:
        recipe["signoff"] = {"kind": kind, "reason": f"declared on import ({how})"}
    if parent is not None:
        recipe["parent"] = parent
    return recipe


def import_folders(baseline_dir: str, candidate_dirs: list[str], out: Path, manifest: Path | None = None,
                   prompts: Any = None, kinds: list[str] | None = None, parents: list[str] | None = None,
                   timings: list[str] | None = None) -> RunManifest:
    """Import folders of clips as an ``import`` run; resumable (finished clips are kept). ``prompts``: the
    h3eval.prompts.PromptSuite the clips were made from (their text, workflow and images), or None. ``kinds``,
    ``parents``, ``timings``: ``NAME=VALUE`` declarations (``--kind``, ``--parent``, ``--timings``)."""
    base_name, base_dir = side_name(baseline_dir, "baseline")
    candidates = [side_name(c, f"candidate{i}") for i, c in enumerate(candidate_dirs)]
    names = [base_name] + [c[0] for c in candidates]
    if len(set(names)) != len(names):
        raise RunError(f"baseline and candidate names must differ, got {names} (use NAME=DIR)")
    clips, declared = _clips_and_declarations(base_name, base_dir, candidates, names, manifest, kinds, parents, timings)
    check_declarations(declared, base_name, names)
    by_side: dict[str, dict[tuple[str, int], FolderClip]] = {n: {} for n in names}
    for c in clips:
        if (c.prompt_id, c.seed) in by_side[c.side]:
            raise RunError(f"{c.side}: two clips for {c.prompt_id}-s{c.seed}")
        by_side[c.side][(c.prompt_id, c.seed)] = c
    _apply_timing_files(declared, by_side)
    keys = sorted({k for side in by_side.values() for k in side})
    store = RunStore(out)
    sources = {n: base_dir if n == base_name else dict(candidates)[n] for n in names}
    identity = {n: {"name": n, "imported_from": str(sources[n])} for n in names}
    how = "the manifest" if manifest is not None else "--kind / --parent"
    recipes = {n: resolved_recipe(identity[n], declared.kinds.get(n), declared.parents.get(n), how) for n in names}
    listing = hashlib.sha256(json.dumps([[c.side, c.prompt_id, c.seed, str(c.path)] for c in clips]).encode())
    if prompts is not None:
        listing.update(prompts.sha256.encode())
    now = utc_now()
    fresh = RunManifest(kind="import", created_at=now, updated_at=now, model="imported", backend="folder",
                        baseline=base_name, candidates=names[1:], recipes=recipes,
                        recipe_sha256={n: _sha(r) for n, r in recipes.items()},
                        prompts=PromptSuiteRef(path=str(manifest or base_dir), sha256=listing.hexdigest(),
                                               ids=sorted({k[0] for k in keys})),
                        seeds=sorted({k[1] for k in keys}),
                        args={"command": "import", "baseline_dir": baseline_dir, "candidate_dirs": candidate_dirs,
                              "manifest": str(manifest), "prompts": str(prompts.path) if prompts is not None else None,
                              "kinds": list(kinds or []), "parents": list(parents or []),
                              "timings": list(timings or [])})
    with store.lock("h3eval import"):  # one process writes into a run at a time
        run = _rerun(store.read_manifest(), fresh, identity, declared, how, out) if store.exists() else fresh
        run.status = "running"
        store.write_manifest(run)
        if prompts is not None:
            from h3eval.runner import save_inputs

            save_inputs(store, prompts)
        run.errors = _import_pairs(store, by_side, keys, names, sources, prompts)
        run.status = "complete" if not run.errors else "partial"
        store.write_manifest(run)
        return run


def _clips_and_declarations(base_name: str, base_dir: Path, candidates: list[tuple[str, Path]], names: list[str],
                            manifest: Path | None, kinds: list[str] | None, parents: list[str] | None,
                            timings: list[str] | None) -> tuple[list[FolderClip], Declarations]:
    """The clips to import (from the manifest, or the folders paired by name) and what the command line and the
    manifest declare, with ``baseline`` read as the baseline's name."""
    declared = Declarations(kinds=parse_declarations(kinds, "--kind"), parents=parse_declarations(parents, "--parent"),
                            timings={n: Path(v) for n, v in parse_declarations(timings, "--timings").items()})
    declared.timings = {base_name if n == "baseline" else n: v for n, v in declared.timings.items()}
    if manifest is not None:
        clips, from_manifest = read_manifest(Path(manifest), set(names) | {"baseline"})
        for c in clips:
            c.side = base_name if c.side == "baseline" else c.side
        from_manifest.timings = {base_name if n == "baseline" else n: v for n, v in from_manifest.timings.items()}
        from_manifest.kinds = {base_name if n == "baseline" else n: v for n, v in from_manifest.kinds.items()}
        from_manifest.parents = {base_name if n == "baseline" else n: v for n, v in from_manifest.parents.items()}
        declared.merge(from_manifest, f"on the command line and in {manifest}")
        return clips, declared
    clips = scan_folder(base_name, base_dir)
    for name, directory in candidates:
        clips += scan_folder(name, directory)
    if not clips:
        raise RunError(f"no clip named <prompt_id>-s<seed>.mp4 in {base_dir} or the candidate folders; nothing "
                       "was imported")
    return clips, declared


def _rerun(existing: RunManifest, fresh: RunManifest, identity: dict[str, dict[str, Any]], declared: Declarations,
           how: str, out: Path) -> RunManifest:
    """The run on disk, brought up to this import: the clips decide whether it is the same run (else RunError);
    declarations (kind, parent) given now replace those on disk, and those not given are kept."""
    names = list(identity)
    diffs = run_differences(
        existing.model_copy(update={"recipe_sha256": {n: _sha({k: r[k] for k in IDENTITY_KEYS if k in r})
                                                      for n, r in existing.recipes.items()}}),
        fresh.model_copy(update={"recipe_sha256": {n: _sha(identity[n]) for n in names}}))
    if diffs:
        raise RunError(f"{out} already holds a different run (differs in: {'; '.join(diffs)}); choose a new "
                       "--out (nothing was changed)")
    run = existing
    for n in names:
        old = existing.recipes.get(n) or {}
        kind = declared.kinds.get(n) or (old.get("signoff") or {}).get("kind")
        parent = declared.parents.get(n) or old.get("parent")
        run.recipes[n] = (resolved_recipe(identity[n], kind, parent, how) if n in declared.kinds or
                          n in declared.parents else {**identity[n], **{k: v for k, v in old.items()
                                                                       if k in ("signoff", "parent")}})
    run.recipe_sha256 = {n: _sha(r) for n, r in run.recipes.items()}
    run.args = fresh.args
    return run


def _import_pairs(store: RunStore, by_side: dict[str, dict[tuple[str, int], FolderClip]], keys: list[tuple[str, int]],
                  names: list[str], sources: dict[str, Path], prompts: Any) -> list[ClipError]:
    """Every clip imported key by key, baseline first (finished ones kept, their timings brought up to date); a
    candidate clip without a usable baseline partner, or of another form than its partner, is an error. Returns the
    errors (each also written beside its clip)."""
    base_name = names[0]
    errors: list[ClipError] = []

    def error(side: str, key: tuple[str, int], message: str) -> None:
        logger.error("%s/%s-s%d: %s", side, key[0], key[1], message)
        errors.append(store.write_clip_error(side, key[0], key[1], message))

    def load(side: str, key: tuple[str, int]) -> ClipRecord | None:
        clip = by_side[side].get(key)
        if clip is None:
            return None
        done = read_finished_record(store.clip_path(side, *key))
        if done is not None:
            if _apply_timings(done, clip.timings):  # a rerun that brings the clip's timings
                write_record(store.clip_path(side, *key), done)
            return done
        line = None
        if prompts is not None:
            try:
                line = prompts.by_id(key[0])
            except KeyError:
                error(side, key, f"{clip.path}: prompt id {key[0]!r} is not in the prompt suite {prompts.path}")
                return None
        try:
            record = _import_clip(store, clip, sources[side], line)
        except (MediaError, OSError) as exc:
            error(side, key, f"cannot import {clip.path}: {exc}")
            return None
        store.clear_clip_error(side, *key)
        return record

    for key in keys:
        base = load(base_name, key)
        if base is None and key in by_side[base_name]:
            continue  # its error is recorded; the candidates' clips of this key have no usable partner
        for name in names[1:]:
            if key not in by_side[name]:
                if base is not None:
                    error(name, key, f"no {name} clip partners baseline {by_side[base_name][key].path}")
                continue
            if base is None:
                error(name, key, f"{by_side[name][key].path} has no baseline partner ({key[0]}-s{key[1]}.mp4 is "
                                 f"missing from {sources[base_name]})")
                continue
            existing = store.clip_path(name, *key)
            cand = load(name, key)
            if cand is None:
                continue
            diffs = _same_form(base, cand)
            if diffs:
                existing.unlink(missing_ok=True)
                existing.with_suffix(".json").unlink(missing_ok=True)
                error(name, key, f"{by_side[name][key].path} differs from its baseline partner in "
                                 f"{', '.join(diffs)}: not imported")
    return errors
