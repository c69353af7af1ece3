"""experiments/redux_mnist/laplace_torch_reference.py: laplace-torch beside our evaluation on
one MAP network (tiny LeNet on fake images), the CSV row fields, the summary's reference entries
and how a job's MAP cache entry is found."""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from laplace_lab.data import VisionDataModule
from laplace_lab.evaluation import metrics as M
from laplace_lab.evaluation.options import EvalConfig
from laplace_lab.io.fields import defaults
from laplace_lab.models import LeNet
from laplace_lab.reporting.reference import load_reference
from laplace_lab.training import MAPModule
from laplace_lab.training.module import MAPOptimisation
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "redux_mnist" / "laplace_torch_reference.py"


@pytest.fixture(scope="module")
def peer():
    return load_script(SCRIPT, "laplace_redux_peer")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A LeNet trained a few steps on 64 fake 3x32x32 images; the fake test split stands in for
    FashionMNIST as the OOD set (the CSV's metric names)."""
    dm = VisionDataModule(name="fake_data", data_dir=str(tmp_path_factory.mktemp("data")), n_val=0, ood=["fake_data"],
                          fake_size=64, batch_size=32, eval_batch_size=32)
    dm.setup("fit")
    dm.ood_dataloaders = lambda: {"fashion_mnist": VisionDataModule.ood_dataloaders(dm)["fake_data"]}
    torch.manual_seed(0)
    module = MAPModule(LeNet((3, 32, 32), 10), "classification", n_data=64,
                       optimisation=MAPOptimisation(optimizer=partial(torch.optim.Adam, lr=1e-3)))
    opt = torch.optim.Adam(module.model.parameters(), lr=1e-2)
    X, y = next(iter(dm.train_eval_dataloader(64)))
    for _ in range(20):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(module.model(X), y).backward()
        opt.step()
    return dm, module.eval()


@pytest.mark.parametrize("method", ["la", pytest.param("la_star", marks=pytest.mark.slow),
                                    pytest.param("kron", marks=pytest.mark.slow)])  # kron: ~30 s
def test_peer_row(peer, tiny, method, tmp_path):
    dm, module = tiny
    eval_cfg = peer.evaluation_config(OmegaConf.create(defaults(EvalConfig)))  # conf/evaluation/default.yaml
    eval_cfg.ood.n_generated = 32
    row = peer.peer_metrics(module, dm, method, eval_cfg, tmp_path, n_steps=20)
    row.update({"seed": 0, "method_name": method, "job": "j", "map_entry": "e.pt", "map_found_by": "exact"})
    for field in peer.METRICS + [f for f in peer.PEER if f != "peer/prior_precision"]:
        assert math.isfinite(row[field]), field
    # the MAP columns are our metric functions on the network's softmax
    X, y = next(iter(torch.utils.data.DataLoader(dm.test_set, batch_size=64, shuffle=False)))
    with torch.no_grad():
        probs = torch.softmax(module.model(X), -1)
    assert row["test/map/acc"] == pytest.approx(M.accuracy(probs, y))
    assert row["test/map/nll"] == pytest.approx(M.nll(probs, y), rel=1e-5)
    assert row["test/map/ece"] == pytest.approx(M.ece(probs, y), abs=1e-6)
    # laplace-torch's predictive widens the MAP one: lower confidence on the test set
    assert row["test/la/conf"] < row["test/map/conf"]
    n_prior = len(row["peer/prior_precision"].split())
    assert n_prior == (10 if method == "kron" else 1)  # kron: one per parameter tensor (5 layers x w, b)
    assert row["peer/prior_precision_mean"] != pytest.approx(1.0)  # marglik moved it from the init
    out = tmp_path / "rows.csv"
    peer.append_row(out, row)
    peer.append_row(out, {**row, "seed": 1})
    rows = peer.read_rows(out)
    assert [r["seed"] for r in rows] == ["0", "1"] and list(rows[0]) == peer.FIELDS
    assert float(rows[0]["test/la/ece"]) == pytest.approx(row["test/la/ece"])
    # the summary's reference.yaml entries load with the project's reference reader
    text = peer.summary(rows, peer.COMMAND)
    entries = yaml.safe_load(text.split("reference.yaml entries:\n")[1])
    ref = tmp_path / "reference.yaml"
    ref.write_text(yaml.safe_dump({"preset": "redux_mnist", "references": entries}))
    loaded = load_reference(ref)["references"]
    assert {e["metric"] for e in loaded} == set(peer.REFERENCE_METRICS)
    assert all(e["row"] == {"method_name": method} and e["tolerance"] == 0 for e in loaded)  # 2 identical seeds


def test_unknown_method(peer, tiny):
    with pytest.raises(ValueError, match="method='diag' is not supported; allowed"):
        peer.fit_peer(tiny[1].model, None, "diag")


def _entry(folder: Path, key: str, config: dict, code: str) -> None:
    (folder / f"{key}.json").write_text(json.dumps({"config": config, "data_files": [["f", 1, 2]],
                                                    "code": {"sources": code}}))
    (folder / f"{key}.pt").write_bytes(b"")


def test_find_entry(peer, tmp_path):
    contents = {"config": {"seed": 0, "trainer": {"max_epochs": 100}}, "data_files": [["f", 1, 2]], "code": {"sources": "new"}}
    _entry(tmp_path, "aaaa", {"seed": 1, "trainer": {"max_epochs": 100}}, "old")  # another seed
    with pytest.raises(LookupError, match="no MAP cache entry"):
        peer.find_entry(contents, "ffff", tmp_path)
    _entry(tmp_path, "bbbb", contents["config"], "old")  # same training, older code
    assert peer.find_entry(contents, "ffff", tmp_path) == (tmp_path / "bbbb.pt", "config")
    _entry(tmp_path, "ffff", contents["config"], "new")
    assert peer.find_entry(contents, "ffff", tmp_path) == (tmp_path / "ffff.pt", "exact")
    _entry(tmp_path, "cccc", {**contents["config"], "logger": {"x": 1}}, "older")  # a key now run-only
    with pytest.raises(LookupError, match="3 MAP cache entries"):
        peer.find_entry(contents, "eeee", tmp_path)


def test_sweep_jobs(peer, tmp_path):
    for method, seed in [("la", 0), ("kron", 0), ("la", 1)]:
        job = tmp_path / f"method={method},seed={seed}"
        job.mkdir()
        (job / "config_resolved.yaml").write_text(f"seed: {seed}\nmethod_name: {method}\n")
    jobs = peer.sweep_jobs(tmp_path)
    assert sorted(jobs) == [0, 1] and set(jobs[0]) == {"la", "kron"}
    # the summary sets our finished jobs of the same seeds beside laplace-torch's rows
    for seed, ece in [(0, 0.01), (1, 0.03)]:
        (tmp_path / f"method=la,seed={seed}" / "metrics.json").write_text(json.dumps({"test/la/ece": ece}))
    row = {f: "0.5" for f in peer.FIELDS} | {"seed": "0", "method_name": "la"}
    text = peer.summary([row], peer.COMMAND, tmp_path)
    assert "test/la/ece | 0.5000 | 0.0100" in text and "same seeds (n=1)" in text
    assert "no reference.yaml entries" in text  # one seed: no s.e., no entry
    with pytest.raises(FileNotFoundError, match="no job folders"):
        peer.sweep_jobs(tmp_path / "method=la,seed=1")


def test_an_older_jobs_config_gets_todays_new_root_options_for_the_rebuild_only(peer):
    from tests.conftest import compose_config

    today = OmegaConf.create(OmegaConf.to_container(compose_config(["experiment=redux_mnist"]), resolve=True))
    old = OmegaConf.create({k: v for k, v in today.items() if k not in ("map_loss_scale", "flush_denormal")})
    old.seed = 3
    filled, names = peer.with_todays_root_options(old)
    assert sorted(names) == ["flush_denormal", "map_loss_scale"]
    assert filled.map_loss_scale == "nll" and filled.flush_denormal is True and filled.seed == 3
    assert "map_loss_scale" not in old  # the job's own config (the cache lookup's) is untouched
    assert peer.with_todays_root_options(today)[1] == []


def test_find_entry_takes_an_entry_of_the_older_data_fingerprint(peer, tmp_path):
    files = [["MNIST/raw/t10k", 7, "0fa7"], ["MNIST/raw/train", 9, "ba89"]]
    contents = {"config": {"seed": 2}, "data_files": files, "code": {"sources": "new"}}
    older = [["/data/MNIST/raw/t10k", 7, 1795517260004897021], ["/data/MNIST/raw/train", 9, 1795517260006883688]]
    other_size = [["/data/MNIST/raw/t10k", 8, 1], ["/data/MNIST/raw/train", 9, 1]]
    for key, data in [("aaaa", other_size), ("bbbb", older)]:
        _entry(tmp_path, key, contents["config"], "old")
        meta = tmp_path / f"{key}.json"
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "data_files": data}))
    assert peer.find_entry(contents, "ffff", tmp_path) == (tmp_path / "bbbb.pt", "config, older data fingerprint")
    assert peer.same_data_files(files, files) == "config" and peer.same_data_files(other_size, files) is None
