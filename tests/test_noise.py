"""Say a thing once, show progress on long work, say what was skipped and why (issue 31, "noise").

An unknown ``HOROVOD_*`` variable is reported once, by the launcher, when a launcher started the job (its workers
inherit the same environment; tier cli); a worker with no Horovod launcher still reports it itself (tier unit). The
torch estimator's ranks warn of nothing. The benchmark suite shows the end-to-end comparison's lines as they come,
and says which figure it skipped for want of matplotlib."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from horovod.runner.pipeline import package_pythonpath
from horovod.common import config

INIT = ["python", "-c", "import horovod.numpy as hvd; hvd.init(); print('up', hvd.rank()); hvd.shutdown()"]
WARNING = "HOROVOD_FUSIN_THRESHOLD is not a Horovod setting and is ignored; did you mean HOROVOD_FUSION_THRESHOLD?"


@pytest.mark.cli
def test_horovodrun_reports_an_unknown_variable_once_and_its_workers_stay_quiet(horovodrun):
    proc = horovodrun(["-np", "2", *INIT], timeout=60, env={"HOROVOD_FUSIN_THRESHOLD": "64"})
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == sorted("[0]<stdout>:up 0 [1]<stdout>:up 1".split())
    said = (proc.stdout + proc.stderr).count(WARNING)
    assert said == 1, proc.stderr


@pytest.mark.cli
def test_horovod_run_reports_an_unknown_variable_once(tmp_path):
    code = "import horovod\nprint(horovod.run(lambda: 1, np=2))\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**config.environ_snapshot(), **package_pythonpath(), "HOROVOD_FUSIN_THRESHOLD": "64"})
    assert proc.returncode == 0, proc.stderr
    assert "[1, 1]" in proc.stdout
    assert (proc.stdout + proc.stderr).count(WARNING) == 1, proc.stderr


@pytest.mark.unit
def test_a_worker_without_a_horovod_launcher_still_reports_it(caplog):
    import logging
    config._warned.discard("HOROVOD_FUSIN_THRESHOLD")
    with caplog.at_level(logging.WARNING, logger="horovod"):
        config.load_config({"HOROVOD_FUSIN_THRESHOLD": "1", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1"})
        assert WARNING not in caplog.text  # a launcher started it: the launcher said so
        config.load_config({"HOROVOD_FUSIN_THRESHOLD": "1"})  # mpirun, srun, torchrun: nobody else will
        assert caplog.text.count(WARNING) == 1


def _train_an_epoch_with_warnings_as_errors():
    import warnings

    import numpy as np
    import torch
    import torch.nn.functional as F

    import horovod.torch as hvd
    from horovod.spark.torch import remote

    class Reader:
        def batches(self, steps):
            rng = np.random.default_rng(hvd.rank())
            for _ in range(steps):
                yield {"features": rng.random((8, 4)), "label": rng.integers(0, 2, 8)}

    hvd.init()
    warnings.simplefilter("error")  # a warning on any rank fails the test with its text
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    spec = {"feature_cols": ["features"], "label_cols": ["label"], "input_shapes": None}
    squared_error = lambda out, label: F.mse_loss(out, F.one_hot(label, 2).float())  # noqa: E731 — has a grad
    sums, _ = remote._train_epoch(model, optimizer, Reader(), 3, spec, [F.cross_entropy], [squared_error])
    return sums.tolist()


@pytest.mark.ranks
def test_the_torch_estimators_training_warns_of_nothing():
    # Every rank printed torch's "Converting a tensor with requires_grad=True to a scalar" UserWarning (our own
    # float(loss) on the graph's tensor), once per rank per fit.
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    pytest.importorskip("torch")
    from horovod.testing import spawn_ranks
    first, second = spawn_ranks(_train_an_epoch_with_warnings_as_errors, 2, timeout=120)
    assert first == second and len(first) == 2  # the loss and the metric, averaged over the ranks


BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def suite(monkeypatch):
    """bench/suite.py as a module (bench/ is a folder of scripts)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import importlib
    return importlib.import_module("suite")


@pytest.mark.timed
@pytest.mark.unit
def test_the_suites_end_to_end_comparison_shows_each_line_as_it_comes(suite, monkeypatch, tmp_path):
    # It ran for a minute with its output captured: nothing on the screen until the end.
    script = tmp_path / "e2e.py"
    script.write_text("import sys, time\nprint('round 1: 100 img/sec', flush=True)\ntime.sleep(1.5)\n"
                      "print('ratio horovod-py / DDP: 1.00')\n")
    monkeypatch.setattr(suite, "E2E_SCRIPT", str(script))
    heard = []
    text = suite.end_to_end(2, echo=lambda line: heard.append((time.monotonic(), line)))
    assert text == "round 1: 100 img/sec\nratio horovod-py / DDP: 1.00"
    assert "about a minute" in heard[0][1]  # what is running, before it runs
    (first, _), (last, _) = [h for h in heard if "round 1" in h[1]][0], heard[-1]
    assert last - first > 1.0  # the first round's line came when it was printed, not at the end


@pytest.mark.unit
def test_a_figure_skipped_for_want_of_matplotlib_says_so(suite, monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    rows = {"horovod-py": [{"op": "allreduce", "bytes": 4, "seconds": 1e-3}]}
    why = suite.plot(rows, 2, str(tmp_path / "busbw.png"))
    assert why and "matplotlib is not installed" in why
    assert f"figure {tmp_path / 'busbw.png'} skipped: matplotlib is not installed" in capsys.readouterr().err
    assert not (tmp_path / "busbw.png").exists()


@pytest.mark.unit
def test_the_elastic_drivers_wait_for_hosts_counts_down():
    # It said "waiting up to 60s for 2 slot(s)" once, then nothing until the timeout.
    from horovod.runner.elastic.discovery import FixedHosts
    from horovod.runner.elastic.driver import ElasticSettings
    from horovod.runner.elastic.job import ElasticJob
    from horovod.runner.hosts import HostInfo
    from horovod.runner.rendezvous import KVStore

    class Spawner:
        def exits(self, timeout):
            return []

        def close(self):
            pass

    clock = iter(float(t) for t in range(1000))
    said = []
    job = ElasticJob(ElasticSettings(min_np=2, elastic_timeout=60), FixedHosts([HostInfo("a", 1)]), Spawner(),
                     KVStore(), clock=lambda: next(clock), log=said.append, discovery_interval=1.0)
    code, message = job.run()
    assert code == 1 and "Timed out waiting" in message
    assert said[0] == "waiting up to 60s for 2 slot(s); 1 available now (a:1)"
    countdown = [line for line in said if line.startswith("still waiting")]
    assert countdown[0] == "still waiting for 2 slot(s): 1 available (a:1); 54s left of 60s"
    lefts = [int(line.split("; ")[1].split("s left")[0]) for line in countdown]
    assert lefts == sorted(lefts, reverse=True) and 5 <= len(lefts) <= 12 and lefts[-1] <= 6
