"""Every control frame the engine sends between ranks, as a named record: the one file that writes and reads them.

A frame travels as a plain tuple ``(kind, field, ...)``, which the control codec (:mod:`horovod.common.wire`)
carries as plain data only. :func:`decode` is the only reader: it checks the kind, the number of fields and every
field's type, and anything else becomes :class:`HorovodInternalError` naming what arrived and from which rank.
Whether a frame makes sense *here* (a bit this rank's cache holds, a rank inside the job, as many contributions as
the set has members) is the receiving protocol's to check, with what only it knows. Decoding is on the path of every
small allreduce, so the checks are plain loops; ``tests/test_frames.py`` keeps them complete.

The frames, by kind (``Frame`` is their union, :data:`FRAMES` the list):

- ``go`` (:class:`Go`, no fields): the cycle starts. Star: rank 0 to a follower whose message is not in; tree: a
  parent to such a child.
- ``want`` (:class:`Want`: ``bits``, WANT_* flags): a cycle is wanted. Star: a follower to rank 0 (always
  ``WANT_NOW``); tree: a child to its parent, at most once per flag and cycle.
- ``msg`` (:class:`Msg`: ``shutdown``, ``hits`` = cache bits of requests the receiver knows, ``requests`` in full,
  ``data`` = small allreduces' inputs by name): star, a member to its set's first rank, early (global set, before
  the cycle) or in the cycle.
- ``reply`` (:class:`Reply`: ``stop``, ``batches`` of responses with a cached one as its bit, ``results`` =
  per batch None or its result, folded by rank 0 from the data the messages carried): star, a set's first rank to
  every member; tree, a parent to its children. It starts the cycle for a rank whose message was already in.
- ``up`` (:class:`Up`: ``groups`` = the ranks that sent one message and that message, ``datas`` = (contributors,
  data), the contributors a :class:`~horovod.core.decision.Contributors` travelling as ``(first, count)``):
  tree, a child to its parent, with its whole subtree's messages for the global set (rank 0 decodes the messages'
  requests in full: :func:`group_messages`).
- ``peer`` (:class:`Peer`: ``clock``, ``messages`` = set id -> a ``msg``'s fields): peer, every rank to every other
  rank, once a cycle.
- ``records`` (:class:`Records`: ``texts``, every rank's start-up record): start-up above 16 ranks, a parent to its
  children (:mod:`horovod.core.bootstrap`).
"""

from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import Request, Response
from horovod.core.decision import Contributors, Message

__all__ = ["WANT_NEW", "WANT_EVERY", "WANT_NOW", "Go", "Want", "Msg", "Reply", "Up", "Peer", "Records", "GO",
           "FRAMES", "Frame", "decode", "receive", "decode_body",
           "group_messages"]

WANT_NEW = 1            # tree: some rank of the subtree has had requests to negotiate for a poll interval
WANT_EVERY = 2          # tree: every rank of the subtree has requests to negotiate (or waits for a result)
WANT_NOW = 4            # some rank needs a cycle at once (another set's requests, a join, shutdown)
_WANT_ALL = WANT_NEW | WANT_EVERY | WANT_NOW

Data = Dict[str, bytes]             # small allreduces' inputs, by tensor name
Group = Tuple[List[int], tuple]     # the ranks that sent one message, and the message as sent (see Up)


_new = tuple.__new__   # builds a record from checked fields without its constructor's extra call (hot path)


class _Malformed(ValueError):
    """A field of a frame has the wrong type (turned into HorovodInternalError by :func:`decode`)."""


def _data(value) -> Data:
    if type(value) is not dict:
        raise _Malformed("tensor data is not a map of names to bytes")
    for name, data in value.items():
        if type(name) is not str or type(data) is not bytes:
            raise _Malformed("tensor data is not a map of names to bytes")
    return value


def _ints(value, what: str) -> Tuple[int, ...]:
    if type(value) is not tuple:
        if type(value) is not list:
            raise _Malformed(f"{what} are not a list")
        value = tuple(value)
    for item in value:
        if type(item) is not int:
            raise _Malformed(f"{what} are not integers")
    return value


