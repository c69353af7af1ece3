"""laplace_lab.reporting.peer_ours: our side of a peer CSV from a committed jobs CSV."""

import pytest

from laplace_lab.reporting.peer_ours import ours_rows

JOBS = """# table: t
# commit: abc (dirty: False)
job,data.name,method_name,overrides,commit,dirty,test/la/ll
a,yacht,het_online,data.name=yacht data.split=2 method=het_online experiment=x,abc,False,-0.5
b,yacht,map_grid,data.name=yacht data.split=2 method=map_grid experiment=x,abc,False,
"""


def test_rows_take_seed_settings_and_metrics_from_the_jobs(tmp_path):
    path = tmp_path / "t.jobs.csv"
    path.write_text(JOBS)
    rows = ours_rows(path, seed_key="data.split", settings={"data": "data.name", "method": "method_name"},
                     metrics={"test/la_het_mean/ll": "test/la/ll"}, where={"method_name": "het_online"})
    assert rows == [{"side": "ours", "seed": "2", "commit": "abc",
                     "command": "python -m laplace_lab.train data.name=yacht data.split=2 method=het_online experiment=x",
                     "data": "yacht", "method": "het_online", "test/la_het_mean/ll": "-0.5"}]


def test_a_dirty_job_or_a_missing_metric_fails(tmp_path):
    path = tmp_path / "t.jobs.csv"
    path.write_text(JOBS.replace("abc,False,-0.5", "abc,True,-0.5"))
    with pytest.raises(ValueError, match="dirty checkout"):
        ours_rows(path, "data.split", {}, {"m": "test/la/ll"})
    path.write_text(JOBS)
    with pytest.raises(ValueError, match="no metric column 'test/la/nll'"):
        ours_rows(path, "data.split", {}, {"m": "test/la/nll"})
