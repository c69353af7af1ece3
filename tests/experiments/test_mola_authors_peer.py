"""experiments/eschenhagen2021_mnist_cpu/peer/run_authors_mola.py without the authors' code: a job's resolved
config turned into member k's finds member k's MAP cache entry, members are written where uq.py
loads them and in its layout, uq.py's configs are the authors' (MoLA at its fixed prior), the
ensemble check stops on other networks, and both sides' rows pair in the peer CSV."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from laplace_lab.config.load import load_run_config
from laplace_lab.models.lenet import LeNet
from laplace_lab.reporting import peer_pairs
from laplace_lab.training import map_cache
from laplace_lab.training.ensemble import member_config
from tests.conftest import load_script, run_config
from tests.test_redux_authors_peer import authors_layout

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "eschenhagen2021_mnist_cpu" / "peer" / "run_authors_mola.py"


@pytest.fixture(scope="module")
def peer():
    return load_script(SCRIPT, "run_authors_mola")


@pytest.mark.parametrize("k", [1, 4])
def test_member_seed_edit_gives_the_members_cache_key(peer, k):
    run = run_config(["experiment=eschenhagen2021_mnist_cpu", "seed=2"])
    cfg = OmegaConf.create(run.raw)  # as config_resolved.yaml: every ${seed} already resolved
    peer.set_member_seed(cfg, k)
    assert cfg.seed == 2 + 1000 * k
    edited = map_cache.key_contents(load_run_config(cfg))["config"]
    assert edited == map_cache.key_contents(member_config(run, k))["config"]
    assert edited != map_cache.key_contents(run)["config"]


@pytest.mark.parametrize("data", ["mnist", "fashion_mnist"])
def test_members_are_written_where_uq_loads_them_in_its_layout(peer, tmp_path, data):
    name = {"mnist": "lenet_mnist/lenet_mnist_3_{}", "fashion_mnist": "lenet_fmnist/lenet_fmnist_3_{}.pt"}[data]
    assert [peer.member_path(tmp_path, data, 3, k) for k in range(5)] == [tmp_path / name.format(i) for i in range(1, 6)]
    torch.manual_seed(0)
    ours = LeNet((1, 28, 28), 10).eval()
    path = peer.member_path(tmp_path, data, 3, 1)
    path.parent.mkdir(parents=True)
    torch.save(peer.member_state_dict(ours, data), path)
    theirs = authors_layout().eval()  # uq.py loads MNIST files into LeNet.net, FashionMNIST ones into LeNet
    target = theirs if data == "mnist" else torch.nn.Module()
    if data == "fashion_mnist":
        target.net = theirs
    target.load_state_dict(torch.load(path))
    x = torch.rand(3, 1, 28, 28)
    assert torch.equal(ours(x), theirs(x))


def test_fashion_mnist_patch_applies_to_the_authors_duplicate_branch(peer, tmp_path):
    rel, old, new = peer.FMNIST_PATCH[1]
    (tmp_path / "utils").mkdir()
    (tmp_path / rel).write_text("before\n" + old + "after\n")
    peer.uq.apply_patch(tmp_path, [peer.FMNIST_PATCH[1]])
    text = (tmp_path / rel).read_text()
    assert text.count("elif args.benchmark in ['R-FMNIST', 'FMNIST-OOD']:") == 1
    assert "ids = ['FMNIST', 'MNIST']" in text and "ids = [0]" in text and text.endswith("after\n")


def test_uq_configs_are_the_authors(peer, tmp_path):
    conf = tmp_path / "configs" / "post_hoc_laplace"
    conf.mkdir(parents=True)
    authors = {"method": "laplace", "hessian_structure": "kron", "subset_of_weights": "last_layer",
               "prior_precision": 1.0, "optimize_prior_precision": "marglik", "link_approx": "probit",
               "model_seed": 972394}
    (conf / "mnist_default.yaml").write_text(yaml.safe_dump(authors))
    mola = peer.run_config(tmp_path, "mola", Path("/d"), Path("/m"), 2)
    assert mola == {**authors, "method": "mola", "nr_components": 5, "optimize_prior_precision": None,
                    "data_root": "/d", "models_root": "/m", "model_seed": 2, "download": False}
    de = peer.run_config(tmp_path, "de", Path("/d"), Path("/m"), 2)
    assert de["method"] == "ensemble" and de["nr_components"] == 5 and "prior_precision" not in de
    (conf / "mnist_default.yaml").write_text(yaml.safe_dump({**authors, "prior_precision": 30.0}))
    with pytest.raises(RuntimeError, match="prior_precision 30.0, not 1.0"):
        peer.run_config(tmp_path, "mola", Path("/d"), Path("/m"), 2)
    with pytest.raises(ValueError, match=r"method='la' is not supported; allowed: \['de', 'mola'\]"):
        peer.run_config(tmp_path, "la", Path("/d"), Path("/m"), 2)
    assert "optimize_prior_precision: null" in peer.theirs_command("mnist", "mola", 2)
    assert "--benchmark FMNIST-OOD" in peer.theirs_command("fashion_mnist", "de", 2)


def test_ensemble_check_stops_on_other_networks(peer):
    torch.manual_seed(0)
    x, y = torch.rand(8, 1, 28, 28), torch.randint(0, 10, (8,))
    loader = [(x[:5], y[:5]), (x[5:], y[5:])]
    nets = [LeNet((1, 28, 28), 10).eval() for _ in range(2)]
    members = [(None, SimpleNamespace(test_dataloader=lambda: loader), SimpleNamespace(model=n)) for n in nets]
    with torch.no_grad():
        p = torch.stack([n(x).softmax(-1) for n in nets]).mean(0).double()
    job = {"test/de/acc": float((p.argmax(-1) == y).double().mean()),
           "test/de/nll": float(-p.gather(1, y[:, None]).log().mean())}
    assert peer.ensemble_check(members, job) == pytest.approx(job, abs=1e-12)
    with pytest.raises(RuntimeError, match="not the networks the job used"):
        peer.ensemble_check(members[:1], job)


def test_both_sides_pair_in_the_peer_csv(peer, tmp_path):
    metrics = {f"{h}/{m}/{k}": 0.5 + 0.01 * i for i, (h, m, k) in enumerate(
        (h, m, k) for m in ("de", "mola") for h, k in (c.rsplit("/", 1) for c in peer.THEIRS))}
    ours = peer.ours_row(metrics, "mola")
    assert ours["test/acc"] == metrics["test/mola/acc"] and ours["ood/mnist/fpr95"] == metrics["ood/mnist/mola/fpr95"]
    assert peer.ours_row({}, "de")["test/nll"] == ""  # not computed: an empty cell
    uq_results = {"R-FMNIST": [{"acc": 0.9, "nll": 0.3, "conf": 0.8, "brier": 0.1, "ece": 0.05}],
                  "FMNIST-OOD": [{"conf": 0.8}, {"conf": 0.6, "auroc": 0.7, "fpr95": 0.4}]}
    theirs = peer.theirs_row("fashion_mnist", uq_results)
    assert theirs["test/ece_redux"] == 0.05 and theirs["ood/mnist/auroc"] == 0.7
    assert theirs["ood/fashion_mnist/auroc"] == ""  # the MNIST runs' OOD set: not this data set's
    rows = []
    for seed, shift in ((0, 0.01), (1, 0.03)):
        for data in ("fashion_mnist", "mnist"):
            for method in peer.METHODS:
                row = peer.ours_row(metrics, method)
                common = {"seed": seed, "data": data, "method": method}
                rows.append({"side": "ours", **common, "commit": "abc", "command": "ours", **row})
                rows.append({"side": "theirs", **common, "commit": "def", "command": "uq.py",
                             **{c: v - shift for c, v in row.items()}})
    args = SimpleNamespace(out=tmp_path / "authors_mola.csv", sweep_dir=Path("/x/eschenhagen2021_mnist_cpu/multirun"),
                           data="mnist,fashion_mnist", seeds="0,1")
    peer.write(args, rows, "2f526d0")
    table = peer_pairs.read_peer_csv(args.out)
    assert table.comments[-1].endswith("--sweep-dir <outputs>/eschenhagen2021_mnist_cpu/multirun "
                                       "--data mnist,fashion_mnist --seeds 0,1")
    assert [(r["data"], r["method"]) for r in table.rows[:4]] == [("mnist", "de"), ("fashion_mnist", "de"),
                                                                  ("mnist", "mola"), ("fashion_mnist", "mola")]
    select = {"data": "fashion_mnist", "method": "mola"}
    mean, se, n, seeds = peer_pairs.paired(peer_pairs.side_values(table, select, "test/nll", "test"))
    assert (n, seeds) == (2, [0, 1]) and mean == pytest.approx(0.02) and se == pytest.approx(0.01)
