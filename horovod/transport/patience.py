"""How a rank waits on a live peer that owes it bytes inside a collective.

A peer whose connection is alive at the kernel level (a dead process's kernel closes it at once; a host that is down
or cut off fails the keepalive probes within ``HOROVOD_LIVENESS_TIMEOUT``) but which sends nothing is busy, not lost:
a long call that holds Python's GIL, a debugger stop or ``SIGSTOP`` keep its engine thread from running, and it
carries on afterwards. So the job waits: every ``HOROVOD_GLOO_TIMEOUT_SECONDS`` one warning for the whole job names
the rank, its host and the collective, and only past ``HOROVOD_BUSY_PEER_TIMEOUT_SECONDS`` does the job fail.

In a ring most ranks wait on a neighbour that itself waits, so each rank's own view names an innocent rank. Waiting
ranks therefore post whom they wait on in the job's rendezvous store (the waits board), and every one follows the
chain to the rank that posted nothing: the busy one. Only the lowest waiting rank speaks, and only a look after
it posted, so that the others' posts are there to read. Without a board (no rendezvous), a rank names the peer it
waits on.
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, Optional, Tuple, Union

__all__ = ["Patience", "culprit"]

log = logging.getLogger("horovod")


def culprit(rank: int, peer: int, posts: Dict[int, int]) -> Tuple[int, bool]:
    """The rank at the end of the chain of waits that starts at ``rank`` waiting on ``peer``, and whether ``rank``
    is the one to report it (the lowest waiting rank: rank 0 whenever it waits, so that a post seen late makes a
    second speaker only when rank 0 is not waiting).

    Args:
        posts: rank -> the rank it waits on, for every rank that posted a wait (``rank`` included or not).
    """
    posts = dict(posts)
    posts[rank] = peer
    seen = {rank}
    end = peer
    while end in posts and end not in seen:
        seen.add(end)
        end = posts[end]
    if end in seen:
        end = peer          # every rank of the chain waits on the next: no one to blame beyond our own peer
    return end, min(r for r in posts if r != end) == rank


class Patience:
    """One rank's waits on live peers, one episode at a time (an episode ends when bytes move again).

    Args:
        rank: this rank.
        interval: seconds between warnings (``HOROVOD_GLOO_TIMEOUT_SECONDS``; 0: never warn, never fail).
        bound: seconds of silence from a live peer after which the job fails (0: wait forever).
        where: describes a rank ("rank 3 on host h2").
    """

    def __init__(self, rank: int, interval: float, bound: float, where: Callable[[int], str]):
        self.rank = rank
        self.interval = interval
        self.bound = bound
        self.where = where
        self.board = None        # the job's waits board (read() -> {rank: text}, post(rank, text)), set at init
        self._activity: Union[str, Callable[[], str]] = ""
        self._posted = False
        self._warned = 0

    def working_on(self, activity: Union[str, Callable[[], str]]) -> None:
        """What this rank runs now, as the engine names it: a text, or a function that makes it (called only when
        a wait is reported, so that the engine pays nothing per collective for it)."""
        self._activity = activity

    def waiting(self, peer: int, silent_for: float) -> Optional[str]:
        """``peer`` has sent nothing for ``silent_for`` seconds though its connection is alive.

        Returns:
            The failure's account once the bound is reached (the caller fails the transport with it), else None.
        """
        first = not self._posted
        posts = self._exchange(peer)
        if self.bound > 0 and silent_for >= self.bound:
            busy, _ = culprit(self.rank, peer, posts)
            return self._account(busy, peer, f"made no progress in {self._what()} for {silent_for:.0f} s "
                                             f"(HOROVOD_BUSY_PEER_TIMEOUT_SECONDS), though its connection is alive: "
                                             f"it is stuck, or busy in a long call that holds Python's GIL")
        due = int(silent_for // self.interval) if self.interval > 0 else 0
        if due > self._warned and not first:    # the other waiters have had a look's time to post theirs
            self._warned = due
            busy, speaker = culprit(self.rank, peer, posts)
            if speaker:
                limit = f"up to {self.bound:g} s" if self.bound > 0 else "without limit"
                log.warning("%s", self._account(busy, peer, f"has made no progress in {self._what()} for "
                                                            f"{silent_for:.0f} s though its connection is alive: "
                                                            f"busy in a long call that holds Python's GIL, or "
                                                            f"stopped; the job waits {limit} "
                                                            f"(HOROVOD_BUSY_PEER_TIMEOUT_SECONDS)"))
        return None

    def resumed(self) -> None:
        """Bytes moved again: the episode ends, and this rank's post is taken back."""
        self._warned = 0
        if self._posted:
            self._posted = False
            self._post("")

    def activity(self) -> str:
        """What this rank runs now ("" when the engine has not said)."""
        activity = self._activity
        try:
            return activity() if callable(activity) else activity
        except Exception:  # a description that fails must not turn a warning into an error
            return ""

    def _what(self) -> str:
        return self.activity() or "a collective"

    def _account(self, busy: int, peer: int, said: str) -> str:
        through = f" (rank {self.rank} waits on it through rank {peer})" if busy != peer else ""
        return f"{self.where(busy)}{through} {said}"

    def _exchange(self, peer: int) -> Dict[int, int]:
        """Post whom this rank waits on (once per episode) and read every rank's post."""
        if not self._posted:
            self._posted = True
            self._post(str(peer))
        board = self.board
        if board is None:
            return {}
        try:
            posted = board.read()
        except Exception as error:  # the board is a courtesy: without it a rank names its own peer
            log.debug("rank %d: the waits board failed: %s", self.rank, error)
            return {}
        return {rank: int(text) for rank, text in posted.items() if text.strip().isdigit()}

    def _post(self, text: str) -> None:
        board = self.board
        if board is None:
            return
        try:
            board.post(self.rank, text)
        except Exception as error:
            log.debug("rank %d: the waits board failed: %s", self.rank, error)
