"""TF32 inside the engine: off by default on CUDA for the curvature fit and the predictive.

On Ampere and later GPUs, PyTorch runs float32 cuDNN convolutions in TF32 by default
(``torch.backends.cudnn.allow_tf32 = True``; CUDA matmuls default to full float32). TF32 keeps 10
mantissa bits, and the Laplace quantities are sums of many products of gradients (KFAC factors,
Jacobian Gram matrices) whose relative errors then reach ~1e-3: on an H200 the GLM probit
predictive of an all-weights KFAC LeNet-5 moved by up to ~1e-2 in probability with cuDNN's TF32
against ~1e-6 without (``benchmarks/gpu.py`` reports this difference on any GPU). So the engine
switches TF32 off inside
``Laplace.fit`` / ``fit_batch`` / ``fit_end``, the fused curvature accumulation and the predictive
(``la(x)``, ``functional_variance``, ``functional_samples``, ``predictive_samples``), and restores
the caller's switches after. Training and anything else outside the engine keep the caller's
choice. ``set_tf32(True)`` lets the engine use TF32 as the caller's switches say (faster
convolutions on CUDA, larger errors). Nothing changes on the CPU.

The first time the engine switches TF32 off it logs one INFO line saying so.
"""

from __future__ import annotations

import functools
import logging
from contextlib import contextmanager

import torch

log = logging.getLogger(__name__)

_state = {"allow_tf32": False, "logged": False}


def set_tf32(allowed: bool) -> None:
    """``True``: the engine leaves the TF32 switches as the caller set them; ``False`` (default): TF32
    off inside the engine's curvature and predictive computations on CUDA."""
    if not isinstance(allowed, bool):
        raise ValueError(f"set_tf32 takes True or False; got {allowed!r}")
    _state["allow_tf32"] = allowed


def _switches() -> tuple[str, object, object]:
    """``(api, matmul, cudnn conv)``: the legacy boolean switches, or the ``fp32_precision`` strings
    where the caller used that newer API (reading the legacy ones then raises ``RuntimeError``)."""
    try:
        return "legacy", torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    except RuntimeError:
        return "fp32_precision", torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision


def _set(api: str, matmul, conv) -> None:
    if api == "legacy":
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = conv
    else:
        torch.backends.cuda.matmul.fp32_precision = matmul
        torch.backends.cudnn.conv.fp32_precision = conv


@contextmanager
def no_tf32(device: torch.device | str | None):
    """Context: TF32 off for CUDA matmuls and cuDNN convolutions when ``device`` is a CUDA device and
    ``set_tf32(True)`` was not called; the caller's switches are restored on exit (also on errors).
    A no-op elsewhere."""
    if device is None or torch.device(device).type != "cuda" or _state["allow_tf32"]:
        yield
        return
    api, matmul, conv = _switches()
    off = (False, False) if api == "legacy" else ("ieee", "ieee")
    if not _state["logged"]:
        _state["logged"] = True
        log.info("Laplace engine on CUDA: TF32 off inside curvature fits and predictives (float32 stays "
                 "float32); laplace_lab.laplace.precision.set_tf32(True) allows it")
    _set(api, *off)
    try:
        yield
    finally:
        _set(api, matmul, conv)


def engine_numerics(method):
    """Decorator for ``Laplace`` methods: the body runs inside ``no_tf32(self.device)``."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with no_tf32(self.device):
            return method(self, *args, **kwargs)

    return wrapper
