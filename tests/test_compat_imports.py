"""Horovod 0.28.1's import paths and version gate, as code outside the package uses them (tier unit)."""

import importlib
import sys
import threading

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import horovod

pytestmark = pytest.mark.unit


def test_version_passes_horovod_version_gates():
    version = Version(horovod.__version__)
    assert version in SpecifierSet(">=0.28.1") and version >= Version("0.28.1")
    assert version in SpecifierSet(">=0.28") and version not in SpecifierSet(">=0.29")
    assert not version.is_prerelease and not version.is_devrelease
    from horovod.version import HOROVOD_API_VERSION, RELEASE
    assert horovod.__version__ == f"{HOROVOD_API_VERSION}.{RELEASE}"


def test_common_util_names_and_build_facts_agree_with_the_runtime():
    from horovod.common import util
    from horovod.runtime import basics
    for name in ("env", "gloo_built", "mpi_built", "nccl_built", "ddl_built", "ccl_built", "gpu_available",
                 "check_extension", "extension_available", "split_list", "num_rank_is_power_2",
                 "get_average_backwards_compatibility_fun", "is_iterable", "_cache"):
        assert callable(getattr(util, name)), name
    assert (util.gloo_built(), util.mpi_built(), util.nccl_built(), util.ddl_built(), util.ccl_built()) == \
        (basics.gloo_built(), basics.mpi_built(), basics.nccl_built(), basics.ddl_built(), basics.ccl_built())
    assert util.gpu_available("torch") is False
    assert util.extension_available("mxnet") is False
    with pytest.raises(ImportError, match="horovod.mxnet"):
        util.check_extension("horovod.mxnet", "HOROVOD_WITH_MXNET", __file__, "mpi_lib")
    assert util.split_list(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert [util.num_rank_is_power_2(n) for n in (0, 1, 2, 3, 4, 6, 8)] == [False, True, True, False, True, False,
                                                                           True]
    assert util.is_version_greater_equal_than("2.13.0", "2.4.1") and not util.is_version_greater_equal_than("1.9",
                                                                                                            "1.10")


def test_common_util_env_restores_the_environment():
    from horovod.common import config, util
    config.environ_set("HVD_TEST_KEEP", "before")
    try:
        with util.env(HVD_TEST_KEEP="inside", HVD_TEST_NEW="new", HVD_TEST_NONE=None):
            assert config.environ_get("HVD_TEST_KEEP") == "inside" and config.environ_get("HVD_TEST_NEW") == "new"
            assert config.environ_get("HVD_TEST_NONE") is None
        assert config.environ_get("HVD_TEST_KEEP") == "before" and config.environ_get("HVD_TEST_NEW") is None
    finally:
        config.environ_set("HVD_TEST_KEEP", None)


def test_average_backwards_compatibility_rule():
    from horovod.common.util import get_average_backwards_compatibility_fun
    from horovod.runtime import collectives as ops
    rule = get_average_backwards_compatibility_fun(ops)
    assert rule(None, None) == ops.Average and rule(ops.Max, None) == ops.Max
    with pytest.warns(DeprecationWarning):
        assert rule(None, False) == ops.Sum
    with pytest.raises(ValueError, match="supersedes"):
        rule(ops.Sum, True)


@pytest.mark.parametrize("old, new", [
    ("horovod.common.process_sets", "horovod.runtime.process_sets"),
    ("horovod.common.basics", "horovod.runtime.basics"),
    ("horovod.common.elastic", "horovod.elastic"),
    ("horovod.elastic.worker", "horovod.runtime.elastic_worker"),
    ("horovod.elastic.protocol", "horovod.common.elastic_records"),
])
def test_old_paths_hold_the_same_objects(old, new):
    """Horovod's paths are real files (found by an IDE and ``python -m``) that hand out the very objects."""
    shim, real = importlib.import_module(old), importlib.import_module(new)
    assert shim.__file__ and shim.__file__ != real.__file__
    for name, value in vars(real).items():
        if not name.startswith("__"):
            assert getattr(shim, name) is value, name
    assert set(getattr(real, "__all__", ())) <= set(dir(shim))


@pytest.mark.parametrize("old", ["horovod.common.collectives", "horovod.common.compression",
                                 "horovod.common.topology", "horovod.common.launch_env"])
def test_paths_horovod_never_had_are_gone(old):
    """Horovod 0.28.1's ``horovod/common`` had no such modules; the real ones live in ``horovod.runtime``."""
    with pytest.raises(ImportError):
        importlib.import_module(old)


@pytest.mark.parametrize("binding", ["horovod.numpy", "horovod.torch", "horovod.tensorflow",
                                     "horovod.tensorflow.keras", "horovod.keras", "horovod.jax",
                                     "horovod.torch.mpi_ops", "horovod.tensorflow.mpi_ops"])
def test_bindings_export_every_shared_name(binding):
    """Each binding imports the shared names by name: all of ``binding_api.__all__``, the very objects, and every
    name of its own ``__all__`` resolves (``from binding import *`` works)."""
    from horovod.runtime import binding_api
    module = pytest.importorskip(binding)
    for name in binding_api.__all__:
        assert getattr(module, name) is getattr(binding_api, name), name
    assert [name for name in module.__all__ if not hasattr(module, name)] == []


@pytest.mark.parametrize("path", ["horovod.runner.launch", "horovod.common.basics", "horovod.common.process_sets",
                                  "horovod.common.elastic", "horovod.elastic.worker", "horovod.elastic.protocol",
                                  "horovod.keras.callbacks", "horovod.keras.elastic", "horovod.runtime.mpi_ops_names"])
def test_re_exporting_modules_name_what_they_export(path):
    """A module that re-exports by name lists it in ``__all__``, and every listed name resolves."""
    module = pytest.importorskip(path)
    assert module.__all__ and [name for name in module.__all__ if name not in vars(module)] == []


def test_no_import_finder_serves_horovod():
    import horovod  # noqa: F401
    assert not [f for f in sys.meta_path if type(f).__module__.startswith("horovod")]


def test_process_set_internals_horovod_tests_use():
    from horovod.common import process_sets
    from horovod.common.elastic import ObjectState, State, run_fn
    assert callable(process_sets._get_process_set_ids_and_ranks)
    assert process_sets.ProcessSet([2, 0]).ranks == [0, 2]
    assert issubclass(ObjectState, State) and callable(run_fn)


def test_runner_util_threads():
    from horovod.runner.util.threads import execute_function_multithreaded, in_thread, on_event
    box = []
    in_thread(box.append, args=(1,), daemon=False).join()
    assert box == [1]
    with pytest.raises(ValueError, match="tuple"):
        in_thread(box.append, args=[2])
    event, stop = threading.Event(), threading.Event()
    fired = on_event(event, box.append, args=(3,), stop=stop, check_stop_interval_s=0.01)
    event.set()
    fired.join(5)
    cancelled = on_event(threading.Event(), box.append, args=(4,), stop=stop, check_stop_interval_s=0.01)
    stop.set()
    cancelled.join(5)
    assert box == [1, 3] and not cancelled.is_alive()
    assert execute_function_multithreaded(lambda a, b: a * b, [(1, 2), (3, 4), (5, 6)]) == {0: 2, 1: 12, 2: 30}
    with pytest.raises(RuntimeError, match="did not complete"):
        execute_function_multithreaded(lambda a: 1 / a, [(1,), (0,)])


def test_runner_common_util(monkeypatch):
    from horovod.runner.common.util import env, hosts, network, secret, settings, timeout
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.delenv("HOROVOD_RANK", raising=False)
    monkeypatch.delenv("HOROVOD_SIZE", raising=False)
    assert env.get_env_rank_and_size() == (2, 4)
    assert env.is_exportable("PATH") and not env.is_exportable("BASH_FUNC_x%%")
    assert not env.is_exportable(secret.HOROVOD_SECRET_KEY)
    key = secret.make_secret_key()
    assert len(key) == 32 and secret.check_digest(key, b"m", secret.compute_digest(key, b"m"))
    assert not secret.check_digest(key, b"m", secret.compute_digest(b"other", b"m"))
    deadline = timeout.Timeout(0, "Timed out waiting for {activity}")
    with pytest.raises(timeout.TimeoutException, match="waiting for the hosts. Timeout after 0 seconds"):
        while True:
            deadline.check_time_out_for("the hosts")
    assert hosts.parse_hosts_and_slots("a:2,b:1") == (["a", "b"], {"a": 2, "b": 1})
    slots = hosts.get_host_assignments(hosts.parse_hosts("a:2,b:2"), 1, 3)
    assert [(s.hostname, s.rank, s.local_rank, s.cross_rank) for s in slots] == [("a", 0, 0, 0), ("a", 1, 1, 0),
                                                                              ("b", 2, 0, 1)]
    assert hosts.slot_response_string(slots[2]) == "2,3,0,1,1,2"
    with pytest.raises(ValueError, match="more processes"):
        hosts.get_host_assignments(hosts.parse_hosts("a:1"), 2)
    assert settings.Settings(hosts="a:1", num_proc=1, verbose=2).hosts == "a:1"
    assert "127.0.0.1" in network.get_local_host_addresses()
    assert network.filter_local_addresses(["localhost", "127.0.0.1", "203.0.113.9"]) == ["203.0.113.9"]


def test_tensorflow_util():
    pytest.importorskip("tensorflow")
    from horovod.tensorflow import util
    import tensorflow as tf
    assert util._executing_eagerly() and util._has_eager
    calls = []
    cached = util._cache(lambda x: calls.append(x) or x * 2)
    assert cached(2) == 4 and cached(2) == 4 and calls == [2]
    v = tf.Variable(1.0)
    assert util.refs_to_vars(util.vars_to_refs([v]))[0] is v
    assert float(util._make_subgraph(lambda: tf.constant(3.0) * 2)()) == 6.0


HOROVOD_MPI_OPS_NAMES = ("init", "shutdown", "is_initialized", "size", "local_size", "cross_size", "rank",
                         "local_rank", "cross_rank", "mpi_threads_supported", "mpi_enabled", "mpi_built",
                         "gloo_enabled", "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
                         "rocm_built", "start_timeline", "stop_timeline", "Average", "Sum", "Adasum", "Min", "Max",
                         "Product", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
                         "handle_average_backwards_compatibility", "_basics", "allreduce", "allgather", "broadcast",
                         "alltoall", "reducescatter", "grouped_allreduce", "grouped_allgather",
                         "grouped_reducescatter", "join")


def _check_mpi_ops(module, binding):
    missing = [name for name in HOROVOD_MPI_OPS_NAMES if not hasattr(module, name)]
    assert not missing, missing
    assert module.init is binding.init and module.Sum == binding.Sum and module.rank is binding.rank
    assert module._basics._get_process_set_ids_and_ranks is not None


def test_tensorflow_mpi_ops_has_horovods_names():
    pytest.importorskip("tensorflow")
    import horovod.tensorflow as hvd
    from horovod.tensorflow import mpi_ops
    _check_mpi_ops(mpi_ops, hvd)
    assert mpi_ops.allreduce is hvd.allreduce


def test_torch_mpi_ops_has_horovods_names():
    pytest.importorskip("torch")
    import horovod.torch as hvd
    from horovod.torch import mpi_ops
    _check_mpi_ops(mpi_ops, hvd)
    assert mpi_ops.allreduce is hvd.allreduce
