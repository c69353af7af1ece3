"""The LILA peer (``experiments/immer2022_invariance_cpu/peer/lila_peer.py``): its committed command
lines hold no machine path, the authors' flags follow our CPU cut, and its side=ours rows come
from the jobs CSV (modes none and learned, never fixed)."""

from __future__ import annotations

import argparse
from pathlib import Path

from laplace_lab.reporting import peer_pairs
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
PEER = load_script(ROOT / "experiments" / "immer2022_invariance_cpu" / "peer" / "lila_peer.py")


def test_shown_argv_hides_machine_paths():
    argv = ["--repo", "/a/lila", "--data-root=/b/data", "--subset", "1000", "--out", "x.csv", "--seeds", "0,1"]
    assert PEER.shown_argv(argv) == "--repo <repo> --data-root=<data-root> --subset 1000 --out <out> --seeds 0,1"


def test_learned_command_carries_the_cut():
    args = argparse.Namespace(epochs=25, subset=1000, batch_size=50, data_root="d", burnin=5, samples=8, lr_aug=0.2)
    cmd = PEER.lila_command("mnist_r180", "learned", 1, args)
    def flag(name):
        return cmd[cmd.index(name) + 1]

    assert (flag("--n_epochs"), flag("--n_epochs_burnin"), flag("--batch_size"), flag("--subset_size")) == (
        "25", "5", "50", "1000")
    assert flag("--n_samples_aug") == "8" and flag("--lr_aug") == flag("--lr_aug_min") == "0.2"
    assert "--optimize_aug" not in PEER.lila_command("mnist", "none", 1, args)


def test_ours_rows_from_jobs_csv(tmp_path):
    jobs = tmp_path / "jobs.csv"
    metric_cols = PEER.COLUMNS[PEER.COLUMNS.index("test/map/acc"):]
    lines = ["# provenance", ",".join(["job", "data.transform", "augmentation.mode", "overrides", "commit", "dirty",
                                       *metric_cols])]
    for mode in ("none", "fixed", "learned"):
        for seed in (0, 1):
            values = ",".join(str(0.5 + seed) for _ in metric_cols)
            lines.append(f"j,rotated_full,{mode},seed={seed} augmentation={mode},abc,False,{values}")
    jobs.write_text("\n".join(lines) + "\n")
    out = tmp_path / "lila.csv"
    out.write_text("# theirs\n" + ",".join(PEER.COLUMNS) + "\n"
                   + ",".join(["theirs", "0", "28f", "python x", "rotated_full", "learned", "1000", "25",
                               *["0.4"] * len(metric_cols)]) + "\n")
    PEER.add_ours(out, jobs, 1000, 25)
    table = peer_pairs.read_peer_csv(out)
    ours = [r for r in table.rows if r["side"] == "ours"]
    assert sorted((r["augmentation.mode"], r["seed"]) for r in ours) == [
        ("learned", "0"), ("learned", "1"), ("none", "0"), ("none", "1")]
    assert [r["side"] for r in table.rows].count("theirs") == 1 and table.comments == ("theirs",)


def test_resume_skips_only_the_authors_runs(tmp_path):
    out = tmp_path / "lila.csv"
    row = {c: "0.5" for c in PEER.COLUMNS}
    lines = ["# provenance", ",".join(PEER.COLUMNS)]
    for side, transform in (("theirs", "rotated_full"), ("ours", "none")):
        row.update({"side": side, "seed": "0", "commit": "c", "command": "python x", "data.transform": transform,
                    "augmentation.mode": "learned", "subset": "1000", "epochs": "25"})
        lines.append(",".join(row[c] for c in PEER.COLUMNS))
    out.write_text("\n".join(lines) + "\n")
    assert PEER.done_runs(out) == {("rotated_full", "learned", "0", "1000", "25")}
    assert PEER.done_runs(tmp_path / "missing.csv") == set()