def _requests(requests) -> Tuple[Request, ...]:
    if type(requests) is not list and type(requests) is not tuple:
        raise _Malformed("requests are not a list")
    return tuple([Request.from_wire(r) for r in requests]) if requests else ()


class Go(NamedTuple):
    """The cycle starts (star: rank 0 to a follower whose message is not in; tree: a parent to such a child)."""

    KIND = "go"
    ARITY = 0    # fields on the wire, after the kind

    def encode(self) -> tuple:
        """The frame as plain data."""
        return _GO_WIRE

    @staticmethod
    def from_fields(fields: tuple) -> "Go":
        """The record from its fields (after the kind)."""
        return GO


class Want(NamedTuple):
    """A cycle is wanted: ``bits`` of WANT_* (star: a follower to rank 0, always WANT_NOW; tree: child to parent)."""

    bits: int
    KIND = "want"
    ARITY = 1

    def encode(self) -> tuple:
        """The frame as plain data."""
        return ("want", self.bits)

    @staticmethod
    def from_fields(fields: tuple) -> "Want":
        """The record from its fields (after the kind)."""
        bits = fields[0]
        if type(bits) is not int or bits <= 0 or bits & ~_WANT_ALL:
            raise _Malformed(f"want bits {bits!r:.40}")
        return Want(bits)


class Msg(NamedTuple):
    """One rank's message for one process set (star: to the set's first rank): whether it asks the job to shut
    down, the cache bits of requests identical to their last negotiated one, the other requests in full, and its
    small allreduces' data (global set only; empty otherwise)."""

    shutdown: bool
    hits: Tuple[int, ...]
    requests: Tuple[Request, ...]
    data: Data
    KIND = "msg"
    ARITY = 4

    @property
    def message(self) -> Message:
        """What the coordinator takes from it."""
        return Message(self.shutdown, self.hits, self.requests)

    def sent(self) -> tuple:
        """The message as an :class:`Up` frame's group carries it (shutdown, hits, requests as plain data)."""
        return (self.shutdown, self.hits, [r.to_wire() for r in self.requests])

    def body(self) -> tuple:
        """The fields as plain data (also what a :class:`Peer` frame holds per set)."""
        return (self.shutdown, self.hits, [r.to_wire() for r in self.requests], self.data)

    def encode(self) -> tuple:
        """The frame as plain data."""
        return ("msg",) + self.body()

    @staticmethod
    def from_fields(fields: tuple) -> "Msg":
        """The record from its fields (after the kind)."""
        shutdown, hits, requests, data = fields
        if type(shutdown) is not bool:
            raise _Malformed("shutdown is not a bool")
        if type(hits) is tuple:     # as encoders send them: checked in place
            for bit in hits:
                if type(bit) is not int:
                    raise _Malformed("cache hits are not integers")
        else:
            hits = _ints(hits, "cache hits")
        return _new(Msg, (shutdown, hits, _requests(requests) if requests or type(requests) not in (list, tuple)
                          else (), _data(data)))


_msg_from_fields = Msg.from_fields


def decode_body(body) -> Msg:
    """A message's body (as :meth:`Msg.body` writes it) as a record.

    Raises:
        HorovodInternalError: the body is malformed.
    """
    try:
        if type(body) is not tuple or len(body) != Msg.ARITY:
            raise _Malformed("a message body is not 4 fields")
        return Msg.from_fields(body)
    except (ValueError, TypeError) as exc:
        raise HorovodInternalError(f"malformed negotiation message {body!r:.200}: {exc}") from None


Item = Union[int, Response]     # a response in a reply, or its bit in the receiver's response cache


