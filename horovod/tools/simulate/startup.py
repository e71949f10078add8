"""Start-up, modelled: the launcher spawning ranks, each rank booting (the interpreter, numpy and horovod imported) on
its host's cores, and the rendezvous server every rank registers with and asks for everyone's records.

What runs for real afterwards is the control plane: each rank, once it holds the records, starts its negotiation and
submits its first allreduce, and the simulated job runs it (new names: the first cycle's full requests). The figure
is when the last rank holds that first result, from the launch, as ``bench/scale_control.py`` measures it.

The launcher, spawners and server are modelled, not run: a host's spawner starts its ranks one after another
(``spawn`` apart; other hosts are reached over ssh in parallel, ``remote`` later), a rank's boot is one run of
``boot`` seconds on a core of its host (so ``n`` ranks on ``c`` cores boot in ``n / c`` waves, as the kernel's time
slices would finish them), and the server (horovodrun's one thread: :mod:`horovod.runner.rendezvous`) serves
requests in arrival order, ``request`` seconds each; once every rank has registered it answers each waiting rank with
every record (``record`` bytes per rank, written at ``serve_bandwidth``). Past
:data:`~horovod.core.bootstrap.DIRECT_RECORDS_MAX_RANKS` ranks only rank 0 asks the server; every other rank gets the
records from its parent in the 3-ary tree, as :func:`horovod.core.bootstrap.connect` hands them down (a frame of the
records per child, costed as any frame). The server's own core is not taken from the ranks' (horovodrun's work is
small beside theirs on one host, and elsewhere it runs on its own).

A failing rank reads the job's loss board and posts its account before it hangs up: two more requests to the same
server (:meth:`Rendezvous.post_loss`), so at scale the survivors' failures queue there too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from horovod.core.bootstrap import DIRECT_RECORDS_MAX_RANKS
from horovod.core.negotiation.tree import children

__all__ = ["RENDEZVOUS_FD", "StartupModel", "Rendezvous"]

RENDEZVOUS_FD = -2      # the rendezvous answer's descriptor in a rank's wait


@dataclass(frozen=True)
class StartupModel:
    """What start-up costs (seconds, bytes). Fitted to a host by :mod:`horovod.tools.simulate.calibration`."""

    launch: float = 0.15            # the launcher's own start, until its first spawn
    spawn: float = 0.004            # between two ranks a host's spawner starts
    remote: float = 0.3             # reaching another host: ssh and its agent's start (hosts in parallel)
    boot: float = 0.2               # a rank's CPU until it calls init: the interpreter and the imports
    request: float = 150e-6         # the server's CPU per request (a registration, or an ask for every record)
    record: int = 120               # bytes of one rank's record in every answer
    serve_bandwidth: float = 1e9    # bytes per second the server writes answers at
    # An elastic reset's survivor starting its engine again (threads, listener, transport): fitted to a measured reset
    # by bench/elastic_reset.py (a first start folds it into ``boot``).
    reinit: float = 0.0

    def spawned_at(self, local_index: int, host: int) -> float:
        """When the ``local_index``-th rank of ``host`` starts (host 0 is the launcher's)."""
        return self.launch + (self.remote if host else 0.0) + (local_index + 1) * self.spawn


class Rendezvous:
    """The launcher's rendezvous server in one simulated job (one thread: requests in arrival order)."""

    def __init__(self, job, model: StartupModel, size: int):
        self.job, self.model, self.size = job, model, size
        self.free = 0.0                     # when the server has served every request so far
        self.waiting: List = []             # ranks whose ask for every record is parked
        self.registered = 0
        self.requests = 0
        self.by_tree = size > DIRECT_RECORDS_MAX_RANKS

    def _latency(self, rank) -> float:
        link = self.job.world.link
        return link.local_latency if rank.world.host_of(rank.rank) == 0 else link.remote_latency

    def register(self, rank, sent: float) -> None:
        """``rank`` registers its record, sent at its ``sent``, and (up to the direct limit, or as rank 0) asks for
        everyone's in a second request, answered (:meth:`SimRank.answered`) once every rank has registered; past the
        limit the other ranks are answered by their tree parent (:meth:`hand_down`)."""
        latency = self._latency(rank)
        asks = not self.by_tree or rank.rank == 0
        self.free = max(self.free, sent + latency) + (1 + asks) * self.model.request
        self.requests += 1 + asks
        self.registered += 1
        if asks:
            self.waiting.append((rank, latency))
        if self.registered == self.size:
            self._answer_all()

    def hand_down(self, rank) -> None:
        """``rank`` holds the records: past the direct limit it sends them to its children in the tree."""
        if not self.by_tree:
            return
        nbytes = self.size * self.model.record
        cpu = rank.world.cpu
        for child in children(rank.rank, self.size):
            rank.charge(cpu.frame + nbytes * cpu.byte)
            for when in rank.world.arrival(rank.rank, child, rank.clock(), nbytes):
                self.job.world.at(when, self.job.ranks[child].answered)

    def post_loss(self, rank, sent: float) -> None:
        """A failing ``rank`` reads the loss board and posts its account before it hangs up (two requests, as
        :class:`horovod.core.bootstrap.RankBoard` makes them); answered in turn."""
        if rank.world.severed(rank.rank, 0):
            rank.answered()             # cut off from the server: its post fails at once (the real one times out)
            return
        latency = self._latency(rank)
        self.free = max(self.free, sent + latency) + 2 * self.model.request
        self.requests += 2
        self.job.world.at(self.free + latency, rank.answered)

    def _answer_all(self) -> None:
        answer = self.size * self.model.record / self.model.serve_bandwidth
        for rank, latency in self.waiting:
            self.free += self.model.request + answer
            self.job.world.at(self.free + latency, rank.answered)
        self.waiting = []
