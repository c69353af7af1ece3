"""Bad input fails before training, with a message that names the option and the choices."""

from __future__ import annotations

import pytest
from hydra.errors import MissingConfigException

import laplace_lab.training.build as build_mod
import laplace_lab.training.loops as loops
from laplace_lab.train import run
from tests.conftest import compose_config


@pytest.fixture
def no_training(monkeypatch):
    """Fail the test if a trainer (Lightning's or the plain loop's) is ever built: errors must come first."""

    def forbidden(*args, **kwargs):
        raise AssertionError("training started before the error")

    for loop in (loops.PlainLoop, loops.LightningLoop):
        monkeypatch.setattr(loop, "make_trainer", forbidden)


def test_unknown_model_group_option():
    with pytest.raises(MissingConfigException, match="mlp"):
        compose_config(["model=transformer9000"])


def test_unknown_dataset_group_option():
    with pytest.raises(MissingConfigException, match="mnist"):
        compose_config(["data=imagenet"])


def test_unknown_vision_name(tmp_path, no_training):
    with pytest.raises(ValueError, match=r"data.name='imagenet'.*allowed.*mnist"):
        run(compose_config(["data=mnist", "data.name=imagenet", "logger=csv"]), tmp_path)


def test_unknown_uci_name(tmp_path, no_training):
    with pytest.raises(ValueError, match=r"data.name='iris'.*allowed.*yacht"):
        run(compose_config(["data=uci", "data.name=iris", "logger=csv"]), tmp_path)


def test_missing_data_directory(tmp_path, no_training):
    missing = tmp_path / "nowhere"
    cfg = compose_config(["data=mnist", f"paths.data_dir={missing}", "data.download=false", "logger=csv"])
    with pytest.raises(FileNotFoundError, match=r"'mnist'.*nowhere.*train-images-idx3-ubyte"):
        run(cfg, tmp_path)
    cfg = compose_config(["data=uci", f"paths.data_dir={missing}", "logger=csv"])
    with pytest.raises(FileNotFoundError, match=r"'yacht'.*nowhere.*data.txt"):
        run(cfg, tmp_path)


def test_uci_split_out_of_range(tmp_path, data_dir, no_training):
    cfg = compose_config(["data=uci", "data.split=20", f"paths.data_dir={data_dir}", "logger=csv"])
    with pytest.raises(ValueError, match=r"data.split=20.*allowed: 0..19"):
        run(cfg, tmp_path)


@pytest.mark.parametrize(
    "override,pattern",
    [
        ("optimizer.weight_decay=0.01", r"optimizer.weight_decay.*allowed: 0"),
        ("likelihood=poisson", r"likelihood='poisson'.*allowed"),
        ("prior.prior_precision=-1", r"prior.prior_precision \(the prior precision delta\) must be > 0; got -1"),
        ("prior=diagonal", r"prior.structure=.diagonal. does not fit curvature.hessian_structure=.kron."),
        ("curvature.type=hessian", r"curvature.type=.hessian.*allowed"),
        ("model.activation=swish9", r"model.activation='swish9'.*allowed"),
        ("prior_in_map_loss=maybe", r"prior_in_map_loss must be true or false"),
        ("map_grid_refit=maybe", r"map_grid_refit must be true or false; got 'maybe'"),
        ("map_grid_refit=true", r"map_grid_refit=true needs a map_grid .*got map_grid=null"),
    ],
)
def test_invalid_values(override, pattern, tmp_path, no_training):
    with pytest.raises(ValueError, match=pattern):
        run(compose_config([override, "logger=csv"]), tmp_path)


def test_map_grid_refit_needs_validation_rows_held_out_of_training(tmp_path, no_training):
    cfg = compose_config(["data=sinusoid", "map_grid=[1.0,10.0]", "map_grid_refit=true", "logger=csv"])
    with pytest.raises(ValueError, match=r"map_grid_refit=true needs data whose validation rows are held out of the "
                                         r"training set \(allowed: \['laplace_lab.data.UCIDataModule', "
                                         r"'laplace_lab.data.VisionDataModule'\]\); data 'laplace_lab.data.SinusoidDataModule'"):
        run(cfg, tmp_path)


