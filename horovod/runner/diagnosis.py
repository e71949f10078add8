"""Which rank's failure came first: the root cause of a failed job, from how the workers exited and what the failing
ones reported (:mod:`horovod.common.failure_records`).

The order in which the launcher sees processes exit is not the order in which they failed: the rank that raised
may still be shutting down when a survivor, whose collective ended with ``HorovodInternalError`` because of it, has
already exited. :func:`diagnose` decides, by these rules, in order:

1. a rank that raised anything but ``HorovodInternalError``, or whose own engine thread failed (the earliest such
   report), is the root cause; when several ranks raised the same error (every rank of a deadlock), all of them
   are, named together and represented by the one the launcher saw exit first;
2. else a rank that failed without reporting (killed by a signal, ``sys.exit(1)``) and that the launcher saw fail
   first is the root cause;
3. else, when a rank exited normally, the job failed because that rank finished while the others still waited
   (for the collective the first consequence names);
4. else, when the consequences say a peer was lost (its host cut off or down, its process killed) and that peer
   reported nothing itself, that peer is the root cause: the survivors that saw it go exit first, but they are not
   the cause (the first of them to report it is quoted);
4a. else, when the consequences say a live peer made no progress for the busy-peer bound (a long call holding its
   GIL, a stopped process), that peer is the root cause: stuck, not lost;
5. else, when the consequences say that ranks never registered at start-up (they did not reach ``hvd.init()``, or
   their hosts could not reach the launcher) and those ranks reported nothing, they are the root cause, named with
   their hosts;
6. else the first failure the launcher saw; a rank that failed without a record (before ``hvd.init()``: a missing
   module, a typo) is quoted from the traceback it printed to stderr.

It is a pure function; :func:`summary` turns its verdict into what ``horovodrun`` prints.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, Iterable, List, Optional, Tuple

from horovod.common.failure_records import FailureRecord
from horovod.runner.supervisor import JobResult, WorkerExit, failure_message

__all__ = ["Diagnosis", "diagnose", "summary", "launcher_note", "read_records"]


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """The verdict: ``rank`` caused the failure (``kind``: ``raised``, ``died``, ``finished``, ``lost``, ``stuck``,
    ``unregistered`` or ``failed``); for ``lost`` and ``stuck``, ``record`` is the first survivor's report of it."""

    rank: int
    kind: str
    exit: Optional[WorkerExit]
    record: Optional[FailureRecord] = None
    waiter: Optional[FailureRecord] = None  # for ``finished``: the first rank left waiting
    absent: Tuple[Tuple[int, str], ...] = ()  # for ``unregistered``: every such rank with its host
    said: str = ""                          # for ``died`` and ``failed`` without a record: the traceback it printed
    alike: Tuple[int, ...] = ()             # for ``raised``: every rank that raised the same error (a deadlock)

    def headline(self) -> str:
        """One line saying what happened."""
        host = f" on {self.exit.hostname}" if self.exit else ""
        if self.kind == "raised" and len(self.alike) > 1:
            return f"ranks {_ranks(self.alike)} all raised {_first_line(self.record.headline())}"
        if self.kind == "raised":
            return f"rank {self.rank}{host} raised {_first_line(self.record.headline())}"
        if self.kind == "finished":
            waited = f" for {self.waiter.waiting_for}" if self.waiter and self.waiter.waiting_for else ""
            waiter = f" while rank {self.waiter.rank} waited{waited}" if self.waiter else " while others waited"
            how = "exited with code 0" if self.exit is None or self.exit.returncode == 0 else "shut down normally"
            return f"rank {self.rank}{host} finished ({how}){waiter}"
        if self.kind == "lost":
            _, named_host, why = self.record.lost_peer()
            host = f" on {self.exit.hostname}" if self.exit else f" on {named_host}" if named_host else ""
            said = f": {why}" if why else ""
            return f"rank {self.rank}{host} was lost, as rank {self.record.rank} reported first{said}"
        if self.kind == "stuck":
            _, named_host, what = self.record.stuck_peer()
            host = f" on {self.exit.hostname}" if self.exit else f" on {named_host}" if named_host else ""
            return f"rank {self.rank}{host} was alive but stuck, as rank {self.record.rank} reported first: it {what}"
        if self.kind == "unregistered":
            hosts = sorted({h for _, h in self.absent if h})
            ranks = ", ".join(str(r) for r, _ in self.absent)
            where = f" on host{'s' if len(hosts) > 1 else ''} {', '.join(hosts)}" if hosts else ""
            return (f"rank{'s' if len(self.absent) > 1 else ''} {ranks}{where} did not register within the start "
                    f"timeout: they did not reach hvd.init(), or could not reach the launcher (as rank "
                    f"{self.record.rank} reported)")
        how = self.exit.describe() if self.exit else "an unknown status"
        what = f": {_first_line(self.record.headline())}" if self.record else f": {_last_line(self.said)}" if self.said else ""
        return f"rank {self.rank}{host} ended with {how}{what}"


