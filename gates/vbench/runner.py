"""VBench scoring subprocess: run by the scoring environment's own python, never imported by the product.

    ENV/bin/python gates/vbench/runner.py REQUEST.json RESULT.json

It reads only what REQUEST.json names (clip paths, their prompts, the dimensions, the VBench cache folder, the
device and the sha256 of every pinned VBench file) and writes RESULT.json atomically. VBench runs in its
``custom_input`` mode: the runner writes VBench's per-dimension info file itself (prompt per clip, passed
explicitly; nothing is looked up from file names or VBench's prompt suite) and calls each dimension's
``compute_<dimension>``. It never calls ``vbench.utils.init_submodules`` (which fetches models with wget); it builds
the model paths of VBench's local mode itself, refuses a dimension whose checkpoint is missing, and blocks every
network connection, so nothing downloads silently.

Standard library plus the environment's vbench, cv2 and decord only (this file runs outside the product).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback

RESULT_VERSION = 1

# Local-mode checkpoint paths of vbench 0.1.5 utils.init_submodules (relative to the VBench cache folder); must
# agree with gates/vbench/dimensions.py.
CHECKPOINTS = {
    "subject_consistency": ["dino_model/dino_vitbase16_pretrain.pth", "dino_model/facebookresearch_dino_main"],
    "background_consistency": ["clip_model/ViT-B-32.pt"],
    "temporal_flickering": [],
    "motion_smoothness": ["amt_model/amt-s.pth"],
    "dynamic_degree": ["raft_model/models/raft-things.pth"],
    "aesthetic_quality": ["clip_model/ViT-L-14.pt", "aesthetic_model/emb_reader/sa_0_4_vit_l_14_linear.pth"],
    "imaging_quality": ["pyiqa_model/musiq_spaq_ckpt-358bb6af.pth"],
    "overall_consistency": ["ViCLIP/ViClip-InternVid-10M-FLT.pth", "ViCLIP/bpe_simple_vocab_16e6.txt.gz"],
}


DOWNLOADERS = {"wget", "curl", "git"}


class NetworkBlocked(RuntimeError):
    pass


def block_network() -> None:
    """Any attempt to reach the network is an error (VBench code would otherwise fetch missing models)."""

    def refuse(*args, **kwargs):
        raise NetworkBlocked(
            "VBench scoring tried to reach the network; nothing is downloaded at run time: put the checkpoint in "
            "the VBench cache folder and pin it (`h3eval vbench pin`)"
        )

    real_connect = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            refuse()
        return real_connect(self, address)

    socket.socket.connect = connect  # type: ignore[method-assign]
    socket.create_connection = refuse  # type: ignore[assignment]
    socket.getaddrinfo = refuse  # type: ignore[assignment]

    # VBench also shells out to fetch models (utils.init_submodules, aesthetic_quality, and ViCLIP's tokenizer at
    # import time run `wget`); refuse those commands too.
    real_popen_init = subprocess.Popen.__init__

    def popen_init(self, args, *rest, **kwargs):
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        first = (os.fsdecode(argv[0]).split() or [""])[0] if argv else ""
        if os.path.basename(first) in DOWNLOADERS:
            refuse()
        return real_popen_init(self, args, *rest, **kwargs)

    def system(command):
        if any(word in DOWNLOADERS for word in str(command).split()):
            refuse()
        return real_system(command)

    real_system = os.system
    subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign]
    os.system = system  # type: ignore[assignment]
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_pinned_files(pinned: dict) -> None:
    """Re-check the pinned files right before importing vbench (the parent checked them too)."""
    import importlib.util

    spec = importlib.util.find_spec("vbench")  # locates the package without executing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("vbench is not installed in this environment")
    site_packages = os.path.dirname(list(spec.submodule_search_locations)[0])
    bad = []
    for rel, expected in pinned.items():
        path = os.path.join(site_packages, rel)
        if not os.path.isfile(path):
            bad.append(f"missing {path}")
        elif sha256_file(path) != expected:
            bad.append(f"changed {path}")
    if bad:
        raise SystemExit("pinned VBench files do not match: " + "; ".join(bad))


def submodules_for(dimension: str, cache_dir: str, vbench_dir: str):
    """VBench's local-mode arguments for one dimension (what init_submodules(local=True) would build)."""
    c = cache_dir
    if dimension == "temporal_flickering":
        return []
    if dimension == "background_consistency":
        return [f"{c}/clip_model/ViT-B-32.pt", False]
    if dimension == "motion_smoothness":
        return {"config": f"{vbench_dir}/third_party/amt/cfgs/AMT-S.yaml", "ckpt": f"{c}/amt_model/amt-s.pth"}
    if dimension == "dynamic_degree":
        return {"model": f"{c}/raft_model/models/raft-things.pth"}
    if dimension == "subject_consistency":
        return {"repo_or_dir": f"{c}/dino_model/facebookresearch_dino_main/",
                "path": f"{c}/dino_model/dino_vitbase16_pretrain.pth", "model": "dino_vitb16", "source": "local",
                "read_frame": False}
    if dimension == "aesthetic_quality":
        return [f"{c}/clip_model/ViT-L-14.pt", f"{c}/aesthetic_model/emb_reader"]
    if dimension == "imaging_quality":
        return {"model_path": f"{c}/pyiqa_model/musiq_spaq_ckpt-358bb6af.pth"}
    if dimension == "overall_consistency":
        return {"pretrain": f"{c}/ViCLIP/ViClip-InternVid-10M-FLT.pth"}
    raise ValueError(f"unsupported dimension {dimension!r}")


