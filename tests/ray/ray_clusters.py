"""Ray clusters for the Ray tests (imported by them): one per test module, as Ray takes seconds to start on two cores.

Worker actors import the test modules' functions by name, so the clusters' processes get this directory, the
repository and its examples on ``PYTHONPATH``. The object store is kept small: the tests move kilobytes through Ray, their tensors go
through Horovod.
"""

import contextlib
import os
import secrets

import pytest

ray = pytest.importorskip("ray")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(ROOT, "examples")
STORE_BYTES = 80 * 1024 * 1024
# The Ray tests' token. A new local Ray turns on token authentication and, finding no token in the environment,
# writes one to ~/.ray/auth_token, which a test must not leave behind; `ray start` in token mode (test_netns) needs
# one and creates none, and a fresh machine has no file. The driver (this process) and every process of the clusters
# it starts use this one; nothing but Ray reads the variable.
TOKEN = os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))


@contextlib.contextmanager
def _actor_pythonpath():
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, ROOT, EXAMPLES, old) if p)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@contextlib.contextmanager
def local_ray(num_cpus: int):
    """A one-node Ray with ``num_cpus`` CPUs, shut down on exit."""
    with _actor_pythonpath():
        ray.init(num_cpus=num_cpus, include_dashboard=False, object_store_memory=STORE_BYTES,
                 configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()


@contextlib.contextmanager
def multinode_ray(*cpus_per_node: int):
    """Ray's multi-node test cluster on this machine: a head without CPUs (the driver's node) and one node per
    entry of ``cpus_per_node``; every node is stopped on exit."""
    from ray.cluster_utils import Cluster
    with _actor_pythonpath():
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "object_store_memory": STORE_BYTES})
        try:
            for cpus in cpus_per_node:
                cluster.add_node(num_cpus=cpus, object_store_memory=STORE_BYTES)
            ray.init(address=cluster.address, configure_logging=False)
        except BaseException:
            cluster.shutdown()
            raise
    try:
        yield cluster
    finally:
        ray.shutdown()
        with _actor_pythonpath():
            cluster.shutdown()


def add_node(cluster, cpus: int):
    """Add a node of ``cpus`` CPUs to a :func:`multinode_ray` cluster (from the main thread: Ray's rule)."""
    with _actor_pythonpath():
        return cluster.add_node(num_cpus=cpus, object_store_memory=STORE_BYTES)
