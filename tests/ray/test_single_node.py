"""Horovod on a real one-node Ray cluster, one for the module (tier ranks).

RayExecutor with 1, 2 and 3 workers: every call, failures, clean shutdown, and a TensorFlow job whose driver shows
the workers' own output and none of TensorFlow's start-up notes; HorovodTrainer.fit() on 2 workers returns
a Result with reported metrics and a checkpoint; examples/ray_digits.py reaches 95 % test accuracy.
"""

import json
import os
import re
import tempfile
import time

import numpy as np
import pytest

from ray_clusters import EXAMPLES, local_ray

ray = pytest.importorskip("ray")
ray_train = pytest.importorskip("ray.train")
from horovod.ray import HorovodConfig, HorovodTrainer, RayExecutor  # noqa: E402

pytestmark = [pytest.mark.ranks, pytest.mark.serial]

CPUS = 5


@pytest.fixture(scope="module", autouse=True)
def cluster():
    with local_ray(CPUS):
        yield


def _settings(**kw):
    return RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=kw.pop("pg_timeout", 30), **kw)


@pytest.fixture
def executor_of():
    made = []

    def make(**kwargs):
        ex = RayExecutor(_settings(), **kwargs)
        made.append(ex)
        return ex
    yield make
    for ex in made:
        ex.shutdown()


def collectives(offset):
    import horovod.numpy as hvd
    hvd.init()
    r, s = hvd.rank(), hvd.size()
    total = hvd.allreduce(np.arange(5, dtype=np.float64) + r, op=hvd.Sum)
    gathered = hvd.allgather(np.full((r + 1, 2), r, dtype=np.int32))
    root = hvd.broadcast(np.full(3, float(r)), root_rank=s - 1)
    return dict(rank=r, size=s, local=(hvd.local_rank(), hvd.local_size()), cross=(hvd.cross_rank(), hvd.cross_size()),
                total=total.tolist(), gathered=gathered.tolist(), root=root.tolist(), pid=os.getpid(), offset=offset)


class Counter:
    def __init__(self, start, step=1):
        self.value, self.step = start, step

    def bump(self):
        self.value += self.step
        return self.value


@pytest.fixture(scope="module")
def three():
    """One 3-worker job for the tests that leave it usable (new actors cost seconds each on two cores)."""
    ex = RayExecutor(_settings(), num_workers=3)
    ex.start(executable_cls=Counter, executable_args=[10], executable_kwargs={"step": 5},
             extra_env_vars={"MY_JOB_FLAG": "on"})
    yield ex
    ex.shutdown()


def _check_collectives(results, workers):
    assert [r["rank"] for r in results] == list(range(workers))
    expected_total = (np.arange(5) * workers + sum(range(workers))).tolist()
    for rank, r in enumerate(results):
        assert r["size"] == workers and r["offset"] == 7
        assert r["local"] == (rank, workers) and r["cross"] == (0, 1)   # one node: one host
        assert r["total"] == expected_total
        assert r["gathered"] == [[q, q] for q in range(workers) for _ in range(q + 1)]
        assert r["root"] == [float(workers - 1)] * 3
    assert len({r["pid"] for r in results}) == workers


def test_three_workers_run_collectives_in_rank_order(three):
    _check_collectives(three.run(collectives, args=[7]), 3)
    assert three.run(lambda a, b=0: a + b, args=[1], kwargs={"b": 2}) == [3] * 3


@pytest.mark.parametrize("workers", [1, 2])
def test_one_and_two_workers_then_shutdown_leaves_nothing(workers):
    ex = RayExecutor(_settings(), num_workers=workers)
    try:
        ex.start()
        _check_collectives(ex.run(collectives, args=[7]), workers)
        pids = ex.adapter.pids
        assert len(pids) == workers and all(p > 0 for p in pids)
    finally:
        ex.shutdown()
    _assert_gone(pids)
    assert ex.workers == []
    deadline = time.monotonic() + 15
    while ray.available_resources().get("CPU", 0) < CPUS - 3:   # only the module's 3-worker job holds CPUs
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.05)
    assert sum(pg["state"] != "REMOVED" for pg in ray.util.placement_group_table().values()) <= 1


