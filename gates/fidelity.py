"""The fidelity gate: how far is each candidate frame from the baseline frame of the same seed?

Per frame, on the decoded frames of both clips (codec noise is the same on both sides only when the frames are;
bit-identical pairs are short-circuited by the runner and give exactly zero difference):

- **LPIPS** with the ``lpips`` package (v0.1, AlexNet trunk, the package's own linear heads). The AlexNet trunk
  weights come from the local torch hub cache (``alexnet-owt-7be5be79.pth``); when the file is missing the pair
  gets an error that names the file, the folder and how to fetch it on a connected machine. Nothing downloads.
  Option ``lpips_trunk=rand`` (or ``H3EVAL_LPIPS_TRUNK=rand``) uses the package's ``pnet_rand=True`` trunk with a
  fixed seed instead: for tests and offline demos only, written to ``info["lpips_trunk"]``.
  LPIPS runs at ``lpips_scale`` of the clip's resolution (area downsampling; default 0.5: 384x672 for H3's
  768x1344) on every ``lpips_stride``-th frame (default 2); both are written to ``info`` and skipped frames are
  None in the series. LPIPS is most of the gate's cost (about 0.25 CPU s per frame pair at 384x672 on the 2-core
  CPU, 0.35 before :func:`lpips_distance` and OpenCV's area downsampling), and every second frame halves it towards issue 19's 30 s for all per-pair gates. What stride 2 changes,
  measured against every frame on 24 pairs of real footage and camera pans (bench/fidelity_stride/results/fidelity_stride.md, 72
  frames, the package's random trunk): the pair's LPIPS mean by at most 6.8 %, its 95th percentile by at most 7.3 %,
  its worst frame only downwards and by at most 12 % (a defect confined to one skipped frame is missed by LPIPS;
  SSIM and PSNR still score every frame). ``lpips_stride=1`` scores every frame.
- **SSIM** on BT.601 luma (Wang et al. 2004: 11-tap Gaussian window, sigma 1.5, K1 0.01, K2 0.03, population
  covariance; the mean over the valid region), the same definition as
  ``skimage.metrics.structural_similarity(..., gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
  data_range=255)``.
- **PSNR** over the three RGB channels with peak 255. A frame identical to its baseline has infinite PSNR; like
  libvmaf (psnr_max = 6 * bpc + 12 dB) every per-frame value is capped at ``PSNR_CAP_DB`` = 60 dB for 8-bit
  video, so identical frames read 60 dB and the number of identical frames is in ``info``.

Per clip: mean, 95th percentile (numpy's linear interpolation) and worst frame of LPIPS; mean and worst of SSIM and
PSNR; and the spatial LPIPS map of the worst frame as a PNG (baseline | candidate | map).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pydantic import Field

from gates.base import Gate, GateInputError, GateOptions, GateResult, MetricSpec, PairContext, register_gate
from gates.common import metric, new_result, relative_to_run

logger = logging.getLogger(__name__)

PSNR_CAP_DB = 60.0
"""Per-frame PSNR ceiling for 8-bit video, libvmaf's ``psnr_max = 6 * bpc + 12``; identical frames read this."""
ALEXNET_WEIGHTS = "alexnet-owt-7be5be79.pth"
"""The torchvision AlexNet (IMAGENET1K_V1) file the lpips package's trunk loads from the torch hub cache."""
FETCH_COMMAND = "python -c \"import torchvision; torchvision.models.alexnet(weights='IMAGENET1K_V1')\""
RAND_TRUNK_SEED = 0
DEFAULT_LPIPS_SCALE = 0.5
DEFAULT_LPIPS_STRIDE = 2
LPIPS_BATCH = 4

SSIM_SIGMA = 1.5
SSIM_TRUNCATE = 3.5  # scipy.ndimage.gaussian_filter's default, as scikit-image uses it: radius 5, 11 taps
SSIM_K1, SSIM_K2, SSIM_L = 0.01, 0.03, 255.0