@pytest.mark.parametrize("extra", [["method=online_full"], ["method=map_grid"]])
def test_map_loss_without_prior_rejects_online_and_grid(extra, tmp_path, no_training):
    cfg = compose_config(["prior_in_map_loss=false", "logger=csv", *extra])
    with pytest.raises(ValueError, match=r"prior_in_map_loss=false needs marglik.mode in \['off', 'posthoc'\]"):
        run(cfg, tmp_path)


@pytest.mark.parametrize(
    "overrides,pattern",
    [
        (["sigma_noise=inf"], r"sigma_noise=inf is not a finite number"),
        (["optimizer.lr=nan"], r"optimizer.lr=nan is not a finite number"),
        (["temperature=-inf"], r"temperature=-inf is not a finite number"),
        (["marglik=online", "marglik.lr_hyp=nan"], r"marglik.lr_hyp=nan is not a finite number"),
        (["prior.prior_precision=inf"], r"prior.prior_precision=inf is not a finite number"),
        (["optimizer.lr=0"], r"optimizer.lr \(the learning rate\) must be > 0; got 0 \(allowed: numbers in \(0, inf\)\)"),
        (["trainer.max_epochs=1.5"], r"trainer.max_epochs must be >= 1 or null; got 1.5 \(allowed: integers"),
        (["data.batch_size=0"], r"data.batch_size must be >= 1; got 0 \(allowed: integers in \[1, inf\)\)"),
        (["model.widths='50'"], r"model.widths='50' has the wrong type: got a str; allowed: a list"),
        (["model.widths=[50,'a']"], r"model.widths=\[50, 'a'\] must be a list of integers"),
        (["marglik=online", "marglik.n_steps=abc"], r"marglik.n_steps='abc' has the wrong type.*allowed: a number"),
        (["+marglik.typo=1"], r"marglik.typo is not a known option of the marglik group; allowed: \[.*'lr_hyp'"),
        (["data=uci", "+data.kind=moons"], r"data.kind is not a known option of the data group; allowed: \[.*'split'"),
        (["+optimizer.lrr=0.1"], r"optimizer.lrr is not a known option.*allowed: \[.*'lr'"),
        (["model._target_=os.system"], r"model._target_='os.system' is not allowed; allowed: \[.*'laplace_lab.models.MLP'"),
        (["++optimizer._target_=subprocess.Popen"], r"optimizer._target_='subprocess.Popen' is not allowed"),
        (["data._target_=torch.load"], r"data._target_='torch.load' is not allowed"),
        # unknown + keys at every level, out-of-range sizes, a checkpoint that does not exist
        (["+lr=0.1"], r"lr is not a known root option; allowed: \[.*'optimizer'"),
        (["+ensemble.sizee=3"], r"ensemble.sizee is not a known option of the ensemble group; allowed: \[.*'size'"),
        (["augmentation=learned", "+augmentation.lrr=1"], r"augmentation.lrr is not a known option of the augmentation"),
        (["model.widths=[0]"], r"model.widths\[0\] must be >= 1; got 0"),
        (["model.widths=[50,-5]"], r"model.widths\[1\] must be >= 1; got -5"),
        (["model=wrn16_4", "model.widen_factor=0"], r"model.widen_factor must be >= 1; got 0"),
        (["data=toy2d", "data.n_train=1"], r"data.n_train=1 is too small for data.kind='moons', which has 2 classes"),
        (["data=toy2d", "data.kind=blobs", "data.n_train=3"], r"data.n_train=3 is too small for data.kind='blobs'"),
        (["data=mnist", "data.n_val=60000"], r"data.n_val=60000 is too large for mnist: .* allowed: 0..12000"),
        (["data=fake_data", "data.n_val=26"], r"data.n_val=26 is too large for fake_data: .* allowed: 0..25"),
        # declared once, on UCIDataModule.Options: a fraction of 1 leaves no training row
        (["data=uci", "data.val_fraction=1.0"],
         r"data.val_fraction must be >= 0 and < 1; got 1.0 \(allowed: numbers in \[0, 1\)\)"),
        (["data=uci", "data.name=iris"], r"data.name='iris' is not supported; allowed: \[.*'yacht'"),
        (["data=mnist", "data.ood=[kmnist,imagenet]"], r"data.ood='imagenet' is not supported; allowed: \[.*'kmnist'"),
        (["checkpoint.resume_from=/no/such/last.ckpt"], r"checkpoint.resume_from='/no/such/last.ckpt' does not exist"),
        # an integer, null or auto; the message names the option and the allowed values
        *[([f"curvature.fit_batch_size={v}"], r"curvature.fit_batch_size=.* is not supported; allowed: null "
           r"\(data.eval_batch_size\), an integer >= 1, or 'auto'") for v in ("0", "-3", "automatic", "1.5", "true")],
    ],
)
def test_invalid_values_fail_before_data(overrides, pattern, tmp_path, no_training, monkeypatch):
    """Non-finite / out-of-range numbers, mistyped lists, unknown keys (also added with ``+``) and
    foreign ``_target_`` classes fail before the data module is even built."""
    monkeypatch.setattr(build_mod, "instantiate", lambda *a, **k: pytest.fail("data or model built before the error"))
    with pytest.raises(ValueError, match=pattern):
        run(compose_config([*overrides, "logger=csv"]), tmp_path)


