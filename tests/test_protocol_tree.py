"""The tree negotiation as a state machine, every rank driven through its events alone.

Five ranks: rank 0 (the root) with children 1, 2 and 3; rank 1 relays for its child 4. Each rule of the tree
(horovod/core/negotiation/tree.py's docstring) is checked where it decides: a subtree's message goes up unasked once
the whole subtree waits, a relay folds its subtree's small allreduces on the way up, the root decides at once when
every message is in, the reply comes down through the relays, WANT bits start a cycle after the batch spacing, and
another process set negotiates as under the star.
"""

import numpy as np
import pytest
from protocol_harness import Net, View, folded as _folded, kinds as _kinds, names

from horovod.core.negotiation.base import BATCH_SPACING_SECONDS
from horovod.core.negotiation.events import BEGIN, DRAIN
from horovod.core.negotiation.frames import WANT_EVERY, Up, decode
from horovod.core.negotiation.tree import TreeProtocol

pytestmark = pytest.mark.unit

SIZE = 5


def _tree(sets=()):
    views = [View(rank, SIZE, False, sets) for rank in range(SIZE)]
    return Net([TreeProtocol(view) for view in views], views)


def test_a_waiting_job_sends_its_messages_up_unasked_and_the_reply_alone_starts_the_cycle_down_the_tree():
    net = _tree()
    for rank, view in enumerate(net.views):
        view.submit("a", float(rank + 1))
        view.waiters.blocked = 1
    for rank in (2, 3, 4):      # the leaves: their subtree is themselves
        assert net.woken(rank, 0.0) == []
    assert _kinds(net) == [(2, 0, "Up"), (3, 0, "Up"), (4, 1, "Up")]
    assert net.woken(1, 0.0) == [] and net.in_flight[-1][:2] == (4, 1)    # the relay waits for its child
    assert net.deliver(1, 0.001) == [] and net.woken(1, 0.001) == []
    up = decode(net.in_flight[-1][2], 1)
    assert type(up) is Up and sorted(r for ranks, _ in up.groups for r in ranks) == [1, 4]
    [(key, data)] = up.datas                    # the relay folded its subtree's data into one contribution
    assert (key.first, key.count) == (1, 2) and np.frombuffer(data["a"], dtype=np.float32).tolist() == [7.0] * 4
    assert net.woken(0, 0.002) == []            # the root waits for every child's message
    assert net.deliver(0, 0.002) == []
    assert net.woken(0, 0.002) == [DRAIN, BEGIN] and net.in_flight == []     # no GO: everything is in
    root = net.turn(0, 0.002)
    assert names(root) == [["a"]] and _folded(root) == [15.0] * 4
    assert _kinds(net) == [(0, 1, "Reply"), (0, 2, "Reply"), (0, 3, "Reply")]
    for rank in (1, 2, 3):
        assert net.deliver(rank, 0.003) == [DRAIN, BEGIN]   # the reply to its subtree's message starts its cycle
        assert _folded(net.turn(rank, 0.003)) == [15.0] * 4
    assert _kinds(net) == [(1, 4, "Reply")]                 # passed down by the relay before it executes
    assert net.deliver(4, 0.004) == [DRAIN, BEGIN] and _folded(net.turn(4, 0.004)) == [15.0] * 4
    assert [p.listening for p in net.protocols] == [()] * SIZE     # a cycle ends listening to nobody (events.py)
    assert sum(p.frames for p in net.protocols) == 2 * 4 * 2       # every edge: one frame up, one down


def test_want_bits_climb_the_tree_and_the_root_starts_the_cycle_after_the_batch_spacing():
    net = _tree()
    for view in net.views:
        view.submit("a", 1.0)               # a backward pass under way everywhere: nobody waits
    for rank in (4, 2, 3):
        assert net.woken(rank, 0.0) == []
    assert [decode(wire, s).bits for s, _, wire in net.in_flight] == [WANT_EVERY] * 3
    assert net.woken(4, 0.001) == [] and len(net.in_flight) == 3       # told once a cycle
    assert net.deliver(1, 0.001) == [] and net.woken(1, 0.001) == []
    assert _kinds(net)[-1] == (1, 0, "Want")
    assert net.deliver(0, 0.002) == [] and net.woken(0, 0.002) == []
    root = net.protocols[0]
    assert root.timeout == pytest.approx(BATCH_SPACING_SECONDS)
    assert net.woken(0, 0.002 + BATCH_SPACING_SECONDS) == [DRAIN, BEGIN]
    assert _kinds(net) == [(0, 1, "Go"), (0, 2, "Go"), (0, 3, "Go")]
    for rank in (1, 2, 3):
        assert net.deliver(rank, 0.013) == [DRAIN, BEGIN]
    assert _kinds(net) == [(1, 4, "Go")]
    assert net.deliver(4, 0.013) == [DRAIN, BEGIN]
    # The cycle: every rank sends its subtree's message up when asked, the relay reading its child's first.
    started = {rank: net.start(rank, 0.014) for rank in (4, 2, 3)}
    started[1] = net.start(1, 0.014)
    assert net.deliver(1, 0.014) == [] and _kinds(net)[-1] == (1, 0, "Up")
    decided = net.turn(0, 0.015)
    assert names(decided) == [["a"]] and _folded(decided) == [5.0] * 4
    for rank in (1, 2, 3, 4):
        assert _folded(net.finish(rank, started[rank], 0.016)) == [5.0] * 4


def test_another_process_set_negotiates_through_its_first_rank_as_under_the_star():
    net = _tree(sets=[(1, (2, 4))])
    net.views[2].submit("b", 2.0, set_id=1)
    net.views[4].submit("b", 3.0, set_id=1)
    started = net.start(4, 0.0, set_id=1)
    assert _kinds(net) == [(4, 2, "Msg")] and net.protocols[4].listening == (2,)
    assert names(net.turn(2, 0.0, set_id=1)) == [["b"]]
    assert names(net.finish(4, started, 0.0)) == [["b"]] and net.in_flight == []
    assert net.protocols[2].listening == () and net.protocols[4].listening == ()
