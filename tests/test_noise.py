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
    assert "several minutes" in heard[0][1]  # what is running, before it runs
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


# Issue 49, item 10: TensorFlow's start-up notes. The launcher gives workers TF_CPP_MIN_LOG_LEVEL=1 unless the user
# set it, and its relay drops what TensorFlow logs at INFO before that level takes effect (absl's preamble, the
# oneDNN note): nothing else, never a warning, an error, stdout or a Python log line.
PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
ONEDNN = ("I0000 00:00:1796646901.298749    2135 port.cc:153] oneDNN custom operations are on. You may see slightly "
          "different numerical results due to floating-point round-off errors from different computation orders. "
          "To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.")
CPU_NOTE = ("To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the "
            "appropriate compiler flags.")


@pytest.mark.unit
def test_only_tensorflows_early_info_lines_count_as_startup_notes():
    from horovod.runner.noise import is_startup_note
    for line in (PREAMBLE, ONEDNN, CPU_NOTE,
                 "I1207 12:00:00.123456  140 cpu_feature_guard.cc:227] This TensorFlow binary is optimized"):
        assert is_startup_note(line), line
    for line in ("W0000 00:00:1796646901.298749    2135 port.cc:153] a warning",
                 "E0000 00:00:1796646901.298749    2135 cuda_dnn.cc:8310] Unable to register cuDNN factory",
                 "I1207 12:00:00.123456 140 train.py:12] the user's own absl log line",
                 "USER " + ONEDNN, ONEDNN.replace("I0000", "I0000X"), "WARNING: something of the user's",
                 "/x/train.py:3: UserWarning: mine", ""):
        assert not is_startup_note(line), line


