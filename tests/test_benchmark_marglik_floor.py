"""``benchmarks/marglik_floor.py``: every timed piece is reached through the engine's real code
paths (the wrapped kernels run), on a tiny random stand-in for MNIST."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "marglik_floor.py"


class TinyData:
    """``train_dataloader`` / ``train_eval_dataloader`` over 96 random 28x28 images."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.ds = TensorDataset(torch.randn(96, 1, 28, 28, generator=g), torch.randint(0, 10, (96,), generator=g))

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=32, shuffle=True)

    def train_eval_dataloader(self, batch_size=None):
        return DataLoader(self.ds, batch_size=batch_size or 32)


def test_every_piece_is_timed_and_the_kernels_are_inside_their_pass():
    floor = load_script(SCRIPT, "benchmark_marglik_floor")
    torch.set_num_threads(1)
    s = floor.timed_pieces(TinyData(), fit_batch=32, chunk_size=64)
    assert set(s) == {"bare epoch", "fused EF epoch, hooks only", "fused EF: conv A factors", "fused EF: factor kernels",
                      "fused EF: eigendecompositions", "fused EF epoch", "GGN fit: conv A factors",
                      "GGN fit: factor kernels", "GGN fit"}
    assert all(v > 0 for v in s.values()), s
    assert s["fused EF: conv A factors"] <= s["fused EF: factor kernels"] <= s["fused EF epoch"]
    assert s["GGN fit: conv A factors"] <= s["GGN fit: factor kernels"] <= s["GGN fit"]
    # the engine's conv_A is restored afterwards
    import laplace_lab.laplace.modules as kfac_modules

    assert kfac_modules.conv_A.__name__ == "conv_A"
