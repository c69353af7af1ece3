"""train.set_cpu_modes: flush_denormal turns subnormal floats into zeros; bad values are refused."""

from __future__ import annotations

import pytest
import torch

from laplace_lab.config.load import load_run_config
from laplace_lab.train import set_cpu_modes
from tests.conftest import compose_config

SUBNORMAL = 1e-40  # below float32's smallest normal number (1.2e-38)


def _kept() -> bool:
    return bool((torch.tensor([SUBNORMAL], dtype=torch.float32) * 1.0).item() != 0.0)


@pytest.mark.skipif(not torch.set_flush_denormal(False), reason="this CPU cannot flush subnormal floats")
def test_flush_denormal_follows_the_config():
    try:
        set_cpu_modes(compose_config(["flush_denormal=true"]))
        assert not _kept()
        set_cpu_modes(compose_config(["flush_denormal=false"]))
        assert _kept()
    finally:
        torch.set_flush_denormal(False)


def test_flush_denormal_must_be_a_bool():
    with pytest.raises(ValueError, match=r"flush_denormal must be true or false; got 'yes'"):
        load_run_config(compose_config(["flush_denormal=yes"]))