@pytest.mark.unit
def test_workers_get_tensorflows_quiet_level_unless_the_user_set_one():
    from horovod.runner.noise import hides_notes, quiet_defaults
    from horovod.runner.pipeline import job_env
    from horovod.runner.rendezvous import RendezvousInfo
    info = RendezvousInfo("127.0.0.1", 1, b"k" * 32)
    assert job_env({}, info)["TF_CPP_MIN_LOG_LEVEL"] == "1"
    assert job_env({"TF_CPP_MIN_LOG_LEVEL": "0"}, info)["TF_CPP_MIN_LOG_LEVEL"] == "0"     # the user's, kept
    assert job_env({}, info, {"TF_CPP_MIN_LOG_LEVEL": "2"})["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert quiet_defaults({"TF_CPP_MIN_LOG_LEVEL": "0"}) == {}
    assert [hides_notes({"TF_CPP_MIN_LOG_LEVEL": v}) for v in ("0", "1", "3", "x")] == [False, True, True, False]
    assert not hides_notes({})


@pytest.mark.unit
def test_a_ray_drivers_own_tensorflow_level_reaches_its_workers(monkeypatch):
    pytest.importorskip("ray")
    from horovod.ray.utils import settings_env
    from horovod.runner.pipeline import job_env
    from horovod.runner.rendezvous import RendezvousInfo
    info = RendezvousInfo("127.0.0.1", 1, b"k" * 32)
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    assert job_env(settings_env(), info)["TF_CPP_MIN_LOG_LEVEL"] == "1"     # the quiet default
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    assert job_env(settings_env(), info)["TF_CPP_MIN_LOG_LEVEL"] == "0"     # the user's, as under horovodrun

@pytest.mark.unit
def test_the_relay_hides_notes_on_screen_only_when_asked_and_keeps_them_in_files(tmp_path):
    import io
    from horovod.runner.output import OutputSink
    for hide in (True, False):
        out, err = io.StringIO(), io.StringIO()
        sink = OutputSink(1, out, err, str(tmp_path / str(hide)), hide_notes=hide)
        for stream, line in (("stderr", PREAMBLE), ("stderr", ONEDNN), ("stderr", "mine on stderr"),
                             ("stdout", ONEDNN), ("stdout", "mine")):
            sink.write(0, stream, line)
        sink.close()
        shown = err.getvalue().splitlines()
        assert shown == (["[0]<stderr>:mine on stderr"] if hide else
                         [f"[0]<stderr>:{PREAMBLE}", f"[0]<stderr>:{ONEDNN}", "[0]<stderr>:mine on stderr"])
        assert out.getvalue().splitlines() == [f"[0]<stdout>:{ONEDNN}", "[0]<stdout>:mine"]     # stdout: all
        assert (tmp_path / str(hide) / "rank.0" / "stderr").read_text().count("\n") == 3       # files: all



@pytest.mark.unit
def test_the_stderr_filter_drops_whole_startup_notes_and_copies_every_other_byte():
    import os
    from horovod.runner.note_filter import copy_lines
    warning = "W0000 00:00:1796646901.298749    2135 port.cc:153] a warning"
    given = (f"{PREAMBLE}\n{ONEDNN}\nmine\n{warning}\n{CPU_NOTE}\r\n".encode()
             + b"bad \xff bytes\n" + f"USER {ONEDNN}\nlast without an end".encode())
    src_r, src_w = os.pipe()
    dst_r, dst_w = os.pipe()
    os.write(src_w, given)
    os.close(src_w)
    copy_lines(src_r, dst_w)
    os.close(src_r)
    os.close(dst_w)
    with os.fdopen(dst_r, "rb") as out:
        assert out.read() == (f"mine\n{warning}\n".encode() + b"bad \xff bytes\n"
                              + f"USER {ONEDNN}\nlast without an end".encode())


@pytest.mark.unit
def test_the_stderr_filter_shows_a_line_without_its_end_after_a_quiet_and_never_judges_its_rest():
    import os
    import select
    import threading
    from horovod.runner.note_filter import copy_lines
    src_r, src_w = os.pipe()
    dst_r, dst_w = os.pipe()
    copier = threading.Thread(target=copy_lines, args=(src_r, dst_w), kwargs={"quiet_s": 0.05}, daemon=True)
    copier.start()
    try:
        os.write(src_w, b"prompt> ")
        assert select.select([dst_r], [], [], 10)[0], "a line without its end is held back"
        assert os.read(dst_r, 100) == b"prompt> "      # shown while the worker still runs
        os.write(src_w, f"{ONEDNN}\n{ONEDNN}\n".encode())   # the rest of that line passes; a whole note does not
    finally:
        os.close(src_w)
    copier.join(10)
    os.close(src_r)
    os.close(dst_w)
    with os.fdopen(dst_r, "rb") as out:
        assert out.read() == f"{ONEDNN}\n".encode()


FILTERED_WORKER = """
import os, signal, sys
from horovod.runner import note_filter
notes = note_filter.start()
print(notes.pid, flush=True)
os.write(2, PREAMBLE.encode() + b"\\n")
os.write(2, b"mine\\n")
sys.stderr.write(ONEDNN + "\\n")
if sys.argv[1] == "stop":
    assert notes.stop() == 0
    os.write(2, PREAMBLE.encode() + b"\\n")     # fd 2 is the old one again: not filtered
else:
    os.write(2, b"last words\\n")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.cli
@pytest.mark.parametrize("end", ["stop", "kill"])
def test_a_filtered_stderr_loses_no_line_and_its_filter_ends_with_the_worker(end):
    code = f"PREAMBLE = {PREAMBLE!r}\nONEDNN = {ONEDNN!r}\n{FILTERED_WORKER}"
    env = {**config.environ_snapshot(), **package_pythonpath()}
    proc = subprocess.run([sys.executable, "-c", code, end], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == (0 if end == "stop" else -9), proc.stderr
    assert proc.stderr == ("mine\n" + (f"{PREAMBLE}\n" if end == "stop" else "last words\n")), proc.stderr
    pid = int(proc.stdout)
    deadline = time.monotonic() + 10      # (run() returned: the filter closed the pipe; now its process is gone)
    while not _gone(pid):
        assert time.monotonic() < deadline, f"the filter {pid} outlived its worker"
        time.sleep(0.05)

TF_JOB = """
import sys, warnings
import tensorflow as tf
import horovod.tensorflow as hvd
hvd.init()
total = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum)
print("USER-LINE", hvd.rank(), total.numpy().tolist())
print("USER-STDERR", hvd.rank(), file=sys.stderr)
warnings.warn(f"USER-WARNING {hvd.rank()}")
hvd.shutdown()
"""


@pytest.mark.cli
def test_a_successful_tensorflow_job_shows_the_users_output_once_and_no_startup_notes(tmp_path):
    import importlib.util
    if importlib.util.find_spec("tensorflow") is None:     # (not imported here: a minute on a busy machine)
        pytest.skip("the tensorflow extra is not installed")
    (tmp_path / "job.py").write_text(TF_JOB)
    env = {**{k: v for k, v in config.environ_snapshot().items() if not k.startswith("TF_")}, **package_pythonpath()}
    proc = subprocess.run([sys.executable, "-m", "horovod.runner", "-np", "2", sys.executable, "job.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = proc.stdout + proc.stderr
    for noise in ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard",
                  "This TensorFlow binary is optimized"):
        assert noise not in said, said[-3000:]
    for rank in (0, 1):
        assert proc.stdout.count(f"[{rank}]<stdout>:USER-LINE {rank} [2.0, 4.0]") == 1, proc.stdout
        assert proc.stderr.count(f"[{rank}]<stderr>:USER-STDERR {rank}") == 1, proc.stderr
        assert proc.stderr.count(f"UserWarning: USER-WARNING {rank}") == 1, proc.stderr     # the user's warnings pass


SPARK_IMPORT = """
import warnings
before = list(warnings.filters)
import horovod.spark
assert warnings.filters == before, "importing horovod.spark changed the process's warning filters"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import pyspark.testing.utils      # what every SparkContext start loads, and where pyspark warns
    warnings.warn("USER-OWN", FutureWarning)
print(sorted(str(w.message)[:40] for w in caught))
"""


@pytest.mark.unit
def test_pysparks_pandas_warning_is_quieted_and_nothing_else(tmp_path):
    # Every SparkContext start printed pyspark's "does not yet fully support pandas >= 3.0.0" FutureWarning; after
    # import horovod.spark only that one is gone: the user's own FutureWarning still shows, and the process's
    # filters are as they were.
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    proc = subprocess.run([sys.executable, "-c", SPARK_IMPORT], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**config.environ_snapshot(), **package_pythonpath()})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "['USER-OWN']", proc.stdout + proc.stderr[-2000:]
    assert "does not yet fully support pandas" not in proc.stderr, proc.stderr
