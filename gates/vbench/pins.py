"""Hash pins of the VBench scorer files and of the checkpoints they load, and their verification.

Seed 002 "pinned one specific VBench revision and verified all seven of its scorer files before every run, so the
scoring code is bit-for-bit reproducible". Here:

- ``gates/vbench/vbench-pins.json`` (committed): sha256 of the files inside the installed ``vbench`` 0.1.5 package that
  define the scored dimensions: the dimension modules, ``utils.py``, ``VBench_full_info.json``, the package's
  ``__init__.py`` and ``distributed.py``, and the third-party model code those dimensions import (AMT, RAFT,
  ViCLIP). Paths are relative to the environment's site-packages.
- ``gates/vbench/vbench-checkpoints.json`` (committed by the user): sha256 of every checkpoint file under the VBench
  cache folder (``$VBENCH_CACHE_DIR`` or ``~/.cache/vbench``), written once on a trusted machine by
  ``h3eval vbench pin``.

:func:`verify` checks all of it and returns every problem by name; scoring refuses to start when there is one.
Nothing is ever downloaded: a missing checkpoint is an error that names the file and the path it must be at.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h3.atomic import atomic_write_json, sha256_file
from h3.provenance import utc_now
from gates.vbench.dimensions import DIMENSIONS, VBENCH_VERSION
from gates.vbench.env import VBENCH_DIR, EnvInfo, VBenchEnvError, check_env

logger = logging.getLogger(__name__)

SOURCE_PINS_PATH = VBENCH_DIR / "vbench-pins.json"
CHECKPOINT_PINS_PATH = VBENCH_DIR / "vbench-checkpoints.json"
PINS_VERSION = 1

# Model code the pinned dimensions import from vbench/third_party (motion_smoothness: AMT, dynamic_degree: RAFT,
# overall_consistency: ViCLIP); pinned whole.
THIRD_PARTY_DIRS = ("vbench/third_party/amt", "vbench/third_party/RAFT", "vbench/third_party/ViCLIP")
_SKIP_PARTS = {"__pycache__", ".git"}


class VBenchPinError(RuntimeError):
    """A pinned file is missing or differs from its pin; scoring must not start."""


class MissingCheckpointError(VBenchPinError):
    pass


def vbench_cache_dir() -> Path:
    """VBench's own rule (vbench/utils.py): ``$VBENCH_CACHE_DIR``, else ``~/.cache/vbench``."""
    value = os.environ.get("VBENCH_CACHE_DIR")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "vbench"


def pinned_source_paths(site_packages: Path) -> list[str]:
    """The files to pin, relative to site-packages, in a stable order."""
    names = [f"vbench/{dim}.py" for dim in DIMENSIONS]
    names += ["vbench/utils.py", "vbench/VBench_full_info.json", "vbench/__init__.py", "vbench/distributed.py",
              "vbench/third_party/__init__.py"]
    for directory in THIRD_PARTY_DIRS:
        root = Path(site_packages) / directory
        for path in sorted(root.rglob("*")):
            if path.is_file() and not _SKIP_PARTS.intersection(path.relative_to(site_packages).parts):
                names.append(path.relative_to(site_packages).as_posix())
    return names


def make_source_pins(site_packages: Path) -> dict[str, Any]:
    """The manifest of the installed package (maintainer step; the result is committed as
    gates/vbench/vbench-pins.json)."""
    site_packages = Path(site_packages)
    files = {}
    for rel in pinned_source_paths(site_packages):
        path = site_packages / rel
        if not path.is_file():
            raise VBenchPinError(f"cannot pin {rel}: {path} does not exist")
        files[rel] = sha256_file(path)
    return {
        "version": PINS_VERSION,
        "vbench_version": VBENCH_VERSION,
        "note": "sha256 of the VBench files that define the scored dimensions, relative to the scoring "
                "environment's site-packages; checked before every scoring run (h3eval vbench verify).",
        "files": files,
    }


