"""Fetch the VBench checkpoints from their official locations, resumably, and pin or verify their sha256.

``h3eval vbench setup --fetch-checkpoints`` on a machine with network. The URLs are the ones vbench 0.1.5 itself
downloads from (``vbench/utils.py`` ``init_submodules``, ``vbench/aesthetic_quality.py``,
``vbench/third_party/ViCLIP/simple_tokenizer.py``); the product never lets VBench download anything itself (the
scoring subprocess blocks the network).

For each checkpoint file the dimensions need (:data:`gates.vbench.dimensions.DIMENSIONS`):

- a present file whose sha256 matches its pin is kept (nothing is downloaded again);
- otherwise the source is downloaded to ``<cache>/.fetch/<name>.part`` with progress, and a ``.part`` left by a cut
  download is **resumed** with an HTTP ``Range`` request (a server that ignores ``Range`` restarts it from zero);
- an archive source (RAFT's ``models.zip``, the DINO repository) is unpacked after the download, and only the files
  VBench loads are taken from it;
- every resulting file is hashed: against its pin in ``gates/vbench/vbench-checkpoints.json`` when it has one (a
  mismatch is **refused**: the download is deleted and nothing is put in place), else it is pinned on first use
  (trust on first use, said in the output: commit the pins file);
- a file reaches its final path only by an atomic rename after its hash is checked, so nothing half-written is ever
  where VBench reads.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gates.vbench.dimensions import DIMENSIONS, resolve_dimensions
from gates.vbench.pins import CHECKPOINT_PINS_PATH, PINS_VERSION, VBenchPinError, load_json_file, vbench_cache_dir
from h3.atomic import atomic_write_json, sha256_file
from h3.provenance import utc_now

logger = logging.getLogger(__name__)

CHUNK = 1 << 16
FETCH_DIR = ".fetch"


@dataclass(frozen=True)
class Source:
    """Where one checkpoint (a file, or a directory pinned whole: trailing ``/``) comes from."""

    checkpoint: str
    """Path relative to the VBench cache folder, as in :data:`gates.vbench.dimensions.DIMENSIONS`."""
    url: str
    archive: str | None = None
    """``zip``: the URL is a zip archive; ``member`` names what to take from it."""
    member: str | None = None
    """In the archive: the file to take (``models/raft-things.pth``) or, for a directory checkpoint, the folder whose
    contents become it (``dino-main/``)."""


OFFICIAL_SOURCES: dict[str, Source] = {s.checkpoint: s for s in [
    Source("dino_model/dino_vitbase16_pretrain.pth",
           "https://dl.fbaipublicfiles.com/dino/dino_vitbase16_pretrain/dino_vitbase16_pretrain.pth"),
    # vbench clones https://github.com/facebookresearch/dino; the same tree as GitHub's archive of its main branch.
    Source("dino_model/facebookresearch_dino_main/",
           "https://github.com/facebookresearch/dino/archive/refs/heads/main.zip", "zip", "dino-main/"),
    Source("clip_model/ViT-B-32.pt",
           "https://openaipublic.azureedge.net/clip/models/"
           "40d365715913c9da98579312b702a82c18be219cc2a73407c4526f58eba950af/ViT-B-32.pt"),
    Source("amt_model/amt-s.pth", "https://huggingface.co/lalala125/AMT/resolve/main/amt-s.pth"),
    Source("raft_model/models/raft-things.pth", "https://dl.dropboxusercontent.com/s/4j4z58wuv8o0mfz/models.zip",
           "zip", "models/raft-things.pth"),
    Source("clip_model/ViT-L-14.pt",
           "https://openaipublic.azureedge.net/clip/models/"
           "b8cca3fd41ae0c99ba7e8951adf17d267cdb84cd88be6f7c2e0eca1737a03836/ViT-L-14.pt"),
    Source("aesthetic_model/emb_reader/sa_0_4_vit_l_14_linear.pth",
           "https://github.com/LAION-AI/aesthetic-predictor/blob/main/sa_0_4_vit_l_14_linear.pth?raw=true"),
    Source("pyiqa_model/musiq_spaq_ckpt-358bb6af.pth",
           "https://github.com/chaofengc/IQA-PyTorch/releases/download/v0.1-weights/musiq_spaq_ckpt-358bb6af.pth"),
    Source("ViCLIP/ViClip-InternVid-10M-FLT.pth",
           "https://huggingface.co/OpenGVLab/VBench_Used_Models/resolve/main/ViClip-InternVid-10M-FLT.pth"),
    Source("ViCLIP/bpe_simple_vocab_16e6.txt.gz",
           "https://raw.githubusercontent.com/openai/CLIP/main/clip/bpe_simple_vocab_16e6.txt.gz"),
]}


class FetchError(RuntimeError):
    """A download failed or was refused; the message names the file and the URL. Nothing was put in place."""


class HashMismatchError(FetchError):
    pass


Progress = Callable[[str, int, int | None], None]
"""``progress(name, bytes_so_far, total_or_None)``."""


@dataclass
class FetchReport:
    kept: list[str] = field(default_factory=list)
    """Already present with the pinned hash."""
    downloaded: list[str] = field(default_factory=list)
    pinned_now: list[str] = field(default_factory=list)
    """Files that had no pin and were pinned on first use (commit the pins file)."""
    resumed: list[str] = field(default_factory=list)
    """Downloads that continued a cut ``.part``."""

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def download(url: str, part: Path, name: str = "", progress: Progress | None = None, timeout: float = 60.0) -> bool:
    """Download ``url`` into ``part``, resuming what it already holds; True when it resumed. On a cut connection the
    ``.part`` keeps what arrived (the next call resumes it) and FetchError is raised."""
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "h3eval-vbench-fetch"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the part is already whole (or longer than the file): start over
            part.unlink()
            return download(url, part, name, progress, timeout)
        raise FetchError(f"{name or url}: HTTP {exc.code} from {url}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise FetchError(f"{name or url}: cannot reach {url}: {exc}") from None
    with response:
        resumed = have > 0 and response.status == 206
        if have and not resumed:
            have = 0  # the server ignored the Range request: the body is the whole file again
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        got = have
        with open(part, "ab" if resumed else "wb") as out:
            while True:
                try:
                    chunk = response.read(CHUNK)
                except (OSError, urllib.error.URLError) as exc:
                    raise FetchError(f"{name or url}: download cut at {got} bytes ({exc}); run again to resume "
                                     f"from {part}") from None
                if not chunk:
                    break
                out.write(chunk)
                got += len(chunk)
                if progress:
                    progress(name or url, got, total)
            out.flush()
            os.fsync(out.fileno())
    if total is not None and got < total:
        raise FetchError(f"{name or url}: download cut at {got} of {total} bytes; run again to resume from {part}")
    return resumed


def _sha(path: Path) -> str:
    return sha256_file(path)


def _pins(path: Path) -> dict[str, dict[str, Any]]:
    if not Path(path).exists():
        return {}
    return {e["path"]: e for e in load_json_file(path, "checkpoint pins").get("checkpoints", [])}


def _write_pins(path: Path, entries: dict[str, dict[str, Any]]) -> None:
    atomic_write_json(path, {
        "version": PINS_VERSION,
        "note": "sha256 of VBench checkpoints, relative to the VBench cache folder ($VBENCH_CACHE_DIR or "
                "~/.cache/vbench). Written by `h3eval vbench pin` or `h3eval vbench setup --fetch-checkpoints` "
                "(pinned on first download) on a trusted machine; commit this file.",
        "pinned_at": utc_now(),
        "checkpoints": [entries[k] for k in sorted(entries)],
    })


def _place(tmp: Path, final: Path, rel: str, pins: dict[str, dict[str, Any]], report: FetchReport) -> None:
    """Check ``tmp`` against the pin of ``rel`` (or pin it), then rename it to ``final`` atomically."""
    digest = _sha(tmp)
    pin = pins.get(rel)
    if pin is not None and pin["sha256"] != digest:
        tmp.unlink(missing_ok=True)
        raise HashMismatchError(f"refused {rel}: the download has sha256 {digest}, the pin is {pin['sha256']}; "
                                "nothing was put in place (a changed upstream file or a tampered download)")
    if pin is None:
        pins[rel] = {"path": rel, "sha256": digest, "bytes": tmp.stat().st_size}
        report.pinned_now.append(rel)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, final)
    report.downloaded.append(rel)


def _present_and_pinned(cache: Path, rel: str, pins: dict[str, dict[str, Any]]) -> bool:
    if rel.endswith("/"):
        files = [k for k in pins if k.startswith(rel)]
        return bool(files) and all((cache / k).is_file() and _sha(cache / k) == pins[k]["sha256"] for k in files)
    path = cache / rel
    return rel in pins and path.is_file() and _sha(path) == pins[rel]["sha256"]


def fetch_checkpoints(dimensions: list[str] | str | None = None, cache_dir: Path | None = None,
                      pins_path: Path = CHECKPOINT_PINS_PATH, sources: dict[str, Source] | None = None,
                      progress: Progress | None = None) -> FetchReport:
    """Make every checkpoint ``dimensions`` need present and hash-checked (module docstring). Raises FetchError
    (HashMismatchError on a refused hash) naming the file; what was fetched before it stays, pinned."""
    cache = Path(cache_dir) if cache_dir else vbench_cache_dir()
    sources = OFFICIAL_SOURCES if sources is None else sources
    dims = resolve_dimensions(dimensions)
    needed = list(dict.fromkeys(c for d in dims for c in DIMENSIONS[d].checkpoints))
    missing = [c for c in needed if c not in sources]
    if missing:
        raise FetchError(f"no download source for {missing}")
    pins = _pins(pins_path)
    report = FetchReport()
    work = cache / FETCH_DIR
    try:
        for rel in needed:
            if _present_and_pinned(cache, rel, pins):
                report.kept.append(rel)
                continue
            source = sources[rel]
            part = work / (hashlib.sha256(source.url.encode()).hexdigest()[:16] + ".part")
            name = rel.rstrip("/").rsplit("/", 1)[-1]
            if download(source.url, part, name, progress):
                report.resumed.append(rel)
            if source.archive is None:
                _place(part, cache / rel, rel, pins, report)
                continue
            try:
                _unpack(part, source, cache, rel, pins, report, work)
            finally:
                part.unlink(missing_ok=True)
    finally:
        if report.pinned_now:  # what was fetched and pinned before a failure stays pinned
            _write_pins(pins_path, pins)
    return report


def _unpack(archive: Path, source: Source, cache: Path, rel: str, pins: dict[str, dict[str, Any]],
            report: FetchReport, work: Path) -> None:
    try:
        zf = zipfile.ZipFile(archive)
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{rel}: {source.url} is not a zip archive ({exc})") from None
    with zf:
        names = zf.namelist()
        if not rel.endswith("/"):
            if source.member not in names:
                raise FetchError(f"{rel}: {source.member} is not in {source.url}")
            tmp = work / (Path(rel).name + ".extract")
            with zf.open(source.member) as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
            _place(tmp, cache / rel, rel, pins, report)
            return
        prefix = source.member or ""
        members = [n for n in names if n.startswith(prefix) and not n.endswith("/")]
        if not members:
            raise FetchError(f"{rel}: nothing under {prefix!r} in {source.url}")
        staged = work / (rel.strip("/").replace("/", "_") + ".extract")
        shutil.rmtree(staged, ignore_errors=True)
        pinned = {k: v for k, v in pins.items() if k.startswith(rel)}
        fresh: dict[str, dict[str, Any]] = {}
        for member in members:
            inner = member[len(prefix):]
            target = staged / inner
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            key = rel + inner
            digest = _sha(target)
            if pinned and (key not in pinned or pinned[key]["sha256"] != digest):
                shutil.rmtree(staged, ignore_errors=True)
                raise HashMismatchError(f"refused {rel}: {inner} differs from its pin (or is not pinned); nothing was "
                                        "put in place")
            fresh[key] = {"path": key, "sha256": digest, "bytes": target.stat().st_size}
        if pinned and set(pinned) - set(fresh):
            shutil.rmtree(staged, ignore_errors=True)
            raise HashMismatchError(f"refused {rel}: pinned files missing from the archive: "
                                    f"{sorted(set(pinned) - set(fresh))[:3]}")
        final = cache / rel
        if final.exists():
            shutil.rmtree(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, final)
        if not pinned:
            pins.update(fresh)
            report.pinned_now.append(rel)
        report.downloaded.append(rel)
