"""Networks built from config.

Every constructor takes ``input_shape`` (tuple, without the batch dimension) and
``num_outputs`` (int) first, then its own hyperparameters, so Hydra configs can be
instantiated with ``_partial_: true`` and completed by ``train.py`` from the data module.
"""

from laplace_lab.models.lenet import LeNet
from laplace_lab.models.mlp import MLP
from laplace_lab.models.resnet import ResNet18
from laplace_lab.models.wideresnet import WideResNet

__all__ = ["MLP", "LeNet", "ResNet18", "WideResNet"]