_models: dict[tuple[str, str], Any] = {}
_models_lock = threading.Lock()


# -- LPIPS -------------------------------------------------------------------------------------------------------
def alexnet_weights_path() -> Path:
    """Where torchvision looks for the AlexNet trunk: ``$TORCH_HOME/hub/checkpoints`` (torch.hub.get_dir())."""
    import torch

    return Path(torch.hub.get_dir()) / "checkpoints" / ALEXNET_WEIGHTS


def missing_weights_message(path: Path) -> str:
    return (
        f"LPIPS needs the AlexNet trunk weights {path.name}, which are not in {path.parent} (the torch hub cache: "
        f"$TORCH_HOME/hub/checkpoints, by default ~/.cache/torch/hub/checkpoints). Nothing is downloaded at run "
        f"time: on a connected machine run `{FETCH_COMMAND}`, then copy ~/.cache/torch/hub/checkpoints/{path.name} "
        f"from there to {path}. (For tests only: --option lpips_trunk=rand uses a random trunk.)"
    )


def load_lpips(trunk: str = "alexnet", device: str = "cpu"):
    """The ``lpips.LPIPS`` model (v0.1, AlexNet) for ``trunk`` in {"alexnet", "rand"}, cached per device."""
    import torch

    if trunk not in ("alexnet", "rand"):
        raise GateInputError(f"option lpips_trunk={trunk!r}: use 'alexnet' (the real metric) or 'rand' (tests only)")
    key = (trunk, device)
    with _models_lock:
        if key in _models:
            return _models[key]
        if trunk == "alexnet":
            path = alexnet_weights_path()
            if not path.is_file():
                raise GateInputError(missing_weights_message(path))
        import lpips

        with warnings.catch_warnings():
            # torchvision's deprecation notes about `pretrained=`, which the lpips package still passes.
            warnings.simplefilter("ignore", UserWarning)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(RAND_TRUNK_SEED)
                model = lpips.LPIPS(net="alex", version="0.1", pnet_rand=(trunk == "rand"), verbose=False)
        model = model.eval().to(device)
        _models[key] = model
        return model


def _as_tensor(frames, device: str):
    """uint8 frames as a torch tensor on ``device``: a tensor already there as it is (the device copy the clip cache
    holds), a numpy array copied (the cached frames are read-only, and torch wants writable memory)."""
    import torch

    if torch.is_tensor(frames):
        return frames.to(device)
    return torch.from_numpy(np.array(frames, copy=True)).to(device)


def _to_lpips_input(frames, scale: float, device: str):
    """uint8 (N, H, W, 3) (numpy or a torch tensor) -> float32 (N, 3, h, w) in [-1, 1] at ``scale`` (area
    downsampling: torch's ``interpolate(mode="area")``).

    On the CPU, when ``scale`` is an exact integer factor of both sides (H3's 768x1344 at 0.5), the same block mean
    comes from OpenCV's INTER_AREA on float32 frames, about 3x less CPU time than torch's adaptive pooling over the
    full-resolution planes (tests: equal to torch's to float32 rounding, and LPIPS to the package's tolerance)."""
    import torch
    import torch.nn.functional as F

    h, w = frames.shape[1:3]
    size = (max(1, round(h * scale)), max(1, round(w * scale)))
    k = h // size[0]
    if device == "cpu" and scale != 1.0 and size[0] * k == h and size[1] * k == w:
        import cv2

        frames_np = frames.numpy() if torch.is_tensor(frames) else np.asarray(frames)
        out = np.empty((len(frames_np), size[0], size[1], 3), dtype=np.float32)
        for i, frame in enumerate(frames_np):
            out[i] = cv2.resize(frame.astype(np.float32), (size[1], size[0]), interpolation=cv2.INTER_AREA)
        return torch.from_numpy(out).permute(0, 3, 1, 2).div_(127.5).sub_(1.0)
    x = _as_tensor(frames, device).permute(0, 3, 1, 2).float().div_(127.5).sub_(1.0)
    if scale != 1.0:
        x = F.interpolate(x, size=size, mode="area")
    return x