def test_known_extra_keys_are_accepted(tmp_path):
    """Keys that the target takes (``+trainer.check_val_every_n_epoch``, ``+optimizer.betas``) pass, and
    so do the documented root key ``+sweep_objective`` and an augmentation range under ``init``."""
    from laplace_lab.config.load import load_run_config

    load_run_config(compose_config(["+trainer.check_val_every_n_epoch=5", "+optimizer.betas=[0.9,0.99]",
                                    "marglik=online", "+marglik.evidence_point=weights"]))
    load_run_config(compose_config(["+sweep_objective=test/map/nll", "augmentation=fixed", "data=mnist",
                                    "predictive=map", "+augmentation.init.translate_x=0.1"]))


# --- bad data: each error names the file (and row) ------------------------------------------
@pytest.fixture
def uci_copy(tmp_path, data_dir):
    """A writable copy of the yacht set: ``<tmp>/UCI/yacht``; returns the data root."""
    import shutil

    shutil.copytree(data_dir / "UCI" / "yacht", tmp_path / "data" / "UCI" / "yacht")
    return tmp_path / "data"


def _edit_line(path, line_no, edit):
    lines = path.read_text().splitlines()
    lines[line_no - 1] = edit(lines[line_no - 1])
    path.write_text("\n".join(lines) + "\n")


def test_uci_nan_cell_names_file_and_line(uci_copy, tmp_path, no_training):
    data_file = uci_copy / "UCI" / "yacht" / "data.txt"
    _edit_line(data_file, 7, lambda line: " ".join(["nan", *line.split()[1:]]))
    cfg = compose_config(["data=uci", f"paths.data_dir={uci_copy}", "logger=csv"])
    with pytest.raises(ValueError, match=rf"{data_file}: non-finite value nan at line 7, column 1"):
        run(cfg, tmp_path / "run")


