"""Fixtures for the evaluation tests; helpers live in eval_helpers.py."""

import pytest
import torch
from eval_helpers import IMG, TemperedSoftmax, make_images, make_mlp
from torch.utils.data import DataLoader, TensorDataset


@pytest.fixture(scope="session")
def image_data():
    return make_images(256, seed=0), make_images(96, seed=1)


@pytest.fixture(scope="session")
def trained_mlp(image_data):
    return make_mlp(0, image_data[0])


@pytest.fixture()
def image_setup(image_data, trained_mlp):
    _, test = image_data
    model = trained_mlp
    predictors = {"map": lambda x: torch.softmax(model(x), -1), "la": TemperedSoftmax(model)}
    test_loader = DataLoader(test, batch_size=32)
    ood = TensorDataset(torch.rand(64, *IMG), torch.zeros(64, dtype=torch.long))
    return model, predictors, test_loader, {"uniform_ood": DataLoader(ood, batch_size=32)}