def lpips_distance(model, x0, x1):
    """LPIPS v0.1 of image batches ``x0``, ``x1`` (float32 (N, 3, h, w) in [-1, 1]), float32 (N,): the package's
    ``model(x0, x1)`` (lpips.LPIPS.forward, ``spatial=False``) computed with less work, not a different metric.

    The same steps: the scaling layer, the trunk's five ReLU outputs, each unit-normalized over channels (norm +
    1e-10, lpips.normalize_tensor), the squared difference, the linear head (a 1x1 convolution without bias: a
    weighted channel sum) and the spatial mean, summed over layers. What differs is the order of the sums only:
    both sides go through the trunk in one batch, and the head sums the squared difference over space before
    weighting the channels (the two sums commute). On the 2-core CPU this halves the head's time and cuts the
    trunk's by about a sixth; tests/test_gate_fidelity.py pins it to the package to rtol 1e-5."""
    import torch

    n = len(x0)
    outs = model.net.forward(model.scaling_layer(torch.cat([x0, x1])))
    total = None
    for feat, lin in zip(outs, model.lins):
        weight = lin.model[-1].weight.reshape(-1)  # Conv2d(chn, 1, 1, bias=False); the Dropout is off in eval
        norm = torch.linalg.vector_norm(feat, dim=1, keepdim=True).add_(1e-10)
        a, b = feat[:n], feat[n:]
        diff = torch.addcdiv(a / norm[:n], b, norm[n:], value=-1.0).square_()
        layer = diff.sum(dim=(2, 3)) @ weight / (diff.shape[2] * diff.shape[3])
        total = layer if total is None else total + layer
    return total


