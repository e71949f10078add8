"""The simulation charges every collective its data phase (issue 50, item 4): the algorithm the engine would choose
for the size and group, timed on the world's link and memory models; a step whose allreduces do not ride the
negotiation takes at least their data phases."""

import pytest

pytest.importorskip("greenlet")

from horovod.algorithms import allreduce as algorithms  # noqa: E402
from horovod.common.types import OpType  # noqa: E402
from horovod.tools.simulate import dataphase  # noqa: E402
from horovod.tools.simulate.job import Workload, scenario  # noqa: E402
from horovod.tools.simulate.world import World  # noqa: E402


@pytest.mark.unit
def test_the_engines_choice_of_algorithm_and_its_time_on_the_link_model():
    world = World(64, 8, 8, seed=1)
    members = list(range(64))
    assert dataphase.algorithm(world, members[:3], 8, False) == algorithms.EXCHANGE
    assert dataphase.algorithm(world, members, 8, False) == algorithms.RECURSIVE_DOUBLING
    assert dataphase.algorithm(world, members, 1 << 20, False) == algorithms.RING
    assert dataphase.algorithm(world, members, 1 << 20, True) == algorithms.HIERARCHICAL
    # A ring over 8 hosts: 2(n-1) steps of a link's latency and both ends' handling, 2(n-1)/n of the bytes through
    # the slowest link (across hosts).
    link, cpu, n, nbytes = world.link, world.cpu, 64, 64 << 20
    hop = ((n - 8) * link.local_latency + 8 * link.remote_latency) / n + 2 * cpu.frame
    expected = 2 * (n - 1) * hop + 2 * (n - 1) / n * nbytes / link.remote_bandwidth
    assert dataphase.seconds(world, OpType.ALLREDUCE, members, nbytes) == pytest.approx(expected)
    # Recursive doubling: six hops, three within a host and three across.
    small = dataphase.seconds(world, OpType.ALLREDUCE, members, 8)
    assert 3 * link.remote_latency + 3 * link.local_latency < small < 6 * (link.remote_latency + 3 * cpu.frame)
    assert dataphase.seconds(world, OpType.ALLREDUCE, [5], 1 << 20) == 0.0
    # A large broadcast is a chain: its bytes cross the slowest link once, pipelined (a little more than B / bw, well
    # under the ring allreduce's 2(n-1)/n B / bw), not once per hop.
    bcast = dataphase.seconds(world, OpType.BROADCAST, members, nbytes)
    assert nbytes / link.remote_bandwidth < bcast < expected


@pytest.mark.unit
def test_a_step_of_allreduces_too_large_to_ride_the_negotiation_takes_their_data_phases():
    count = 1 << 18        # 1 MiB of float32 a tensor: past what rides a frame, so the data plane runs it
    job = scenario(16, 1, workload=Workload(steps=3, tensors=2, count=count, compute=0.0, jitter=0.0, mixed=False))
    plane = job.answers.plane
    assert plane.phases >= 3 and plane.seconds > 0
    ring = dataphase.seconds(job.world, OpType.ALLREDUCE, list(range(16)), 4 * count)
    latency = [job.step_done[s] - job.step_submitted[s] for s in (1, 2)]
    assert all(step >= ring for step in latency), (latency, ring)
    small = scenario(16, 1, workload=Workload(steps=3, tensors=2, count=1, compute=0.0, jitter=0.0, mixed=False))
    assert small.answers.plane.phases == 0      # 4 B tensors ride the negotiation: no data phase
    assert job.step_done[2] - job.step_submitted[2] > 2 * (small.step_done[2] - small.step_submitted[2])
