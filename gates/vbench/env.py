"""The scoring environment: a virtual environment of its own with ``vbench==0.1.5``, installed from committed locks.

VBench 0.1.5 declares ``transformers==4.33.2`` and ``numpy<2``; the product needs numpy 2 and a transformers that
knows Qwen3-VL, so VBench never runs in the product's interpreter. ``h3eval vbench setup`` builds the environment
with ``python -m venv`` and ``pip install --no-deps --require-hashes`` from the lock files under ``gates/``: exact
versions and sha256 of every distribution, so two machines build the same environment and pip resolves nothing.

Two locks, so that a machine (or CI) that only scores temporal_flickering does not install the model stack:

- ``gates/vbench/vbench-requirements.lock`` (group ``core``): vbench itself and what ``import vbench`` needs (its
  ``__init__`` imports ``vbench.utils``, which imports torch, torchvision, decord, PIL and cv2), enough for
  temporal_flickering.
- ``gates/vbench/vbench-requirements-models.lock`` (group ``models``): added on top for the dimensions that load a model
  (openai-clip, pyiqa, timm, transformers 4.33.2, omegaconf, easydict, einops, ...).

vbench is installed with ``--no-deps``: its declared requirements also cover dimensions the product does not score
in custom-input mode (GRiT's detectron stack, lvis, pycocoevalcap, ...); the locks hold what the eight supported
dimensions import. ``opencv-python-headless`` stands in for the ``opencv-python`` that vbench and pyiqa declare (the
same ``cv2`` module without the GUI libraries a headless scoring machine lacks).

The environment records what it was built from in ``h3eval-vbench-env.json`` (written last, so an interrupted build
is seen as broken), and :func:`check_env` compares the installed versions with the locks before every scoring run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h3.atomic import atomic_write_json, sha256_file
from gates.vbench.dimensions import VBENCH_VERSION, requirement_groups
from h3.provenance import utc_now

logger = logging.getLogger(__name__)

VBENCH_DIR = Path(__file__).resolve().parent
"""This package's folder: it holds the locks and the pins next to the code."""
LOCK_FILES: dict[str, Path] = {
    "core": VBENCH_DIR / "vbench-requirements.lock",
    "models": VBENCH_DIR / "vbench-requirements-models.lock",
}
MARKER_NAME = "h3eval-vbench-env.json"
ENV_VAR = "H3EVAL_VBENCH_ENV"
MARKER_VERSION = 1


class VBenchEnvError(RuntimeError):
    """The scoring environment is missing, broken, or not what the locks say."""


def default_env_path() -> Path:
    """``$H3EVAL_VBENCH_ENV``, else ``~/.cache/h3eval/vbench-env``."""
    value = os.environ.get(ENV_VAR)
    return Path(value).expanduser() if value else Path.home() / ".cache" / "h3eval" / "vbench-env"


def env_python(env: Path) -> Path:
    return Path(env) / "bin" / "python"