def read_records(store, scope: str) -> List[FailureRecord]:
    """The records in ``store`` (a :class:`~horovod.common.rendezvous_server.KVStore`); bad ones skipped."""
    records = []
    for key in store.keys(scope):
        try:
            records.append(FailureRecord.decode(store.get(scope, key)))
        except (ValueError, TypeError):
            continue
    return records


def _failures(records: Iterable[FailureRecord]) -> Dict[int, FailureRecord]:
    return {r.rank: r for r in records if not r.finished}


def diagnose(result: JobResult, records: Iterable[FailureRecord]) -> Optional[Diagnosis]:
    """The root cause of ``result``'s failure (None when the job did not fail); see the module docstring."""
    records = list(records)
    failures = _failures(records)
    exits = {e.rank: e for e in result.exits}
    raised = sorted((r for r in failures.values() if not r.consequence), key=lambda r: r.time)
    first = result.first_failure
    if raised:
        return _raised(raised, exits, first)
    if first is None:
        return None
    if first.rank not in failures:
        return Diagnosis(first.rank, "died", first, said=_traceback_in(result.tails.get(first.rank, "")))
    # Every failure is a consequence: a rank that shut down normally (or exited 0) left the others waiting. Which
    # process the launcher saw exit first is a matter of milliseconds, and the finished one may even have been
    # stopped by the launcher after the first failure: its own record says it finished.
    waiter = min(failures.values(), key=lambda r: r.time)
    done = sorted((r for r in records if r.finished and r.rank not in failures), key=lambda r: r.time)
    finished = [exits[r.rank] for r in done if r.rank in exits] or \
        sorted((e for e in result.exits if e.returncode == 0), key=lambda e: e.ended_at)
    if finished:
        return Diagnosis(finished[0].rank, "finished", finished[0], waiter=waiter)
    for record in sorted(failures.values(), key=lambda r: r.time):
        lost = record.lost_peer()
        if lost is not None and lost[0] not in failures:   # (a rank that reported is not lost)
            return Diagnosis(lost[0], "lost", exits.get(lost[0]), record)
    for record in sorted(failures.values(), key=lambda r: r.time):
        stuck = record.stuck_peer()
        if stuck is not None and stuck[0] not in failures:
            return Diagnosis(stuck[0], "stuck", exits.get(stuck[0]), record)
    for record in sorted(failures.values(), key=lambda r: r.time):
        absent = [rank for rank in _unregistered(record) if rank not in failures]
        if absent:
            hosts = tuple((rank, exits[rank].hostname if rank in exits else "") for rank in absent)
            return Diagnosis(absent[0], "unregistered", exits.get(absent[0]), record, absent=hosts)
    record = failures.get(first.rank)
    return Diagnosis(first.rank, "failed", first, record,
                     said="" if record is not None else _traceback_in(result.tails.get(first.rank, "")))


def _raised(raised: List[FailureRecord], exits: Dict[int, WorkerExit], first: Optional[WorkerExit]) -> Diagnosis:
    """The earliest rank that raised; when several raised the same error (every rank of a deadlock, a mismatch),
    all of them, represented by the one the launcher saw exit first so that Horovod's block names the same rank."""
    alike = [r for r in raised if (r.exc_type, _first_line(r.message)) ==
             (raised[0].exc_type, _first_line(raised[0].message))]
    pick = next((r for r in alike if first is not None and r.rank == first.rank), raised[0])
    ranks = tuple(sorted(r.rank for r in alike)) if len(alike) > 1 else ()
    return Diagnosis(pick.rank, "raised", exits.get(pick.rank), pick, alike=ranks)