@pytest.mark.parametrize("corruption,pattern", [
    ("truncated_row", r"data.txt: cannot be read as a numeric table"),
    ("text_cell", r"data.txt: cannot be read as a numeric table"),
    ("index_out_of_range", r"index_train_0.txt: entry 100000 at position 1 is not a row index; allowed: integers in 0..307"),
])
def test_uci_corrupt_files_name_the_file(uci_copy, corruption, pattern):
    from laplace_lab.data import UCIDataModule

    root = uci_copy / "UCI" / "yacht"
    if corruption == "truncated_row":
        _edit_line(root / "data.txt", 12, lambda line: " ".join(line.split()[:3]))
    elif corruption == "text_cell":
        _edit_line(root / "data.txt", 12, lambda line: line.replace(line.split()[2], "abc", 1))
    else:
        _edit_line(root / "index_train_0.txt", 1, lambda line: "100000")
    with pytest.raises(ValueError, match=pattern):
        UCIDataModule(name="yacht", split=0, data_dir=str(uci_copy))


@pytest.fixture
def mnist_copy(tmp_path, data_dir):
    """``<tmp>/MNIST/raw`` with links to the real files (replace one to corrupt it)."""
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in (data_dir / "MNIST" / "raw").iterdir():
        (raw / f.name).symlink_to(f)
    return raw


def _replace(link, data: bytes):
    link.unlink()
    link.write_bytes(data)


def test_mnist_truncated_images_name_the_file(mnist_copy):
    from laplace_lab.data.vision import load_tensors

    images = mnist_copy / "t10k-images-idx3-ubyte"
    _replace(images, images.read_bytes()[:100_000])
    with pytest.raises(ValueError, match=rf"{images}: 100000 bytes but its header \(10000, 28, 28\) needs 7840016"):
        load_tensors("mnist", mnist_copy.parent.parent, train=False)
    _replace(images, b"garbage!" * 10)
    with pytest.raises(ValueError, match=rf"{images}: not an idx file"):
        load_tensors("mnist", mnist_copy.parent.parent, train=False)


def test_mnist_label_out_of_range_names_the_file(mnist_copy):
    from laplace_lab.data.vision import load_tensors

    labels = mnist_copy / "t10k-labels-idx1-ubyte"
    raw = bytearray(labels.read_bytes())
    raw[8 + 5] = 12  # row 5 gets label 12 of 10 classes
    _replace(labels, bytes(raw))
    with pytest.raises(ValueError, match=rf"{labels}: label 12 in row 5 \(0-based\) is out of range; allowed: 0..9"):
        load_tensors("mnist", mnist_copy.parent.parent, train=False)


def test_generated_data_with_nan_noise_fails():
    """A nan noise is refused by the option's range; a noise that overflows float32 by the data check."""
    from laplace_lab.data import SinusoidDataModule

    with pytest.raises(ValueError, match=r"data.noise_std must be >= 0; got nan \(allowed: numbers in \[0, inf\)\)"):
        SinusoidDataModule(noise_std=float("nan"))
    with pytest.raises(ValueError, match=r"generated sinusoid data \(data.noise_std=1e\+39\): non-finite targets in row 0"):
        SinusoidDataModule(noise_std=1e39)


def test_empty_validation_split_passes_the_data_checks():
    """``data.n_val=0`` leaves a zero-row validation set, which has nothing non-finite in it."""
    from laplace_lab.data import SinusoidDataModule

    dm = SinusoidDataModule(n_val=0)
    assert dm.n_train > 0


def test_uci_dtype_float64_and_bad_dtype(uci_copy):
    import torch

    from laplace_lab.data import UCIDataModule

    dm = UCIDataModule(name="yacht", split=0, data_dir=str(uci_copy), dtype="float64")
    assert dm.train_set.tensors[0].dtype == torch.float64 and dm.test_set.tensors[1].dtype == torch.float64
    assert dm.target_std.dtype == torch.float64
    with pytest.raises(ValueError, match=r"data.dtype='float16' is not supported; allowed: \['float32', 'float64'\]"):
        UCIDataModule(name="yacht", split=0, data_dir=str(uci_copy), dtype="float16")
