"""Data modules: generated toys, UCI regression and torchvision image sets (``vision``, loaded on
first use: torchvision takes seconds to import). Each declares its options and what it is on its class
(``base.LabDataModule``); ``registry`` finds them for the config (a new data set: its class and its yaml)."""

from laplace_lab import lazy_attributes
from laplace_lab.data.base import LabDataModule
from laplace_lab.data.toy import SinusoidDataModule, Toy2DDataModule
from laplace_lab.data.uci import UCI_DATASETS, UCIDataModule

__all__ = [
    "LabDataModule", "Toy2DDataModule", "SinusoidDataModule", "UCIDataModule", "VisionDataModule",
    "UCI_DATASETS", "VISION_DATASETS",
]

__getattr__ = lazy_attributes(__name__, dict.fromkeys(("VisionDataModule", "VISION_DATASETS"), "laplace_lab.data.vision"))