def canonical_name(name: str) -> str:
    """PEP 503 normalized distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """``{canonical name: version}`` of a lock file (``name==version --hash=...`` lines, ``#`` comments)."""
    pins: dict[str, str] = {}
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if not match or "--hash=sha256:" not in line:
            raise VBenchEnvError(f"{path}:{lineno}: not an exact pin with a sha256 hash: {line!r}")
        pins[canonical_name(match.group(1))] = match.group(2)
    return pins


def write_lock(report: dict[str, Any], out: Path, header: str, exclude: set[str] = frozenset(),
               subtract: dict[str, str] | None = None, extra_lines: list[str] = ()) -> None:
    """Write a lock file from a ``pip install --dry-run --report`` report (maintainer tool, see the lock headers).

    ``exclude``: canonical names left out; ``subtract``: pins already in another lock (left out here, and their
    versions must agree, or the two locks could not be installed together).
    """
    lines = [f"# {line}" if line else "#" for line in header.strip().splitlines()]
    rows = []
    for item in report["install"]:
        name = canonical_name(item["metadata"]["name"])
        version = item["metadata"]["version"]
        if name in exclude:
            continue
        if subtract and name in subtract:
            if subtract[name] != version:
                raise VBenchEnvError(f"{name}: {version} here but {subtract[name]} in the other lock")
            continue
        digest = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        if not digest:
            raise VBenchEnvError(f"{name}=={version}: the report has no sha256 for {item['download_info']['url']}")
        rows.append(f"{name}=={version} --hash=sha256:{digest}")
    rows.extend(extra_lines)
    text = "\n".join(lines + sorted(rows)) + "\n"
    from h3.atomic import atomic_write_text

    atomic_write_text(out, text)


@dataclass
class EnvInfo:
    """What the scoring environment is, for the run record's provenance."""

    path: str
    python: str
    python_version: str
    site_packages: str
    groups: list[str]
    versions: dict[str, str] = field(default_factory=dict)
    """Every distribution installed in the environment, canonical name -> version."""
    lock_sha256: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


_INTROSPECT = (
    "import importlib.metadata as m, json, sys, sysconfig;"
    "print(json.dumps({'python_version': sys.version.split()[0],"
    " 'site_packages': sysconfig.get_paths()['purelib'],"
    " 'versions': {d.metadata['Name']: d.version for d in m.distributions() if d.metadata['Name']}}))"
)


def _introspect(python: Path) -> dict[str, Any]:
    try:
        proc = subprocess.run([str(python), "-I", "-c", _INTROSPECT], capture_output=True, text=True, timeout=120)
    except OSError as exc:
        raise VBenchEnvError(f"broken VBench environment: cannot run {python}: {exc}") from exc
    if proc.returncode != 0:
        raise VBenchEnvError(f"broken VBench environment: {python} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _marker(env: Path) -> dict[str, Any]:
    path = Path(env) / MARKER_NAME
    if not path.exists():
        raise VBenchEnvError(
            f"broken or unfinished VBench environment at {env}: {path.name} is missing (the build did not finish); "
            f"rebuild it with `h3eval vbench setup --env {env} --force`"
        )
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise VBenchEnvError(f"broken VBench environment at {env}: {path} is not valid JSON ({exc})") from exc


def check_env(env: Path, dimensions: list[str]) -> EnvInfo:
    """The environment's provenance if it can score ``dimensions`` exactly as the locks say; else VBenchEnvError."""
    env = Path(env)
    python = env_python(env)
    if not python.exists():
        raise VBenchEnvError(
            f"no VBench environment at {env} ({python} does not exist); build it with `h3eval vbench setup --env {env}`"
        )
    marker = _marker(env)
    needed = requirement_groups(dimensions)
    missing_groups = [g for g in needed if g not in marker.get("groups", [])]
    if missing_groups:
        raise VBenchEnvError(
            f"the VBench environment at {env} was built without the {', '.join(missing_groups)} requirements that "
            f"{', '.join(dimensions)} need; run `h3eval vbench setup --env {env} --dimensions {','.join(dimensions)}`"
        )
    problems: list[str] = []
    for group in marker["groups"]:
        current = sha256_file(LOCK_FILES[group])
        if marker.get("lock_sha256", {}).get(group) != current:
            problems.append(f"{LOCK_FILES[group].name} changed since the environment was built")
    info = _introspect(python)
    installed = {canonical_name(k): v for k, v in info["versions"].items()}
    locked: set[str] = set()
    for group in marker["groups"]:
        locked |= set(read_lock(LOCK_FILES[group]))
    # Anything installed beyond the locks (pip itself aside) could shadow a locked module.
    for name in sorted(set(installed) - locked - {"pip"}):
        problems.append(f"{name}=={installed[name]} is installed but not in the locks")
    for group in marker["groups"]:
        for name, version in read_lock(LOCK_FILES[group]).items():
            if name not in installed:
                problems.append(f"{name}=={version} (locked in {LOCK_FILES[group].name}) is not installed")
            elif installed[name] != version:
                problems.append(f"{name} is {installed[name]}, the lock says {version}")
    if problems:
        raise VBenchEnvError(
            f"broken VBench environment at {env}: " + "; ".join(problems)
            + f". Rebuild it with `h3eval vbench setup --env {env} --force`"
        )
    return EnvInfo(
        path=str(env), python=str(python), python_version=info["python_version"],
        site_packages=info["site_packages"], groups=list(marker["groups"]), versions=installed,
        lock_sha256=dict(marker["lock_sha256"]),
    )


def setup_env(env: Path | None = None, dimensions: list[str] | None = None, force: bool = False,
              base_python: str | None = None) -> dict[str, Any]:
    """Build (or extend) the scoring environment for ``dimensions``; returns the marker it wrote.

    An existing environment that already satisfies the locks is kept (nothing is reinstalled); ``force`` rebuilds
    from scratch. A folder that exists but is not one of ours is never deleted.
    """
    from gates.vbench.dimensions import resolve_dimensions

    env = Path(env) if env else default_env_path()
    dims = resolve_dimensions(dimensions)
    groups = requirement_groups(dims)
    if env.exists() and not force:
        try:
            check_env(env, dims)
            logger.info("VBench environment at %s is up to date", env)
            return _marker(env)
        except VBenchEnvError as exc:
            logger.info("VBench environment at %s needs work: %s", env, exc)
    if env.exists():
        if not (env / MARKER_NAME).exists() and not (env / "pyvenv.cfg").exists() and any(env.iterdir()):
            raise VBenchEnvError(f"{env} exists and is not a virtual environment; refusing to touch it")
    start = time.monotonic()
    previous_groups: list[str] = []
    if force and env.exists():
        shutil.rmtree(env)
    if not env_python(env).exists():
        _run([base_python or sys.executable, "-m", "venv", "--clear", str(env)], "create the virtual environment")
    elif (env / MARKER_NAME).exists():
        try:
            previous_groups = list(_marker(env).get("groups", []))
        except VBenchEnvError:
            previous_groups = []
    (env / MARKER_NAME).unlink(missing_ok=True)  # an interrupted install must read as broken
    install_groups = [g for g in ["core", "models"] if g in groups or g in previous_groups]
    cmd = [str(env_python(env)), "-m", "pip", "install", "--no-deps", "--require-hashes", "--no-input",
           "--disable-pip-version-check"]
    for group in install_groups:
        cmd += ["-r", str(LOCK_FILES[group])]
    _run(cmd, "install the locked requirements")
    marker = {
        "version": MARKER_VERSION,
        "vbench_version": VBENCH_VERSION,
        "groups": install_groups,
        "lock_sha256": {g: sha256_file(LOCK_FILES[g]) for g in install_groups},
        "base_python": base_python or sys.executable,
        "built_at": utc_now(),
        "build_seconds": round(time.monotonic() - start, 1),
    }
    atomic_write_json(env / MARKER_NAME, marker)
    check_env(env, dims)
    logger.info("built VBench environment at %s (%s) in %.0f s", env, ", ".join(install_groups),
                marker["build_seconds"])
    return marker


def _run(cmd: list[str], what: str) -> None:
    logger.info("running %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise VBenchEnvError(f"could not {what} (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")
