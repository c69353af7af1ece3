"""LightningDataModules: generated toys, UCI regression and torchvision image sets."""

from laplace_lab.data.base import LabDataModule
from laplace_lab.data.toy import SinusoidDataModule, Toy2DDataModule
from laplace_lab.data.uci import UCI_DATASETS, UCIDataModule
from laplace_lab.data.vision import VISION_DATASETS, VisionDataModule

__all__ = [
    "LabDataModule", "Toy2DDataModule", "SinusoidDataModule", "UCIDataModule", "VisionDataModule",
    "UCI_DATASETS", "VISION_DATASETS",
]
