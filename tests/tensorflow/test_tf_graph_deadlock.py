"""Graph-mode collectives cannot deadlock, with one or two inter-op threads and whatever order each rank runs them in
(``docs/tensorflow.md``, "Graph ops never wait on an inter-op thread").

Two ranks build many independent collectives (and chains of dependent ones) in *opposite* orders, rank 0 with one
inter-op thread and rank 1 with two (``tf.config.threading``; one rank whose only thread waited hangs both): once as
a TF1 graph run by a ``tf.compat.v1.Session`` (no automatic control dependencies: TensorFlow runs ready ops in any
order) and once as a ``tf.function`` (automatic control dependencies chain the submissions in each rank's program
order, which differs between the ranks). With collectives that held an inter-op thread while waiting, both hang at
once. Every result is compared with numpy. The spawn's timeout is the hard limit: a hang fails the test with the
ranks' stacks. The TF1 graph's function library stays one function per output signature, however many collectives
it holds.
"""

import numpy as np
import pytest

from horovod.testing import spawn_ranks

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0", "HOROVOD_STALL_CHECK_TIME_SECONDS": "5",
          "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "15"}
KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "grouped_allreduce", "chain")
COUNT = 28     # collectives per program: every kind four times


def _value(rank, i):
    return (np.arange(6, dtype=np.float32).reshape(3, 2) + 10 * i + 100 * rank) * (1 if i % 2 else -1)


def _expected(i, n, me):
    values = [_value(k, i) for k in range(n)]
    kind = KINDS[i % len(KINDS)]
    if kind == "allreduce":
        return sum(values)
    if kind == "allgather":
        return np.concatenate([v[: k + 1] for k, v in enumerate(values)])
    if kind == "broadcast":
        return values[i % n]
    if kind == "alltoall":                         # equal splits of 2 rows per rank
        return np.concatenate([np.tile(v, (n, 1))[2 * me:2 * me + 2] for v in values])
    if kind == "reducescatter":
        return (sum(np.tile(v, (n, 1)) for v in values) / n)[3 * me:3 * me + 3]
    if kind == "grouped_allreduce":
        return sum(values) + 2 * sum(values)
    return 2 * sum(values) * n                     # chain: allreduce of an allreduce's result, doubled


def _build(tf, hvd, i, n):
    """Collective ``i`` on this rank's value; the name makes it the same op on every rank."""
    x = tf.constant(_value(hvd.rank(), i))
    kind, name = KINDS[i % len(KINDS)], f"op{i}"
    if kind == "allreduce":
        return hvd.allreduce(x, op=hvd.Sum, name=name)
    if kind == "allgather":
        return hvd.allgather(x[: hvd.rank() + 1], name=name)
    if kind == "broadcast":
        return hvd.broadcast(x, root_rank=i % n, name=name)
    if kind == "alltoall":
        return hvd.alltoall(tf.tile(x, [n, 1])[: 2 * n], name=name)
    if kind == "reducescatter":
        return hvd.reducescatter(tf.tile(x, [n, 1]), op=hvd.Average, name=name)
    if kind == "grouped_allreduce":
        a, b = hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum, name=name)
        return a + b
    first = hvd.allreduce(x, op=hvd.Sum, name=f"{name}.a")
    return 2 * hvd.allreduce(first, op=hvd.Sum, name=f"{name}.b")


def _programs():
    import os
    interop = 1 + int(os.environ["HOROVOD_RANK"])
    import tensorflow as tf
    # Before anything makes the eager context; TF1 sessions without a config of their own take the context's.
    tf.config.threading.set_inter_op_parallelism_threads(interop)
    import horovod.tensorflow as hvd
    hvd.init()
    n, me = hvd.size(), hvd.rank()
    assert me + 1 == interop and tf.config.threading.get_inter_op_parallelism_threads() == interop
    order = list(range(COUNT)) if me == 0 else list(reversed(range(COUNT)))   # each rank its own order
    want = [_expected(i, n, me) for i in range(COUNT)]
    checked = 0

    def check(results, what):
        nonlocal checked
        got = dict(zip(order, results))
        for i in range(COUNT):
            np.testing.assert_allclose(np.asarray(got[i]), want[i], rtol=1e-6, err_msg=f"{what}: op{i}")
            checked += 1

    graph = tf.Graph()                  # TF1: no automatic control dependencies, ops run in any order
    with graph.as_default():
        outputs = [_build(tf, hvd, i, n) for i in order]
        outputs.append(hvd.barrier())
        # The graph's ops share one wait function per output signature: a function per op grew the library a
        # session copies on every run (Horovod's in-place broadcast test took 136 s that way, 25 s since).
        functions = len(graph.as_graph_def().library.function)
        assert functions <= 5, f"{functions} library functions for {COUNT + 1} graph collectives"
        with tf.compat.v1.Session(graph=graph) as session:
            for run in range(2):        # a second run of the same graph reuses its waiters
                check(session.run(outputs)[:-1], f"session run {run}")

    @tf.function(autograph=False)
    def step():                         # automatic control dependencies: submissions in this rank's order
        return [_build(tf, hvd, i, n) for i in order]
    for run in range(2):
        check([t.numpy() for t in step()], f"tf.function run {run}")
    hvd.shutdown()
    return checked


@pytest.mark.ranks
def test_graph_collectives_in_different_orders_cannot_deadlock():
    pytest.importorskip("tensorflow")
    checked = spawn_ranks(_programs, 2, timeout=120, env=TF_ENV)
    assert checked == [4 * COUNT, 4 * COUNT]