def test_executable_class_execute_and_execute_single(three):
    before = three.execute(lambda c: c.value)
    assert three.execute(lambda c: c.bump()) == [v + 5 for v in before]
    assert three.execute_single(lambda c: c.bump()) == before[0] + 10
    assert three.execute(lambda c: c.value)[1:] == [v + 5 for v in before[1:]]
    assert three.run(lambda: os.environ["MY_JOB_FLAG"]) == ["on"] * 3
    env = three.execute(lambda _: {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_")})
    assert [e["HOROVOD_RANK"] for e in env] == ["0", "1", "2"]
    assert len({e["HOROVOD_SECRET_KEY"] for e in env}) == 1 and env[0]["HOROVOD_START_TIMEOUT"] == "30.0"


def test_run_remote_returns_refs_by_rank(three):
    refs = three.run_remote(collectives, args=[7])
    assert len(refs) == 3 and all(isinstance(r, ray.ObjectRef) for r in refs)
    _check_collectives(ray.get(refs), 3)


def raise_on_one():
    import horovod.numpy as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("bad batch on rank one")
    return hvd.rank()


def test_worker_exception_reaches_caller_with_traceback(three):
    with pytest.raises(ValueError, match="bad batch on rank one") as info:
        three.run(raise_on_one)
    text = str(info.value)
    assert "raise_on_one" in text and "test_single_node.py" in text       # the remote traceback
    assert any("rank 1 of 3" in note for note in info.value.__notes__)
    assert three.run(lambda: "still usable") == ["still usable"] * 3  # nobody was left blocked


def raise_while_peer_waits():
    import horovod.numpy as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise KeyError("rank one gave up")
    return hvd.allreduce(np.ones(3))      # never completes: rank 1 is not there


def test_exception_while_peers_block_stops_the_job(executor_of):
    ex = executor_of(num_workers=2)
    ex.start()
    pids = ex.adapter.pids
    started = time.monotonic()
    with pytest.raises(KeyError, match="rank one gave up"):
        ex.run(raise_while_peer_waits)
    assert time.monotonic() - started < 20
    with pytest.raises(RuntimeError, match="stopped"):
        ex.run(lambda: 1)
    _assert_gone(pids)


def test_killed_actor_fails_fast_with_horovods_message(executor_of):
    ex = executor_of(num_workers=2)
    ex.start()
    pids = ex.adapter.pids
    ray.kill(ex.workers[1])
    with pytest.raises(RuntimeError, match="(?s)Process name: 1.*SIGKILL"):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ex.run(collectives, args=[0])
    _assert_gone(pids)   # fail fast: the others were stopped too



def tensorflow_job():
    import sys
    import warnings
    import tensorflow as tf
    import horovod.tensorflow as hvd
    hvd.init()
    word = ("zero", "one")[hvd.rank()]     # (Ray's relay folds lines that differ only in numbers)
    total = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum)
    print(f"USER-LINE {word} {total.numpy().tolist()}", flush=True)
    warnings.warn(f"USER-WARNING {word}")
    print(f"USER-STDERR {word}", file=sys.stderr, flush=True)   # stderr's last line: the notes came before it
    return hvd.rank()


def _note_filters(pids):
    """The stderr filter processes (horovod.runner.note_filter) whose parent is one of ``pids``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if ppid in pids and b"horovod.runner.note_filter" in cmdline.read():
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_tensorflow_job_shows_the_users_output_and_no_startup_notes(executor_of, capfd):
    import importlib.util
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("the tensorflow extra is not installed")
    ex = executor_of(num_workers=2, cpus_per_worker=1)
    ex.start()
    pids = ex.adapter.pids
    filters = _note_filters(pids)
    assert len(filters) == 2, filters       # TF_CPP_MIN_LOG_LEVEL=1, the launchers' default: one per worker
    assert ex.run(tensorflow_job) == [0, 1]
    wanted = [f"{what} {word}" for word in ("zero", "one")
              for what in ("USER-LINE", "UserWarning: USER-WARNING", "USER-STDERR")]
    said, deadline = "", time.monotonic() + 60
    while not all(w in said for w in wanted):   # Ray's log relay reaches the driver (here) asynchronously
        assert time.monotonic() < deadline, said[-3000:]
        time.sleep(0.2)
        said += "".join(capfd.readouterr())
    for noise in ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard", "rebuild TensorFlow"):
        assert noise not in said, said[-3000:]
    for word in ("zero", "one"):
        assert said.count(f"USER-LINE {word} [2.0, 4.0]") == 1 and said.count(f"USER-STDERR {word}") == 1, said
    assert "BaseHorovodWorker pid=" in said
    ex.shutdown()
    _assert_gone(pids + filters)      # each filter ends with its worker

def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"     # (a zombie has ended)
    except OSError:
        return False


def _assert_gone(pids, timeout=15.0):
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        assert time.monotonic() < deadline, f"processes still alive: {[p for p in pids if _alive(p)]}"
        time.sleep(0.05)


def test_infeasible_spread_fails_within_placement_timeout():
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=2), num_hosts=2,
                     num_workers_per_host=1)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="(?s)STRICT_SPREAD.*placement_group_timeout_s"):
        ex.start()
    assert time.monotonic() - started < 15
    assert ex.workers == []


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="use_gpu"):
        RayExecutor(_settings(), num_workers=1, gpus_per_worker=1)
    with pytest.raises(ValueError, match="elastic or static"):
        RayExecutor(_settings(), num_workers=2, min_workers=1)


def train_loop(config):
    import horovod.numpy as hvd
    import ray.train
    hvd.init()
    context = ray.train.get_context()
    assert hvd.rank() == context.get_world_rank() and hvd.size() == context.get_world_size() == 2
    assert hvd.local_rank() == context.get_local_rank()
    weights = np.zeros(3)
    for epoch in range(config["epochs"]):
        grad = hvd.allreduce(np.full(3, float(hvd.rank() + 1)))       # average of 1 and 2
        weights = weights - config["lr"] * grad
        checkpoint = None
        with tempfile.TemporaryDirectory() as folder:
            if hvd.rank() == 0:
                with open(os.path.join(folder, "weights.json"), "w") as handle:
                    json.dump(weights.tolist(), handle)
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report({"epoch": epoch, "loss": float(np.abs(weights).sum()), "size": hvd.size(),
                              "rank": hvd.rank()}, checkpoint=checkpoint)


def test_fit_on_two_workers_returns_metrics_and_checkpoint(tmp_path):
    trainer = HorovodTrainer(train_loop, train_loop_config={"epochs": 3, "lr": 0.1},
                             horovod_config=HorovodConfig(timeout_s=60),
                             scaling_config=ray_train.ScalingConfig(num_workers=2),
                             run_config=ray_train.RunConfig(name="hvd", storage_path=str(tmp_path)))
    result = trainer.fit()
    assert result.error is None
    assert result.metrics["epoch"] == 2 and result.metrics["size"] == 2 and result.metrics["rank"] == 0
    assert result.metrics["loss"] == pytest.approx(3 * 3 * 0.1 * 1.5)
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as folder:
        with open(os.path.join(folder, "weights.json")) as handle:
            assert handle.read() and json.loads(open(os.path.join(folder, "weights.json")).read()) == \
                pytest.approx([-0.45] * 3)


def test_ray_digits_example_reaches_95_percent(capsys, monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES)
    import ray_digits
    accuracy = ray_digits.main(ray_digits.parse_args(["--num-workers", "2"]))
    assert accuracy >= 0.95
    assert re.search(r"ray_digits: 2 Ray workers, test accuracy [\d.]+% \(every worker agrees: True\)",
                     capsys.readouterr().out)