def _ranks(ranks: Iterable[int]) -> str:
    """``0, 1 and 2``."""
    words = [str(r) for r in ranks]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _first_line(text: str) -> str:
    """A report's first line: a deadlock's error goes on with the line naming its stacks' file."""
    return text.split("\n", 1)[0].rstrip()


def _traceback_in(tail: str) -> str:
    """The last Python traceback in a rank's stderr, else its last few lines (a syntax error, or a script that
    does not exist, prints no traceback); "" when it wrote nothing."""
    start = tail.rfind("Traceback (most recent call last):")
    if start >= 0:
        return tail[start:].rstrip()
    return "\n".join([line for line in tail.splitlines() if line.strip()][-_QUOTED_LINES:])


_QUOTED_LINES = 8


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


_UNREGISTERED = re.compile(r"ranks? ([\d, ]+?)(?: and \d+ more)? of \d+ did not register")


def _unregistered(record: FailureRecord) -> List[int]:
    """The ranks a start-up timeout says never registered."""
    found = _UNREGISTERED.search(record.headline())
    return [int(word) for word in found.group(1).replace(",", " ").split()] if found else []


def _root_cause_lines(result: JobResult, verdict: Diagnosis) -> List[str]:
    """The ``Root cause:`` line. When the launcher's store ran out of descriptors and no rank raised an error of its
    own, that is the root cause (the ranks' start-up or rendezvous failures follow from it); else it is a note."""
    trouble = result.launcher_trouble.rstrip(".")
    if trouble and verdict.kind != "raised":
        return [f"Root cause: {trouble}.", f"  what the ranks saw, as a consequence: {verdict.headline()}."]
    return [f"Root cause: {verdict.headline()}."] + ([f"  the launcher also ran short: {trouble}."] if trouble else [])


def launcher_note(result: JobResult) -> str:
    """The line ``horovod.run`` adds to the error it raises when the launcher ran out of descriptors ("" if not)."""
    return f"The launcher could not serve: {result.launcher_trouble.rstrip('.')}." if result.launcher_trouble else ""


def summary(result: JobResult, records: Iterable[FailureRecord]) -> str:
    """What ``horovodrun`` prints after a failed job: the root cause's traceback first, then Horovod's summary naming
    that rank, then one line per other rank that failed (each once, its first line only: a deadlock's stacks are in
    the file its error names)."""
    records = list(records)
    verdict = diagnose(result, records)
    if verdict is None:
        return ""
    lines = []
    if verdict.record is not None and verdict.record.traceback and verdict.kind not in ("lost", "stuck",
                                                                                       "unregistered"):
        alike = f" (ranks {_ranks(verdict.alike)} raised alike)" if verdict.alike else ""
        lines.append(f"Root cause, rank {verdict.rank}{alike}:\n{verdict.record.traceback.rstrip()}\n")
    elif verdict.said:
        lines.append(f"Root cause, rank {verdict.rank}:\n{verdict.said}\n")
    # Horovod's block names the root cause's process (and says so when it is not the first that exited non-zero),
    # so that no two lines disagree about which rank failed first; a rank whose end the launcher never saw has none.
    exit_ = verdict.exit or {e.rank: e for e in result.exits}.get(verdict.rank)
    if exit_ is not None:
        lines.append(failure_message(exit_, first=exit_ == result.first_failure).rstrip("\n"))
    lines.extend(_root_cause_lines(result, verdict))
    others = [r for r in sorted(_failures(records).values(), key=lambda r: r.time)
              if r.rank != verdict.rank and r.rank not in verdict.alike]
    for record in others:
        why = "as a consequence" if record.consequence else "too"
        waited = f" (waiting for {record.waiting_for})" if record.waiting_for else ""
        lines.append(f"  rank {record.rank} failed {why}{waited}: {_first_line(record.headline())}")
    return "\n".join(lines) + "\n"
