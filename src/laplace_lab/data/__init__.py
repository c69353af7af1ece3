"""Data modules: generated toys, UCI regression and torchvision image sets (``vision``, loaded on
first use: torchvision takes seconds to import)."""

from laplace_lab.data.base import LabDataModule
from laplace_lab.data.toy import SinusoidDataModule, Toy2DDataModule
from laplace_lab.data.uci import UCI_DATASETS, UCIDataModule

__all__ = [
    "LabDataModule", "Toy2DDataModule", "SinusoidDataModule", "UCIDataModule", "VisionDataModule",
    "UCI_DATASETS", "VISION_DATASETS",
]


def __getattr__(name: str):
    if name in ("VisionDataModule", "VISION_DATASETS"):
        from laplace_lab.data import vision

        return getattr(vision, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