def lpips_per_frame(
    model, base: np.ndarray, cand: np.ndarray, scale: float = 1.0, device: str = "cpu", batch: int = LPIPS_BATCH
) -> np.ndarray:
    """LPIPS distance of each frame pair, float64 (N,). Frames identical in the input are exactly 0."""
    import torch

    out = np.zeros(len(base), dtype=np.float64)
    # TF32 off: on Ampere and later, cuDNN would otherwise run the trunk's convolutions at 10-bit mantissa.
    with torch.inference_mode(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for start in range(0, len(base), batch):
            b, c = base[start : start + batch], cand[start : start + batch]
            d = lpips_distance(model, _to_lpips_input(b, scale, device), _to_lpips_input(c, scale, device))
            out[start : start + len(b)] = d.double().cpu().numpy()
    return out


def lpips_map(model, base: np.ndarray, cand: np.ndarray, scale: float, device: str) -> np.ndarray:
    """The spatial LPIPS map (h, w) of one frame pair at ``scale``: the package's own ``spatial=True`` output."""
    import torch

    spatial = model.spatial
    model.spatial = True
    try:
        with torch.inference_mode(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            d = model(_to_lpips_input(base[None], scale, device), _to_lpips_input(cand[None], scale, device))
    finally:
        model.spatial = spatial
    return d[0, 0].double().cpu().numpy()


# -- SSIM and PSNR -----------------------------------------------------------------------------------------------
def _gaussian_taps() -> np.ndarray:
    radius = int(SSIM_TRUNCATE * SSIM_SIGMA + 0.5)
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    taps = np.exp(-0.5 * (x / SSIM_SIGMA) ** 2)
    return taps / taps.sum()


def luma(frames: np.ndarray) -> np.ndarray:
    """BT.601 luma of uint8 RGB frames, float64 on the 0-255 scale (the plane SSIM is computed on)."""
    f = frames.astype(np.float64)
    return 0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2]


def ssim_per_frame(base: np.ndarray, cand: np.ndarray, device: str = "cpu", batch: int = 8,
                   workers: int | None = None) -> np.ndarray:
    """SSIM of the luma of each frame pair (definition in the module docstring), float64 (N,).

    On the CPU, float32 with OpenCV's separable filter (about 20x faster there than torch's depthwise convolution),
    frames split over ``workers`` threads (default: the CPU count, at most 8): numpy's elementwise steps run on one
    core and release the GIL, so two threads nearly halve the wall time on the 2-core CPU with the same numbers per
    frame. On a GPU (or ``torch:cpu``: that path on the CPU), float32 torch convolutions with TF32 off. Both are
    tested against scikit-image.
    """
    if device == "cpu":
        workers = workers or min(os.cpu_count() or 1, 8)
        if workers <= 1 or len(base) < 2:
            return _ssim_cpu(base, cand)
        from concurrent.futures import ThreadPoolExecutor

        bounds = np.linspace(0, len(base), min(workers, len(base)) + 1).astype(int)
        with ThreadPoolExecutor(len(bounds) - 1, thread_name_prefix="ssim") as pool:
            parts = pool.map(lambda lo, hi: _ssim_cpu(base[lo:hi], cand[lo:hi]), bounds[:-1], bounds[1:])
            return np.concatenate(list(parts))
    return _ssim_torch(base, cand, device.removeprefix("torch:"), batch)


def _ssim_cpu(base: np.ndarray, cand: np.ndarray) -> np.ndarray:
    import cv2

    taps = _gaussian_taps().astype(np.float32)
    r = len(taps) // 2
    c1, c2 = (SSIM_K1 * SSIM_L) ** 2, (SSIM_K2 * SSIM_L) ** 2
    weights = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    out = np.zeros(len(base), dtype=np.float64)

    def blur(x):
        # Only the valid region (no pixel of the window outside the frame) is kept, so the border mode is moot.
        return cv2.sepFilter2D(x, cv2.CV_32F, taps, taps, borderType=cv2.BORDER_REFLECT)[r:-r, r:-r]

    for i in range(len(base)):
        # float32 luma centred at 128, so that the moments keep their precision (variance = E[x^2] - E[x]^2).
        a = base[i].astype(np.float32) @ weights - 128.0
        b = cand[i].astype(np.float32) @ weights - 128.0
        mu_a, mu_b = blur(a), blur(b)
        var_a = blur(a * a) - mu_a * mu_a
        var_b = blur(b * b) - mu_b * mu_b
        cov = blur(a * b) - mu_a * mu_b
        mu_a += 128.0
        mu_b += 128.0
        num = (2 * mu_a * mu_b + c1) * (2 * cov + c2)
        den = (mu_a * mu_a + mu_b * mu_b + c1) * (var_a + var_b + c2)
        out[i] = float(np.mean(num / den, dtype=np.float64))
    return out


def _ssim_torch(base: np.ndarray, cand: np.ndarray, device: str, batch: int) -> np.ndarray:
    import torch
    import torch.nn.functional as F

    taps = torch.tensor(_gaussian_taps(), dtype=torch.float32, device=device)
    k = len(taps)
    wx = taps.view(1, 1, 1, k).repeat(5, 1, 1, 1)
    wy = taps.view(1, 1, k, 1).repeat(5, 1, 1, 1)
    c1, c2 = (SSIM_K1 * SSIM_L) ** 2, (SSIM_K2 * SSIM_L) ** 2
    coeffs = torch.tensor([0.299, 0.587, 0.114], dtype=torch.float32, device=device).view(1, 3, 1, 1)
    out = np.zeros(len(base), dtype=np.float64)
    with torch.inference_mode(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for start in range(0, len(base), batch):
            def plane(frames):
                x = _as_tensor(frames, device).permute(0, 3, 1, 2).float()
                # Centred at 128 so that float32 moments keep their precision (variance = E[x^2] - E[x]^2).
                return (x * coeffs).sum(dim=1, keepdim=True) - 128.0

            a, b = plane(base[start : start + batch]), plane(cand[start : start + batch])
            maps = torch.cat([a, b, a * a, b * b, a * b], dim=1)
            blurred = F.conv2d(F.conv2d(maps, wx, groups=5), wy, groups=5)  # valid region only
            mu_a, mu_b, e_aa, e_bb, e_ab = blurred.unbind(dim=1)
            var_a, var_b, cov = e_aa - mu_a * mu_a, e_bb - mu_b * mu_b, e_ab - mu_a * mu_b
            mu_a, mu_b = mu_a + 128.0, mu_b + 128.0
            num = (2 * mu_a * mu_b + c1) * (2 * cov + c2)
            den = (mu_a * mu_a + mu_b * mu_b + c1) * (var_a + var_b + c2)
            ssim = (num / den).double().mean(dim=(1, 2))
            out[start : start + len(a)] = ssim.cpu().numpy()
    return out


def psnr_per_frame(base, cand, batch: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(PSNR capped at PSNR_CAP_DB, MSE) of each frame pair over RGB with peak 255, float64 (N,) each. Frames as
    numpy arrays (the CPU) or torch tensors on one device (a GPU): the same exact integer sum of squares."""
    mse = np.zeros(len(base), dtype=np.float64)
    for start in range(0, len(base), batch):
        b, c = base[start : start + batch], cand[start : start + batch]
        if isinstance(b, np.ndarray):
            import cv2

            # Exact integer sum of squares: |difference| (uint8), squared in uint16 (<= 65025), summed in uint64;
            # about 4x less CPU time than an int32 difference through einsum.
            sse = np.empty(len(b), dtype=np.int64)
            for j in range(len(b)):
                ad = cv2.absdiff(b[j], c[j]).astype(np.uint16)
                sse[j] = int(np.multiply(ad, ad).sum(dtype=np.uint64))
        else:
            import torch

            diff = b.to(torch.int32) - c.to(torch.int32)
            sse = (diff * diff).reshape(len(diff), -1).sum(dim=1, dtype=torch.int64).cpu().numpy()
        mse[start : start + len(b)] = sse / float(np.prod(tuple(b.shape[1:])))
    with np.errstate(divide="ignore"):
        psnr = 10.0 * np.log10(SSIM_L**2 / mse)
    return np.minimum(psnr, PSNR_CAP_DB), mse


# -- heatmap -----------------------------------------------------------------------------------------------------
_HEAT = np.array([[0, 0, 0], [120, 0, 40], [230, 60, 0], [255, 200, 0], [255, 255, 255]], dtype=np.float64)


def heat_colors(values: np.ndarray, vmax: float) -> np.ndarray:
    """Map values in [0, vmax] to uint8 RGB (black -> red -> yellow -> white)."""
    t = np.clip(values / vmax, 0.0, 1.0) * (len(_HEAT) - 1) if vmax > 0 else np.zeros_like(values)
    low = np.floor(t).astype(int).clip(0, len(_HEAT) - 2)
    frac = (t - low)[..., None]
    return np.rint(_HEAT[low] * (1 - frac) + _HEAT[low + 1] * frac).astype(np.uint8)


def write_worst_frame_png(path: Path, base: np.ndarray, cand: np.ndarray, spatial: np.ndarray) -> float:
    """baseline | candidate | LPIPS map (scaled to its own maximum, returned) side by side, at the map's size."""
    from PIL import Image

    from h3.atomic import atomic_write_bytes

    h, w = spatial.shape
    tiles = [np.asarray(Image.fromarray(f).resize((w, h), Image.Resampling.BOX)) for f in (base, cand)]
    vmax = float(spatial.max())
    tiles.append(heat_colors(spatial, vmax))
    import io

    buffer = io.BytesIO()
    Image.fromarray(np.concatenate(tiles, axis=1)).save(buffer, format="PNG")
    atomic_write_bytes(path, buffer.getvalue())
    return vmax


# -- the gate ----------------------------------------------------------------------------------------------------
def check_same_shape(base: np.ndarray, base_fps: float, cand: np.ndarray, cand_fps: float, ctx: PairContext) -> None:
    problems = []
    if base.shape[1:3] != cand.shape[1:3]:
        problems.append(f"resolution {base.shape[2]}x{base.shape[1]} vs {cand.shape[2]}x{cand.shape[1]}")
    if len(base) != len(cand):
        problems.append(f"frame count {len(base)} vs {len(cand)}")
    if abs(base_fps - cand_fps) > 1e-3:
        problems.append(f"fps {base_fps:g} vs {cand_fps:g}")
    if problems:
        raise GateInputError(
            f"cannot compare {ctx.baseline.mp4} with {ctx.candidate.mp4} frame by frame: " + "; ".join(problems)
        )


def _take(frames, indices: np.ndarray):
    """``frames[indices]`` for numpy frames or a torch tensor (on its device)."""
    if isinstance(frames, np.ndarray):
        return frames[indices]
    import torch

    return frames[torch.as_tensor(indices, dtype=torch.long, device=frames.device)]


def _stats(values: np.ndarray) -> tuple[float, float, float, int]:
    """mean, 95th percentile (linear), max, argmax."""
    return float(values.mean()), float(np.percentile(values, 95)), float(values.max()), int(values.argmax())


class FidelityOptions(GateOptions):
    lpips_trunk: Literal["alexnet", "rand"] = Field(
        default_factory=lambda: os.environ.get("H3EVAL_LPIPS_TRUNK") or "alexnet", validate_default=True)
    """``alexnet`` (the real metric, weights from the torch hub cache) or ``rand`` (tests only); default from
    ``$H3EVAL_LPIPS_TRUNK``, else alexnet. Any other value is refused before the run, not per pair."""
    lpips_scale: float = Field(default=DEFAULT_LPIPS_SCALE, gt=0, le=1)
    """Frames are resized by this factor before LPIPS."""
    lpips_stride: int = Field(default=DEFAULT_LPIPS_STRIDE, ge=1)
    """LPIPS on every n-th frame (SSIM and PSNR on every frame)."""


@register_gate
class FidelityGate(Gate):
    name = "fidelity"
    needs = ("video",)
    description = "Per-frame LPIPS (AlexNet), SSIM and PSNR of candidate vs baseline; worst-frame LPIPS map."
    Options = FidelityOptions
    metrics = {
        "lpips_mean": MetricSpec(higher_is_better=False), "lpips_p95": MetricSpec(higher_is_better=False),
        "lpips_worst": MetricSpec(higher_is_better=False), "ssim_mean": MetricSpec(higher_is_better=True),
        "ssim_worst": MetricSpec(higher_is_better=True), "psnr_mean": MetricSpec(higher_is_better=True, unit="dB"),
        "psnr_worst": MetricSpec(higher_is_better=True, unit="dB"),
    }

    def evaluate(self, ctx: PairContext) -> GateResult:
        from gates.media_cache import load_video, load_video_on

        options = self.parse_options(ctx.options)
        # "cuda...": the GPU path (frames on the device); "torch:cpu" runs that same path on the CPU (tests).
        on_device = str(ctx.device).startswith(("cuda", "torch:"))
        device = str(ctx.device).removeprefix("torch:")
        trunk, scale, stride = options.lpips_trunk, options.lpips_scale, options.lpips_stride
        model = load_lpips(trunk, device)  # before decoding: a missing weight file fails fast

        base, base_fps = load_video(ctx.baseline.mp4)
        cand, cand_fps = load_video(ctx.candidate.mp4)
        check_same_shape(base, base_fps, cand, cand_fps, ctx)
        n = len(base)
        result = new_result(self.name, ctx)
        if on_device:
            # On a GPU every per-frame computation reads the clip cache's device copy (uploaded once per clip for
            # all the gates of the pair): the same arithmetic as on the CPU, tested equal there.
            base_x, _ = load_video_on(ctx.baseline.mp4, device)
            cand_x, _ = load_video_on(ctx.candidate.mp4, device)
            identical = (base_x == cand_x).reshape(n, -1).all(dim=1).cpu().numpy()
        else:
            base_x, cand_x = base, cand
            identical = np.array([np.array_equal(base[i], cand[i]) for i in range(n)])
        lpips_h, lpips_w = max(1, round(base.shape[1] * scale)), max(1, round(base.shape[2] * scale))
        result.info.update(
            lpips_trunk="alexnet (torchvision IMAGENET1K_V1)" if trunk == "alexnet" else f"random (pnet_rand, seed {RAND_TRUNK_SEED}; tests only)",
            lpips_version="0.1",
            lpips_resolution=[lpips_h, lpips_w],
            lpips_scale=scale,
            lpips_stride=stride,
            ssim_plane="BT.601 luma",
            psnr_cap_db=PSNR_CAP_DB,
            num_frames=n,
            identical_frames=int(identical.sum()),
            device=device,
        )

        sampled = np.arange(0, n, stride)
        lp = np.full(n, np.nan)
        ssim = np.ones(n)
        psnr = np.full(n, PSNR_CAP_DB)
        todo = np.flatnonzero(~identical)
        lp[sampled] = 0.0
        lp_todo = np.intersect1d(sampled, todo)
        if len(lp_todo):
            lp[lp_todo] = lpips_per_frame(model, _take(base_x, lp_todo), _take(cand_x, lp_todo), scale, device)
        if len(todo):
            ssim[todo] = ssim_per_frame(_take(base_x, todo), _take(cand_x, todo), "torch:" + device if on_device
                                        else device)
            psnr[todo], _ = psnr_per_frame(_take(base_x, todo), _take(cand_x, todo))

        lp_s = lp[sampled]
        lp_mean, lp_p95, lp_max, worst_pos = _stats(lp_s)
        worst = int(sampled[worst_pos])
        result.metrics = {
            "lpips_mean": metric(lp_mean, False),
            "lpips_p95": metric(lp_p95, False),
            "lpips_worst": metric(lp_max, False),
            "ssim_mean": metric(ssim.mean(), True),
            "ssim_worst": metric(ssim.min(), True),
            "psnr_mean": metric(psnr.mean(), True, "dB"),
            "psnr_worst": metric(psnr.min(), True, "dB"),
        }
        result.series = {
            "lpips": [None if np.isnan(v) else float(v) for v in lp],
            "ssim": [float(v) for v in ssim],
            "psnr": [float(v) for v in psnr],
        }
        result.info.update(
            lpips_worst_frame=worst, ssim_worst_frame=int(ssim.argmin()), psnr_worst_frame=int(psnr.argmin())
        )
        if not identical[worst]:
            spatial = lpips_map(model, base[worst], cand[worst], scale, device)
            png = Path(ctx.artifact_dir) / f"{ctx.pair.prompt_id}-s{ctx.pair.seed}-lpips-worst.png"
            result.info["lpips_map_max"] = write_worst_frame_png(png, base[worst], cand[worst], spatial)
            result.artifacts.append(relative_to_run(ctx, png))
        return result

    def identical_result(self, ctx: PairContext) -> GateResult:
        """A bit-identical pair (same raw frames): zero LPIPS, SSIM 1, PSNR at its cap, without decoding."""
        result = new_result(self.name, ctx)
        result.identical = True
        result.metrics = {
            "lpips_mean": metric(0.0, False),
            "lpips_p95": metric(0.0, False),
            "lpips_worst": metric(0.0, False),
            "ssim_mean": metric(1.0, True),
            "ssim_worst": metric(1.0, True),
            "psnr_mean": metric(PSNR_CAP_DB, True, "dB"),
            "psnr_worst": metric(PSNR_CAP_DB, True, "dB"),
        }
        result.info.update(psnr_cap_db=PSNR_CAP_DB, short_circuit="frames_sha256 and pcm_sha256 equal")
        return result
