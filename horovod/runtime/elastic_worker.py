"""The worker's side of an elastic job: ask the driver for this worker's place in the next round.

``hvd.init()`` in a worker started by the elastic driver (``HOROVOD_ELASTIC=1``) calls :func:`resolve_elastic`
through :func:`horovod.runtime.topology.resolve`. The worker says it is ready (naming the last round it took part
in) and waits for the driver's answer. The driver answers once every live worker is waiting, so each round starts
from a barrier: no worker of the new round meets a peer still training in the old one.

The round number comes from the driver, not from a process-local counter: a worker started in round 5 and one
that has been there since round 1 must build their mesh in the same scope.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from typing import Optional

from horovod.common.exceptions import RendezvousError
from horovod.common.rendezvous_client import RendezvousClient, secret_from_hex
from horovod.common.types import Topology
from horovod.common import elastic_records as protocol

@dataclasses.dataclass
class _Rounds:
    """This worker's place in the elastic job's sequence of rounds."""

    round: int = 0                              # the last round this process took part in
    version: int = 0                            # the host update that round accounts for
    client: Optional[RendezvousClient] = None   # to the driver's store, made at the first round
    broken_looked: float = float("-inf")        # when round_broken last asked the driver


# Outlives shutdown() on purpose: an elastic reset is shutdown() then init(), and the worker tells the driver the
# last round it took part in (the new one must be newer), so the rounds belong to the process, not to one init.
_rounds = _Rounds()
_lock = threading.Lock()


def current_round() -> int:
    """The round this worker is (or last was) in; 0 before its first."""
    return _rounds.round


def current_version() -> int:
    """The last host update the current round accounts for."""
    return _rounds.version


def _make_client(config) -> RendezvousClient:
    if not config.gloo_rendezvous_addr or config.gloo_rendezvous_port <= 0 or not config.secret_key:
        raise RendezvousError("HOROVOD_ELASTIC=1 but no rendezvous server or secret is set; start elastic "
                                   "jobs with horovodrun --min-np/--host-discovery-script or horovod.run(min_np=)")
    return RendezvousClient(config.gloo_rendezvous_addr, config.gloo_rendezvous_port,
                            secret_from_hex(config.secret_key), timeout=config.start_timeout)


def resolve_elastic(config):
    """This worker's :class:`~horovod.runtime.topology.Topology` in the driver's next round.

    Raises:
        SystemExit: (status 0) the driver removed this worker's host, or the job has ended.
        RendezvousError: the driver did not answer within the elastic and start timeouts, or is gone.
    """
    key = protocol.slot_key(config.hostname, config.local_rank)
    with _lock:
        client = _rounds.client = _rounds.client or _make_client(config)
        try:
            client.delete(protocol.ASSIGN_SCOPE, key)
            client.put(protocol.READY_SCOPE, key, str(_rounds.round).encode())
            answer = protocol.decode_answer(client.get(protocol.ASSIGN_SCOPE, key,
                                                       timeout=config.elastic_timeout + config.start_timeout))
        except RendezvousError as exc:
            # Not a HorovodInternalError: the driver is gone or silent, so retrying cannot help.
            raise RendezvousError(f"elastic worker {key}: no assignment from the driver: {exc}") from None
        if answer in (protocol.REMOVED, protocol.ENDED):
            why = "its host was removed from the job" if answer == protocol.REMOVED else "the job has ended"
            print(f"horovod: elastic worker {key} stops: {why}", file=sys.stderr, flush=True)
            raise SystemExit(0)
        _rounds.round, _rounds.version = answer.round, answer.version
    return Topology(answer.rank, answer.size, answer.local_rank, answer.local_size, answer.cross_rank,
                    answer.cross_size, config.hostname, config.gloo_rendezvous_addr, config.gloo_rendezvous_port,
                    client.secret, f"{config.rendezvous_scope}.elastic", generation=answer.round)


def round_broken(round_number: int) -> bool:
    """Whether the driver saw a worker of round ``round_number`` fail (its mesh will never form); one bounded
    request, at most every half second."""
    now = time.monotonic()
    client = _rounds.client
    if client is None or now - _rounds.broken_looked < 0.5:
        return False
    _rounds.broken_looked = now
    try:
        data = client.try_get(protocol.NOTIFY_SCOPE, protocol.BROKEN_ROUND_KEY)
    except (RendezvousError, ValueError):
        return False
    try:
        return data is not None and int(data) >= round_number
    except ValueError:
        return False


def poll_host_update() -> Optional[tuple]:
    """``(version, flags)`` of a host update newer than the current round, or None; one bounded request."""
    client = _rounds.client
    if client is None:
        return None
    try:
        data = client.try_get(protocol.NOTIFY_SCOPE, protocol.HOSTS_UPDATED_KEY)
    except (RendezvousError, ValueError):
        return None
    if data is None:
        return None
    version, flags = protocol.decode_update(data)
    return (version, flags) if version > _rounds.version else None


__all__ = ["resolve_elastic", "poll_host_update", "round_broken", "current_round", "current_version"]
