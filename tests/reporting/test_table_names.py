"""Names are names (``io.names``): a table name, ``aggregate.name`` / ``aggregate.results_dir``,
``experiment_name`` and the output roots never become a path outside their folder, and only
``--commit-results`` with a preset's own name writes into ``results/``. Each refused case leaves the
files it aimed at as they were."""

from __future__ import annotations

import pytest

from laplace_lab.io.names import check_name, check_root, inside
from laplace_lab.reporting import tables
from laplace_lab.reporting.sweep_table import validate_aggregate
from laplace_lab.reporting.table_spec import Admission, TableSpec
from tests.conftest import run_config

from .test_tables import repo, sweep  # noqa: F401


@pytest.fixture
def committed(repo):  # noqa: F811
    """``results/redux_mnist.*`` and ``README.md`` of the stand-in repository, with their contents."""
    results = repo / "results"
    results.mkdir()
    files = {results / f"redux_mnist{s}": f"committed {s}" for s in (".md", ".csv", ".jobs.csv")}
    files[repo / "README.md"] = "readme"
    for path, text in files.items():
        path.write_text(text)
    return files


def _unchanged(files: dict) -> bool:
    return all(path.read_text() == text for path, text in files.items())


@pytest.mark.parametrize("name", ["{results}/redux_mnist", "../README", "..", ".hidden", "a/b", "", "x\n"])
def test_a_table_name_is_a_name(name, sweep, repo, committed, capsys):  # noqa: F811
    name = name.format(results=repo / "results")
    with pytest.raises(SystemExit, match=r"table name \(--name, aggregate.name\)=.* is not a plain name"):
        tables.main([str(sweep), "--name", name, "--allow-mixed"])
    with pytest.raises(ValueError, match="is not a plain name"):
        tables.aggregate([sweep], name, spec=TableSpec(metrics=["test/map/acc"]), commit_results=True,
                         admission=Admission(allow_mixed=True))
    assert _unchanged(committed)


def test_commit_results_writes_only_the_preset_s_own_table(sweep, repo, committed, monkeypatch):  # noqa: F811
    monkeypatch.setattr(tables, "preset_spec", lambda preset: {"name": "redux_mnist"})
    with pytest.raises(SystemExit, match="--commit-results needs --preset"):
        tables.main([str(sweep), "--name", "redux_mnist", "--commit-results", "--allow-mixed"])
    with pytest.raises(SystemExit, match=r"--name 'toy' with --commit-results: preset 'p' writes results/redux_mnist\.\* "
                                         r"or a variant results/redux_mnist_<suffix>\.\*"):
        tables.main([str(sweep), "--preset", "p", "--name", "toy", "--commit-results", "--allow-mixed"])
    with pytest.raises(SystemExit, match="is not a plain name"):
        tables.main([str(sweep), "--preset", "p", "--name", "../README", "--commit-results", "--allow-mixed"])
    assert _unchanged(committed)
    tables.main([str(sweep), "--preset", "p", "--name", "redux_mnist_variant", "--commit-results", "--allow-mixed",
                 "--metrics", "test/map/acc"])
    assert (repo / "results" / "redux_mnist_variant.md").is_file() and _unchanged(committed)


@pytest.mark.parametrize("spec, message", [
    ({"name": "/abs/results/immer2021_uci"}, r"aggregate.name='/abs/results/immer2021_uci' is not a plain name"),
    ({"name": "../../results/x"}, "is not a plain name"),
    ({"name": "t", "results_dir": "/abs/results"}, r"aggregate.results_dir='/abs/results' leaves its folder"),
    ({"name": "t", "results_dir": "../.."}, r"aggregate.results_dir='../..' leaves its folder"),
])
def test_the_sweep_table_is_checked_before_any_job(spec, message, sweep, committed):  # noqa: F811
    with pytest.raises(ValueError, match=message):
        validate_aggregate(spec)
    with pytest.raises(ValueError, match=message.replace("aggregate.name", r"table name \(--name, aggregate.name\)")):
        tables.aggregate_sweep(sweep, spec)
    assert _unchanged(committed)


def test_a_relative_results_dir_stays_under_the_sweep(sweep):  # noqa: F811
    paths = tables.aggregate_sweep(sweep, {"name": "t", "results_dir": "results", "metrics": ["test/map/acc"]})
    assert paths[0] == sweep / "results" / "t.md"


@pytest.mark.parametrize("override, message", [
    ("paths.output_root=''", r"paths.output_root='' is empty"),
    ("paths.output_root=/", r"paths.output_root='/' is the filesystem root"),
    ("map_cache.dir=''", r"map_cache.dir='' is empty"),
    ("checkpoint.dirpath=''", r"checkpoint.dirpath='' is empty"),
    ("experiment_name=../x", r"experiment_name='../x' is not a plain name"),
    ("experiment_name=''", r"experiment_name='' is not a plain name"),
])
def test_run_folders_are_checked_as_composed(override, message):
    with pytest.raises(ValueError, match=message):
        run_config(["data=sinusoid", override])


def test_the_run_config_checks_them_too():
    """``load_run_config`` on a config that did not come through Hydra (a restored job)."""
    from omegaconf import OmegaConf

    from laplace_lab.config.load import load_run_config
    from tests.conftest import compose_config

    data = OmegaConf.to_container(compose_config(["data=sinusoid"]), resolve=True)
    data["paths"]["output_root"] = ""
    with pytest.raises(ValueError, match=r"paths.output_root='' is empty"):
        load_run_config(OmegaConf.create(data))


def test_the_helpers(tmp_path):
    assert check_name("immer2021_uci", "x") == "immer2021_uci" and check_root("outputs", "x") == "outputs"
    assert inside("results", tmp_path, "x") == tmp_path / "results"
    for bad in ("a/b", "../a", "a..b", ".", " "):
        with pytest.raises(ValueError, match="x=.* is not a plain name"):
            check_name(bad, "x")
    with pytest.raises(ValueError, match="leaves its folder"):
        inside("a/../../b", tmp_path, "x")
