"""Negotiation protocols driven through their events alone (tests/test_protocol_*.py): a view of the engine with
nothing that does I/O, and a network that carries the protocols' Send actions, the test saying what time it is."""

from types import SimpleNamespace

import numpy as np

from horovod.common.config import load_config
from horovod.common.types import OpType, Request
from horovod.core.negotiation.base import BATCH_SPACING_SECONDS
from horovod.core.negotiation.events import Execute, Send
from horovod.core.negotiation.frames import decode
from horovod.core.ops import Entry
from horovod.core.set_state import NEW, ProcessSets
from horovod.core.waiters import Waiters


class View:
    """What the engine lends a protocol: rank, size, process sets, who waits, the pacing settings."""

    def __init__(self, rank, size, every_member_coordinates, sets=()):
        self.rank, self.size = rank, size
        self._sets = ProcessSets(rank, None, load_config({}), None, every_member_coordinates)
        self._sets.add(0, range(size))
        for set_id, ranks in sets:
            self._sets.add(set_id, ranks)
        self.sets = self._sets.by_id
        self.waiters = Waiters()
        self.cycle_time = 0.005
        self.stopping = False

    def shutting_down(self):
        return self.stopping

    def batch_spacing(self):
        return BATCH_SPACING_SECONDS

    def work(self):
        return NEW if self.stopping else self._sets.work()

    def submit(self, name, value, set_id=0):
        """Queue an allreduce of four float32 ``value``s, as Engine.submit does."""
        array = np.full(4, value, dtype=np.float32)
        request = Request(name, OpType.ALLREDUCE, "float32", (4,))
        state = self.sets[set_id]
        state.entries[name] = Entry(request, array, None, SimpleNamespace(), set_id)
        state.queue.append(request)


class Net:
    """Ranks' protocols and the frames in flight between them; each rank's other actions are returned."""

    def __init__(self, protocols, views):
        self.protocols, self.views = protocols, views
        self.in_flight = []     # (sender, receiver, wire), in order

    def perform(self, rank, actions):
        rest = []
        for action in list(actions):
            if type(action) is Send:
                self.in_flight += [(rank, peer, action.wire) for peer in action.peers]
            else:
                rest.append(action)
        return rest

    def woken(self, rank, now):
        return self.perform(rank, self.protocols[rank].woken(now))

    def to(self, receiver):
        """The senders of the frames in flight to ``receiver``."""
        return [sender for sender, peer, _ in self.in_flight if peer == receiver]

    def deliver(self, receiver, now):
        """Hand ``receiver`` the first frame in flight from each peer it listens to, in its order, as the pump does;
        the actions that are not sends."""
        protocol, rest = self.protocols[receiver], []
        for sender in list(protocol.listening):
            for i, (source, peer, wire) in enumerate(self.in_flight):
                if source == sender and peer == receiver:
                    del self.in_flight[i]
                    kinds = protocol.expects        # (one tuple, or one per peer)
                    kinds = kinds[sender] if type(kinds) is dict else kinds
                    rest += self.perform(receiver, protocol.frame(sender, decode(wire, sender, *kinds), now))
                    break
        return rest

    def turn(self, rank, now, set_id=0):
        """The rank's turn at ``set_id``, reading (delivering) what its round listens to until it decides."""
        return self.finish(rank, self.start(rank, now, set_id), now)

    def start(self, rank, now, set_id=0):
        """Begin the rank's turn at ``set_id``: what it did besides sending."""
        return self.perform(rank, self.protocols[rank].turn(self.views[rank].sets[set_id], False, now))

    def finish(self, rank, actions, now):
        """Deliver what the rank's round listens to until it decides; its decision."""
        while not any(type(a) is Execute for a in actions):
            assert self.protocols[rank].listening, "neither decided nor listens"
            actions += self.deliver(rank, now)
        [decision] = [a.decision for a in actions if type(a) is Execute]
        return decision


def kinds(net):
    """(sender, receiver, frame kind) of every frame in flight, in order."""
    return [(sender, receiver, type(decode(wire, sender)).__name__) for sender, receiver, wire in net.in_flight]


def folded(decision):
    """The one batch's result, folded by its coordinator, as floats."""
    [batch] = decision.batches
    return np.frombuffer(batch.folded, dtype=np.float32).tolist()


def names(decision):
    return [[n for r in batch.responses for n in r.names] for batch in decision.batches]
