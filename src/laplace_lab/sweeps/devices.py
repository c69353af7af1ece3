"""The devices a run asks for, is given and uses.

- ``check_accelerator(trainer_cfg)``: ``trainer.accelerator: gpu`` / ``cuda`` on a machine where
  torch sees no CUDA GPU (nor, for ``gpu``, Apple's MPS), or fewer than ``trainer.devices``, fails
  before any work, naming the option, what torch sees and ``CUDA_VISIBLE_DEVICES``.
- ``device_record(trainer, module)``: what ``status.json["devices"]`` holds (``status.DEVICE_FIELDS``):
  ``cuda_visible_devices`` (as the launcher set it: Ray and SLURM give each job its GPUs through
  it), ``torch_device`` of the model's parameters, the Lightning ``accelerator`` (``cpu``, ``cuda``)
  and its ``device_ids`` (indices among the visible devices), and the CUDA device names.
"""

from __future__ import annotations

import os
from typing import Any

GPU_ACCELERATORS = ("gpu", "cuda")


def check_accelerator(accelerator: str, devices: Any = 1) -> None:
    """Raise a ValueError when ``trainer.accelerator`` (and ``trainer.devices``) ask for CUDA GPUs this
    machine does not have."""
    accelerator = str(accelerator).lower()
    if accelerator not in GPU_ACCELERATORS:
        return
    import torch

    if accelerator == "gpu" and not torch.cuda.is_available() and torch.backends.mps.is_available():
        return  # Lightning's "gpu" is Apple's MPS there
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"torch {torch.__version__} sees {torch.cuda.device_count()} CUDA device(s), CUDA_VISIBLE_DEVICES={visible!r}"
    if not torch.cuda.is_available():
        reason = "this torch has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
        raise ValueError(f"trainer.accelerator={accelerator!r} (trainer=gpu) asks for a CUDA GPU, but {reason} "
                         f"({seen}). Use trainer=cpu or trainer=default (accelerator: auto) on this machine.")
    if isinstance(devices, int) and devices > torch.cuda.device_count():
        raise ValueError(f"trainer.devices={devices} asks for more GPUs than visible ({seen}).")


def device_record(trainer: Any = None, module: Any = None) -> dict[str, Any]:
    """``status.json["devices"]`` of a run (see the module docstring); fields it cannot know are None.

    ``trainer``: a Lightning Trainer or the plain loop's ``PlainTrainer``; ``module``: the ``nn.Module`` that runs (torch is imported
    here only, so that launching a job stays light)."""
    import torch

    record: dict[str, Any] = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    param = next(module.parameters(), None) if module is not None else None
    record["torch_device"] = str(param.device) if param is not None else None
    if trainer is not None:
        record["accelerator"] = (getattr(trainer, "accelerator_name", None)  # the plain loop's, else Lightning's
                                 or type(trainer.accelerator).__name__.removesuffix("Accelerator").lower())
        record["device_ids"] = list(trainer.device_ids)
    else:
        record["accelerator"] = record["device_ids"] = None
    record["cuda_device_names"] = ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                                   if torch.cuda.is_available() else [])
    return record