def load_json_file(path: Path, what: str) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise VBenchPinError(f"{what} {path} is missing")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise VBenchPinError(f"{what} {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("version") != PINS_VERSION:
        raise VBenchPinError(f"{what} {path}: expected a JSON object with \"version\": {PINS_VERSION}")
    return data


def verify_sources(site_packages: Path, pins: dict[str, Any]) -> list[str]:
    """One problem string per pinned file that is missing or whose sha256 differs."""
    problems = []
    if pins.get("vbench_version") != VBENCH_VERSION:
        problems.append(f"the source pins are for vbench {pins.get('vbench_version')}, not {VBENCH_VERSION}")
    files = pins.get("files") or {}
    if not files:
        problems.append("the source pins list no files")
    for rel, expected in files.items():
        path = Path(site_packages) / rel
        if not path.is_file():
            problems.append(f"pinned VBench file missing: {path}")
            continue
        actual = sha256_file(path)
        if actual != expected:
            problems.append(f"pinned VBench file changed: {path} has sha256 {actual}, the pin is {expected}")
    return problems


def _expand_checkpoint(cache_dir: Path, rel: str) -> list[str]:
    """A file checkpoint is itself; a directory checkpoint (trailing ``/``) is every file under it."""
    if not rel.endswith("/"):
        return [rel]
    root = cache_dir / rel
    if not root.is_dir():
        return []
    return [
        p.relative_to(cache_dir).as_posix() for p in sorted(root.rglob("*"))
        if p.is_file() and not _SKIP_PARTS.intersection(p.relative_to(root).parts)
    ]


def missing_checkpoints(cache_dir: Path, dimensions: list[str]) -> list[str]:
    """One message per checkpoint the dimensions need that is not on disk, naming the file and where it must be."""
    messages = []
    for dim in dimensions:
        for rel in DIMENSIONS[dim].checkpoints:
            path = cache_dir / rel
            present = path.is_dir() and any(path.iterdir()) if rel.endswith("/") else path.is_file()
            if not present:
                kind = "directory" if rel.endswith("/") else "file"
                messages.append(
                    f"missing checkpoint for {dim}: {kind} {rel} must be at {path} "
                    f"(VBench cache folder {cache_dir}; nothing is downloaded at run time)"
                )
    return messages


def pin_checkpoints(cache_dir: Path | None = None, dimensions: list[str] | None = None,
                    out: Path = CHECKPOINT_PINS_PATH) -> dict[str, Any]:
    """Hash every checkpoint the dimensions need into ``out`` (run once on a trusted machine, then commit ``out``).

    Entries of other checkpoints already in ``out`` are kept. Any missing checkpoint is an error before anything
    is written.
    """
    from gates.vbench.dimensions import resolve_dimensions

    cache_dir = Path(cache_dir) if cache_dir else vbench_cache_dir()
    dims = [d for d in resolve_dimensions(dimensions) if DIMENSIONS[d].checkpoints]
    missing = missing_checkpoints(cache_dir, dims)
    if missing:
        raise MissingCheckpointError("cannot pin: " + "; ".join(missing))
    existing: dict[str, dict[str, Any]] = {}
    if Path(out).exists():
        for entry in load_json_file(out, "checkpoint pins").get("checkpoints", []):
            existing[entry["path"]] = entry
    for dim in dims:
        for rel in DIMENSIONS[dim].checkpoints:
            # A re-pinned directory replaces its old file list (a file removed from it must not stay pinned).
            if rel.endswith("/"):
                for key in [k for k in existing if k.startswith(rel)]:
                    del existing[key]
            for file_rel in _expand_checkpoint(cache_dir, rel):
                path = cache_dir / file_rel
                existing[file_rel] = {"path": file_rel, "sha256": sha256_file(path), "bytes": path.stat().st_size}
    data = {
        "version": PINS_VERSION,
        "note": "sha256 of VBench checkpoints, relative to the VBench cache folder ($VBENCH_CACHE_DIR or "
                "~/.cache/vbench). Written by `h3eval vbench pin` on a trusted machine; commit this file.",
        "pinned_at": utc_now(),
        "checkpoints": [existing[k] for k in sorted(existing)],
    }
    atomic_write_json(out, data)
    return data


def verify_checkpoints(cache_dir: Path, pins: dict[str, Any], dimensions: list[str]) -> list[str]:
    """Problems with the checkpoints ``dimensions`` need: missing on disk, not pinned, or a different sha256."""
    pinned = {entry["path"]: entry for entry in pins.get("checkpoints", [])}
    problems = missing_checkpoints(cache_dir, dimensions)
    for dim in dimensions:
        for rel in DIMENSIONS[dim].checkpoints:
            if rel.endswith("/"):
                expected = sorted(k for k in pinned if k.startswith(rel))
                on_disk = _expand_checkpoint(cache_dir, rel)
                if not on_disk:
                    continue  # reported once by missing_checkpoints
                if not expected:
                    problems.append(f"checkpoint directory {rel} for {dim} is not pinned in "
                                    f"{CHECKPOINT_PINS_PATH.name}; run `h3eval vbench pin` on a trusted machine and "
                                    "commit the file")
                    continue
                for extra in sorted(set(on_disk) - set(expected)):
                    problems.append(f"unpinned file in checkpoint directory {rel}: {cache_dir / extra}")
                files = expected
            else:
                if rel not in pinned:
                    if (cache_dir / rel).is_file():
                        problems.append(f"checkpoint {rel} for {dim} is not pinned in {CHECKPOINT_PINS_PATH.name}; "
                                        "run `h3eval vbench pin` on a trusted machine and commit the file")
                    continue
                files = [rel]
            for file_rel in files:
                path = cache_dir / file_rel
                if not path.is_file():
                    if rel.endswith("/"):
                        problems.append(f"pinned checkpoint file missing: {file_rel} must be at {path}")
                    continue
                actual = sha256_file(path)
                if actual != pinned[file_rel]["sha256"]:
                    problems.append(f"checkpoint changed: {path} has sha256 {actual}, the pin is "
                                    f"{pinned[file_rel]['sha256']}")
    return problems


@dataclass
class VerifyReport:
    """Everything checked before a scoring run, and the provenance the run record keeps."""

    dimensions: list[str]
    problems: list[str] = field(default_factory=list)
    env: EnvInfo | None = None
    cache_dir: str = ""
    source_pins_sha256: str | None = None
    checkpoint_pins_sha256: str | None = None
    checked_files: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def provenance(self) -> dict[str, Any]:
        return {
            "vbench_version": VBENCH_VERSION,
            "source_pins": str(SOURCE_PINS_PATH.name),
            "source_pins_sha256": self.source_pins_sha256,
            "checkpoint_pins": str(CHECKPOINT_PINS_PATH.name),
            "checkpoint_pins_sha256": self.checkpoint_pins_sha256,
            "cache_dir": self.cache_dir,
            "checked_files": self.checked_files,
            "env": self.env.to_dict() if self.env else None,
        }


def verify(env: Path, dimensions: list[str], cache_dir: Path | None = None,
           source_pins_path: Path = SOURCE_PINS_PATH,
           checkpoint_pins_path: Path = CHECKPOINT_PINS_PATH) -> VerifyReport:
    """Check the environment, every pinned scorer file and every checkpoint the dimensions need. Never raises for a
    problem found; the report lists them all (see :func:`require_verified`)."""
    cache_dir = Path(cache_dir) if cache_dir else vbench_cache_dir()
    report = VerifyReport(dimensions=list(dimensions), cache_dir=str(cache_dir))
    try:
        report.env = check_env(env, dimensions)
    except VBenchEnvError as exc:
        report.problems.append(str(exc))
    try:
        source_pins = load_json_file(source_pins_path, "source pins")
        report.source_pins_sha256 = sha256_file(source_pins_path)
        if report.env is not None:
            report.problems += verify_sources(Path(report.env.site_packages), source_pins)
            report.checked_files += len(source_pins.get("files", {}))
    except VBenchPinError as exc:
        report.problems.append(str(exc))
    needs_checkpoints = [d for d in dimensions if DIMENSIONS[d].checkpoints]
    if needs_checkpoints:
        try:
            checkpoint_pins = load_json_file(checkpoint_pins_path, "checkpoint pins")
            report.checkpoint_pins_sha256 = sha256_file(checkpoint_pins_path)
            report.problems += verify_checkpoints(cache_dir, checkpoint_pins, needs_checkpoints)
            report.checked_files += sum(1 for e in checkpoint_pins.get("checkpoints", []))
        except VBenchPinError as exc:
            report.problems.append(str(exc))
    elif Path(checkpoint_pins_path).exists():
        report.checkpoint_pins_sha256 = sha256_file(checkpoint_pins_path)
    return report


def require_verified(report: VerifyReport) -> VerifyReport:
    if not report.ok:
        raise VBenchPinError(
            f"VBench verification failed ({len(report.problems)} problem(s)); scoring will not start:\n  - "
            + "\n  - ".join(report.problems)
        )
    return report