def decode_problem(path: str):
    """None when both of VBench's readers (cv2 for temporal_flickering, decord for the rest) read >= 2 frames."""
    import cv2

    if not os.path.isfile(path):
        return f"clip file missing: {path}"
    capture = cv2.VideoCapture(path)
    frames = 0
    while capture.isOpened() and frames < 2:
        ok, _ = capture.read()
        if not ok:
            break
        frames += 1
    capture.release()
    if frames < 2:
        return f"VBench cannot decode {path}: OpenCV read {frames} frame(s)"
    try:
        import decord

        reader = decord.VideoReader(path, num_threads=1)
        if len(reader) < 2:
            return f"VBench cannot decode {path}: decord sees {len(reader)} frame(s)"
        reader.get_batch([len(reader) - 1])
    except Exception as exc:  # decord raises its own DECORDError; report, never skip silently
        return f"VBench cannot decode {path}: decord: {type(exc).__name__}: {exc}"
    return None


def as_score(value):
    """A finite float, or raise: VBench's per-video value (dynamic_degree's is a bool)."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"VBench returned a non-finite score ({value})")
    return value


def compute(dimension: str, clips: list, work_dir: str, device: str, cache_dir: str, vbench_dir: str, tag: str):
    """Run one dimension over ``clips``; ``{path: score}`` of what VBench returned."""
    import importlib

    info_path = os.path.join(work_dir, f"{dimension}-{tag}_full_info.json")
    info = [{"prompt_en": c["prompt"], "dimension": [dimension], "video_list": [c["path"]]} for c in clips]
    with open(info_path, "w", encoding="utf-8") as handle:
        json.dump(info, handle)
    module = importlib.import_module(f"vbench.{dimension}")
    evaluate = getattr(module, f"compute_{dimension}")
    submodules = submodules_for(dimension, cache_dir, vbench_dir)
    kwargs = {"imaging_quality_preprocessing_mode": "longer"} if dimension == "imaging_quality" else {}
    _aggregate, video_results = evaluate(info_path, device, submodules, **kwargs)
    return {os.path.abspath(r["video_path"]): r["video_results"] for r in video_results}


def score_dimension(dimension: str, clips: list, work_dir: str, device: str, cache_dir: str, vbench_dir: str):
    out = {"error": None, "clips": {}}
    missing = [os.path.join(cache_dir, rel) for rel in CHECKPOINTS[dimension]
               if not os.path.exists(os.path.join(cache_dir, rel))]
    if missing:
        out["error"] = f"missing checkpoint for {dimension}: " + ", ".join(f"{p} does not exist" for p in missing)
        for c in clips:
            out["clips"][c["key"]] = {"value": None, "error": out["error"]}
        return out
    if not clips:
        return out

    def record(clip, results):
        path = os.path.abspath(clip["path"])
        if path not in results:
            out["clips"][clip["key"]] = {"value": None, "error": "VBench returned no score for this clip"}
            return
        try:
            out["clips"][clip["key"]] = {"value": as_score(results[path]), "error": None}
        except (TypeError, ValueError) as exc:
            out["clips"][clip["key"]] = {"value": None, "error": str(exc)}

    try:
        results = compute(dimension, clips, work_dir, device, cache_dir, vbench_dir, "all")
        for clip in clips:
            record(clip, results)
        return out
    except Exception as exc:  # isolate the clip that broke the batch, one clip at a time
        batch_error = f"{type(exc).__name__}: {exc}"
        sys.stderr.write(f"[vbench_runner] {dimension} failed on the batch: {batch_error}\n{traceback.format_exc()}")
    for index, clip in enumerate(clips):
        try:
            record(clip, compute(dimension, [clip], work_dir, device, cache_dir, vbench_dir, str(index)))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            out["clips"][clip["key"]] = {"value": None, "error": error}
            if index == 0 and error == batch_error:  # the dimension itself fails, not one clip
                out["error"] = error
                for other in clips[1:]:
                    out["clips"][other["key"]] = {"value": None, "error": error}
                break
    return out


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def main(argv: list) -> int:
    if len(argv) != 3:
        sys.stderr.write("usage: vbench_runner.py REQUEST.json RESULT.json\n")
        return 2
    with open(argv[1], encoding="utf-8") as handle:
        request = json.load(handle)
    os.environ["VBENCH_CACHE_DIR"] = request["cache_dir"]  # vbench.utils reads it at import time
    block_network()
    check_pinned_files(request.get("pinned_files", {}))
    import importlib.metadata

    import torch
    import vbench  # noqa: F401  (after the pin check: its __init__ executes vbench.utils)

    vbench_dir = os.path.dirname(os.path.abspath(vbench.__file__))
    device = resolve_device(request.get("device", "auto"))
    work_dir = request.get("work_dir") or tempfile.mkdtemp(prefix="vbench-runner-")
    os.makedirs(work_dir, exist_ok=True)

    decode = {c["key"]: decode_problem(c["path"]) for c in request["clips"]}
    decodable = [c for c in request["clips"] if decode[c["key"]] is None]
    result = {
        "version": RESULT_VERSION,
        "vbench_version": importlib.metadata.version("vbench"),
        "mode": "custom_input",
        "device": device,
        "device_name": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
        "torch_version": torch.__version__,
        "decode_errors": {k: v for k, v in decode.items() if v},
        "dimensions": {},
    }
    for dimension in request["dimensions"]:
        start = time.monotonic()
        scored = score_dimension(dimension, decodable, work_dir, device, request["cache_dir"], vbench_dir)
        for key, problem in result["decode_errors"].items():
            scored["clips"][key] = {"value": None, "error": problem}
        scored["seconds"] = round(time.monotonic() - start, 3)
        result["dimensions"][dimension] = scored
    out_dir = os.path.dirname(os.path.abspath(argv[2]))
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".vbench-result.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=2)
    os.replace(tmp, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
