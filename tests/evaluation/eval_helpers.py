"""Tiny synthetic data, models and predictors shared by the evaluation tests (CPU, seconds)."""

from __future__ import annotations

import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
torch.set_num_threads(1)

IMG = (1, 8, 8)
N_CLASSES = 3


def make_images(n: int, seed: int) -> TensorDataset:
    """Class c = a bright horizontal band in rows [2c, 2c+2) plus noise; pixels in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, N_CLASSES, (n,), generator=g)
    x = 0.3 * torch.rand((n, *IMG), generator=g)
    for c in range(N_CLASSES):
        x[y == c, :, 2 * c : 2 * c + 2, :] += 0.6
    return TensorDataset(x.clamp(0, 1), y)


def make_mlp(seed: int = 0, train_data: TensorDataset | None = None, steps: int = 60) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, N_CLASSES))
    if train_data is not None:
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        x, y = train_data.tensors
        for _ in range(steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return model.eval()


class TemperedSoftmax:
    """A stand-in for a Laplace predictive: softmax(logits / T), differentiable in x."""

    def __init__(self, model: nn.Module, temperature: float = 3.0):
        self.model, self.temperature = model, temperature

    def __call__(self, x):
        return torch.softmax(self.model(x) / self.temperature, -1)


def read_wandb_keys(run_dir, wait_s: float = 60.0) -> set[str]:
    """Keys of every history/summary record in an offline run's ``run-*.wandb`` file.

    The file is a LevelDB-style log (7-byte ``:W&B`` header, 32 KiB blocks, records with a
    7-byte header ``crc32 u32, length u16, type u8``; types full/first/middle/last) of
    ``wandb_internal_pb2.Record`` protobufs. wandb >= 0.19 has no Python reader for it.
    ``run.finish()`` can return before wandb's writer has flushed the file, so this re-reads
    it until the run's ``exit`` record is there (at most ``wait_s`` seconds), then fails.
    """
    import time
    from pathlib import Path

    deadline = time.monotonic() + wait_s
    while True:
        (path,) = Path(run_dir).glob("run-*.wandb")
        kinds, keys = _parse_wandb_log(path.read_bytes())
        if "exit" in kinds:
            return keys
        if time.monotonic() > deadline:
            raise AssertionError(f"{path}: no exit record after {wait_s} s (records: {kinds})")
        time.sleep(0.2)


def _parse_wandb_log(buf: bytes) -> tuple[list[str], set[str]]:
    """(record types in order, history/summary keys) of a ``run-*.wandb`` byte string."""
    import struct

    from wandb.proto import wandb_internal_pb2

    assert buf[:4] == b":W&B", "not a wandb transaction log"
    block, off, records, partial = 32768, 7, [], b""
    while off + 7 <= len(buf):
        left = block - off % block
        if left < 7:
            off += left
            continue
        _, n, kind = struct.unpack("<IHB", buf[off : off + 7])
        data = buf[off + 7 : off + 7 + n]
        if len(data) < n:
            break  # a record still being written
        off += 7 + n
        if kind == 1:
            records.append(data)
        elif kind == 2:
            partial = data
        elif kind == 3:
            partial += data
        elif kind == 4:
            records.append(partial + data)
        else:
            break
    kinds, keys = [], set()
    for data in records:
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        kinds.append(kind)
        items = rec.history.item if kind == "history" else rec.summary.update if kind == "summary" else []
        for item in items:
            keys.add(item.key or item.nested_key[0])
    return kinds, keys


def write_fake_cifar10c(root, corruptions=("fog", "snow"), per_severity=4):
    """Files in the layout of the CIFAR-10-C release, ``per_severity`` images per severity."""
    import numpy as np

    d = root / "CIFAR-10-C"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    np.save(d / "labels.npy", np.tile(np.arange(per_severity) % 10, 5).astype(np.uint8))
    for c in corruptions:
        imgs = rng.integers(0, 256, size=(5 * per_severity, 32, 32, 3), dtype=np.uint8)
        imgs[:, 0, 0, 0] = np.repeat(np.arange(5), per_severity)  # severity marker
        np.save(d / f"{c}.npy", imgs)
    return d