class Reply(NamedTuple):
    """A set's decisions: whether the job stops, the batches in order (a cached response as its bit) and, per batch,
    None or its result as rank 0 folded it when its data came with the messages (``results`` None: no batch's did)."""

    stop: bool
    batches: List[List[Item]]
    results: Optional[List[Optional[bytes]]] = None
    KIND = "reply"
    ARITY = 3

    def encode(self) -> tuple:
        """The frame as plain data."""
        batches = [[r if type(r) is int else r.to_wire() for r in batch] for batch in self.batches]
        return ("reply", self.stop, batches, self.results)

    @staticmethod
    def from_fields(fields: tuple) -> "Reply":
        """The record from its fields (after the kind)."""
        stop, batches, results = fields
        if type(stop) is not bool or type(batches) is not list:
            raise _Malformed("stop is not a bool or batches are not a list")
        decoded = []
        for batch in batches:
            if type(batch) is not list:
                raise _Malformed("a batch is not a list")
            decoded.append([r if type(r) is int else Response.from_wire(r) for r in batch])
        if results is not None:
            if type(results) is not list or len(results) != len(batches):
                raise _Malformed("results do not match the batches")
            for result in results:
                if result is not None and type(result) is not bytes:
                    raise _Malformed("a batch's result is not bytes")
        return _new(Reply, (stop, decoded, results))


class Up(NamedTuple):
    """A subtree's messages for the global set (tree: a child to its parent): ``groups`` lists together the ranks
    that sent the very same message; ``datas`` holds (:class:`~horovod.core.decision.Contributors`, small
    allreduces' data): ``Contributors(rank)`` for a rank that sent some, ``Contributors(relay, ranks)`` for what a
    relay folded of its subtree's (on the wire, the plain tuple ``(first, count)``).

    A group's message stays as sent (:meth:`Msg.sent`, its shape checked) until rank 0 decodes it in full with
    :func:`group_messages`: the ranks in between only compare messages, and decoding a step's 200 uncached requests
    at every level of the tree would cost about half a millisecond a level.
    """

    groups: List[Group]
    datas: List[Tuple[Contributors, Data]]
    KIND = "up"
    ARITY = 2

    def encode(self) -> tuple:
        """The frame as plain data."""
        return ("up", self.groups, [((key[0], key[1]), data) for key, data in self.datas])

    @staticmethod
    def from_fields(fields: tuple) -> "Up":
        """The record from its fields (after the kind)."""
        groups, datas = fields
        if type(groups) is not list or type(datas) is not list:
            raise _Malformed("groups or data are not lists")
        checked: List[Group] = []
        for group in groups:
            if type(group) not in (list, tuple) or len(group) != 2:
                raise _Malformed("a group is not (ranks, message)")
            ranks, sent = group
            if type(sent) is not tuple or len(sent) != 3 or type(sent[0]) is not bool or (
                    type(sent[2]) is not list and type(sent[2]) is not tuple):
                raise _Malformed("a group's message is not (shutdown, hits, requests)")
            _ints(sent[1], "cache hits")
            checked.append((list(_ints(ranks, "a group's ranks")), sent))
        held = []
        for item in datas:
            if type(item) not in (list, tuple) or len(item) != 2:
                raise _Malformed("tensor data is not (contributors, data)")
            key = _ints(item[0], "tensor data's contributors")
            if len(key) != 2 or key[0] < 0 or key[1] < 1:
                raise _Malformed(f"tensor data's contributors {key!r:.40} are not (first rank >= 0, count >= 1)")
            held.append((Contributors(*key), _data(item[1])))
        return _new(Up, (checked, held))


def group_messages(groups: List[Group]) -> List[Tuple[List[int], Message]]:
    """The messages of :class:`Up` groups, decoded in full (each request checked), with their ranks.

    Raises:
        HorovodInternalError: a message is malformed (it names the ranks that sent it).
    """
    decoded = []
    for ranks, sent in groups:
        try:
            decoded.append((ranks, Message(sent[0], _ints(sent[1], "cache hits"), _requests(sent[2]))))
        except (ValueError, TypeError) as exc:
            raise HorovodInternalError(f"malformed negotiation message from ranks {ranks[:8]}: {exc}: "
                                       f"{sent!r:.200}") from None
    return decoded


