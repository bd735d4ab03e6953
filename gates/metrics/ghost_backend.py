"""Array backends of the paired ghost estimator: numpy + scipy.fft on the CPU, torch on any device; the estimator
(:mod:`gates.metrics.ghost_fit`) is written once over both. Not a metric (``higher_is_better`` None)."""

from __future__ import annotations

import numpy as np

higher_is_better = None

# Luma weights (ITU-R BT.601), the ones the H.264 yuv420p path of the runtime uses.
LUMA = np.array([0.299, 0.587, 0.114])


class NumpyBackend:
    torch = False

    def __init__(self, workers: int):
        self.workers = workers

    def asarray(self, x):
        return np.asarray(x, dtype=np.float64)

    def index(self, x):
        return np.asarray(x, dtype=np.int64)

    def numpy(self, x) -> np.ndarray:
        return np.asarray(x)

    def stack(self, xs, axis=0):
        return np.stack(xs, axis=axis)

    def zeros(self, shape):
        return np.zeros(shape)

    def rfft2(self, x):
        from scipy import fft as sfft

        return sfft.rfft2(x, workers=self.workers)

    def irfft2(self, x, s):
        from scipy import fft as sfft

        return sfft.irfft2(x, s=s, workers=self.workers)

    def conj(self, x):
        return np.conj(x)

    def pinv(self, x):
        return np.linalg.pinv(x)

    def clip0(self, x):
        return np.maximum(x, 0.0)

    def minimum(self, a, b):
        return np.minimum(a, b)

    def swap(self, x):
        return np.swapaxes(x, -1, -2)

    def blur(self, x, sigma: float):
        """Gaussian blur of (k, h, w) frames (cv2's kernel, BORDER_REFLECT), float64."""
        import cv2

        return np.stack([cv2.GaussianBlur(f, (0, 0), sigma, borderType=cv2.BORDER_REFLECT) for f in x])

    def integral(self, x):
        """Integral images with a leading zero row and column: (k, h + 1, w + 1)."""
        out = np.zeros(x.shape[:-2] + (x.shape[-2] + 1, x.shape[-1] + 1))
        out[..., 1:, 1:] = x.cumsum(-1).cumsum(-2)
        return out

    def prepare(self, frames: np.ndarray, indices: list[int], factor: int, sigma: float):
        """uint8 (T, H, W, 3) -> float64 (len(indices), h, w): luma - 128, box-downsampled, Gaussian-blurred."""
        import cv2

        _, h, w, _ = frames.shape
        hh, ww = h // factor, w // factor
        weights = LUMA.astype(np.float32)
        out = np.empty((len(indices), hh, ww))
        for j, i in enumerate(indices):
            y = frames[i, : hh * factor, : ww * factor].astype(np.float32) @ weights
            if factor > 1:
                # INTER_AREA with an integer factor is the exact block mean.
                y = cv2.resize(y, (ww, hh), interpolation=cv2.INTER_AREA)
            if sigma > 0:
                y = cv2.GaussianBlur(y, (0, 0), sigma, borderType=cv2.BORDER_REFLECT)
            out[j] = y
        return out - 128.0


class TorchBackend:
    """The same operations in torch (float64), on ``device``. Preparation matches :meth:`NumpyBackend.prepare` (same
    kernel, same symmetric border) up to float32 rounding."""

    torch = True

    def __init__(self, device: str):
        import torch

        self.t = torch
        self.device = torch.device(device)

    def asarray(self, x):
        return self.t.as_tensor(np.asarray(x), dtype=self.t.float64, device=self.device)

    def index(self, x):
        return self.t.as_tensor(np.asarray(x), dtype=self.t.int64, device=self.device)

    def numpy(self, x) -> np.ndarray:
        return x.detach().cpu().numpy()

    def stack(self, xs, axis=0):
        return self.t.stack(xs, dim=axis)

    def zeros(self, shape):
        return self.t.zeros(shape, dtype=self.t.float64, device=self.device)

    def rfft2(self, x):
        return self.t.fft.rfft2(x)

    def irfft2(self, x, s):
        return self.t.fft.irfft2(x, s=s)

    def conj(self, x):
        return x.conj()

    def pinv(self, x):
        return self.t.linalg.pinv(x)

    def clip0(self, x):
        return self.t.clamp(x, min=0.0)

    def minimum(self, a, b):
        return self.t.minimum(a, b)

    def swap(self, x):
        return x.transpose(-1, -2)

    def integral(self, x):
        return self.t.nn.functional.pad(x.cumsum(-1).cumsum(-2), (1, 0, 1, 0))

    def blur(self, x, sigma: float):
        import cv2

        size = int(round(sigma * 8 + 1)) | 1
        kernel = self.t.tensor(cv2.getGaussianKernel(size, sigma).ravel(), dtype=x.dtype, device=self.device)
        return self._blur(x, kernel)

    def prepare(self, frames: np.ndarray, indices: list[int], factor: int, sigma: float, chunk: int = 8):
        import cv2

        torch, fn = self.t, self.t.nn.functional
        _, h, w, _ = frames.shape
        hh, ww = h // factor, w // factor
        weights = torch.tensor(LUMA, dtype=torch.float32, device=self.device)
        kernel = None
        if sigma > 0:
            # cv2.GaussianBlur's own kernel for (0, 0) and a float image: size round(8 sigma + 1) | 1.
            size = int(round(sigma * 8 + 1)) | 1
            kernel = torch.tensor(cv2.getGaussianKernel(size, sigma).ravel(), dtype=torch.float32, device=self.device)
        outs = []
        for start in range(0, len(indices), chunk):
            idx = indices[start : start + chunk]
            if torch.is_tensor(frames):  # the clip cache's device copy: no upload
                x = frames[torch.as_tensor(idx, device=frames.device), : hh * factor, : ww * factor].to(self.device)
            else:
                x = torch.from_numpy(np.ascontiguousarray(frames[idx, : hh * factor, : ww * factor])).to(self.device)
            y = (x.to(torch.float32) * weights).sum(-1)
            if factor > 1:
                y = fn.avg_pool2d(y[:, None], factor)[:, 0]
            if kernel is not None:
                y = self._blur(y, kernel)
            outs.append(y.to(torch.float64))
        return torch.cat(outs) - 128.0

    def _blur(self, y, kernel):
        """Separable convolution with cv2's BORDER_REFLECT (edge pixel repeated: fedcba|abcdef)."""
        fn = self.t.nn.functional
        r = kernel.numel() // 2
        k = kernel[None, None]
        n, hh, ww = y.shape
        y = self.t.cat([y[:, :, :r].flip(-1), y, y[:, :, -r:].flip(-1)], dim=-1)
        y = fn.conv1d(y.reshape(n * hh, 1, -1), k).reshape(n, hh, ww)
        y = self.t.cat([y[:, :r].flip(-2), y, y[:, -r:].flip(-2)], dim=-2).transpose(1, 2)
        y = fn.conv1d(y.reshape(n * ww, 1, -1), k).reshape(n, ww, hh)
        return y.transpose(1, 2)


def backend(device: str, workers: int):
    """numpy on "cpu"; torch on anything else ("cuda", "cuda:1"); "torch:cpu" runs the torch path on the CPU."""
    if device == "cpu":
        return NumpyBackend(workers)
    return TorchBackend(device.removeprefix("torch:"))