class Peer(NamedTuple):
    """One rank's messages for one cycle, by set id, with the sender's clock (peer: every rank to every other)."""

    clock: float
    messages: Dict[int, Msg]
    KIND = "peer"
    ARITY = 2

    def encode(self) -> tuple:
        """The frame as plain data."""
        return ("peer", self.clock, {set_id: msg.body() for set_id, msg in self.messages.items()})

    @staticmethod
    def from_fields(fields: tuple) -> "Peer":
        """The record from its fields (after the kind)."""
        clock, messages = fields
        if type(clock) is not float or type(messages) is not dict:
            raise _Malformed("the clock is not a float or the messages are not by set id")
        decoded = {}
        for set_id, body in messages.items():
            if type(set_id) is not int or type(body) is not tuple or len(body) != Msg.ARITY:
                raise _Malformed(f"the message for set {set_id!r:.20} is not 4 fields")
            decoded[set_id] = _msg_from_fields(body)
        return _new(Peer, (clock, decoded))


class Records(NamedTuple):
    """Every rank's start-up record, handed down the tree at start-up (a parent to its children; above
    ``DIRECT_RECORDS_MAX_RANKS`` ranks, :mod:`horovod.core.bootstrap`)."""

    texts: List[str]
    KIND = "records"
    ARITY = 1

    def encode(self) -> tuple:
        """The frame as plain data."""
        return ("records", self.texts)

    @staticmethod
    def from_fields(fields: tuple) -> "Records":
        """The record from its fields (after the kind)."""
        texts = fields[0]
        if type(texts) is not list or any(type(t) is not str for t in texts):
            raise _Malformed("records are not texts")
        return Records(texts)


Frame = Union[Go, Want, Msg, Reply, Up, Peer, Records]
FRAMES: Tuple[type, ...] = (Go, Want, Msg, Reply, Up, Peer, Records)
GO = Go()
_GO_WIRE = ("go",)
# kind -> (record type, number of fields after the kind, the decoder of those fields)
_BY_KIND: Dict[str, Tuple[type, int, Callable[[tuple], Frame]]] = {
    cls.KIND: (cls, cls.ARITY, cls.from_fields) for cls in FRAMES}


def decode(raw, sender: int, *allowed: type, receiver: Optional[int] = None) -> Frame:
    """The record a control frame from rank ``sender`` holds, checked; with ``allowed``, only those kinds.

    Raises:
        HorovodInternalError: the frame is not a tuple of a known kind, has the wrong number of fields or a field
            of the wrong type, or is of a kind not allowed here. The message names the kind and the sender.
    """
    entry = _BY_KIND.get(raw[0]) if type(raw) is tuple and raw and type(raw[0]) is str else None
    if entry is None or (allowed and entry[0] not in allowed) or len(raw) != entry[1] + 1:
        raise HorovodInternalError(_refusal(raw, sender, allowed, receiver))
    try:
        return entry[2](raw[1:])
    except (ValueError, TypeError) as exc:
        raise HorovodInternalError(f"malformed {raw[0]!r} frame from rank {sender}: {exc}: {raw!r:.200}") from None


def _refusal(raw, sender: int, allowed: Sequence[type], receiver: Optional[int]) -> str:
    """Why :func:`decode` refuses ``raw`` before looking at its fields."""
    kind = raw[0] if type(raw) is tuple and raw else None
    entry = _BY_KIND.get(kind) if type(kind) is str else None
    who = f"rank {receiver}" if receiver is not None else "this rank"
    if entry is None:
        return f"{who} got a control frame of unknown kind {kind!r:.40} from rank {sender}: {raw!r:.100}"
    if allowed and entry[0] not in allowed:
        expected = " or ".join(repr(t.KIND) for t in allowed)
        return (f"{who} expected a {expected} frame from rank {sender}, got a {kind!r} frame {raw!r:.100} (is "
                f"HOROVOD_NEGOTIATION the same on every rank?)")
    return f"malformed {kind!r} frame from rank {sender}: {len(raw) - 1} fields, not {entry[1]}: {raw!r:.100}"


def receive(transport, peer: int, *allowed: type) -> Frame:
    """The next control frame from ``peer`` over ``transport``, decoded (see :func:`decode`).

    Raises:
        HorovodInternalError: the connection failed, or the frame is malformed or of a kind not allowed here.
    """
    return decode(transport.recv_obj(peer), peer, *allowed, receiver=transport.rank)
