"""The messages of the Spark driver–agent link, as typed records: the one module that writes and reads them.

The driver (:class:`horovod.runner.backends.spark.AgentServer`) and each agent (:mod:`horovod.spark.task`) speak over
an authenticated connection (:func:`horovod.common.wire.handshake`). A message travels as a plain tuple
``(kind, field, ...)`` through the control codec (:func:`horovod.common.wire.encode`, plain data only), written by a
record's :meth:`to_wire`; :func:`decode` is the only reader: it checks the kind (and that it is one the receiver
expects), the number of fields and each field's type and range, and refuses anything else with a ValueError naming
the kind and the field. Neither end reads a message by index.

Agent to driver (:data:`FROM_AGENT`): ``hello`` (:class:`Hello`: where the agent runs, once, first), ``started``
(:class:`Started`: the worker's pid), ``error`` (:class:`StartError`: the worker could not start), ``out``
(:class:`Out`: a piece of the worker's output), ``exit`` (:class:`Exit`: the worker's exit status).
Driver to agent (:data:`FROM_DRIVER`): ``launch`` (:class:`Launch`: the command and its environment), ``signal``
(:class:`Signal`: a signal for the worker's process group), ``done`` (:class:`Done`: the agent's work is over).
"""

from __future__ import annotations

import signal
from typing import Callable, Dict, NamedTuple, Tuple, Union

__all__ = ["STREAMS", "Hello", "Started", "StartError", "Out", "Exit", "Launch", "Signal", "Done", "DONE", "Message",
           "FROM_AGENT", "FROM_DRIVER", "decode"]

STREAMS = ("stdout", "stderr")     # the worker's output streams an Out message names


class Hello(NamedTuple):
    """An agent says where it runs: its Spark partition and attempt, host identity, process id and Python."""

    index: int
    attempt: int
    host: str
    pid: int
    python: str
    KIND = "hello"

    def to_wire(self) -> tuple:
        """The message as plain data."""
        return (self.KIND,) + tuple(self)

    @classmethod
    def from_wire(cls, data) -> "Hello":
        """The record from :meth:`to_wire`'s tuple, every field checked (ValueError naming a wrong one)."""
        return _checked(cls, data)


class Started(NamedTuple):
    """The agent started the worker: its process id."""

    pid: int
    KIND = "started"

    def to_wire(self) -> tuple:
        """The message as plain data."""
        return (self.KIND,) + tuple(self)

    @classmethod
    def from_wire(cls, data) -> "Started":
        """The record from :meth:`to_wire`'s tuple, every field checked (ValueError naming a wrong one)."""
        return _checked(cls, data)


class StartError(NamedTuple):
    """The agent could not start the worker: why."""

    text: str
    KIND = "error"

    def to_wire(self) -> tuple:
        """The message as plain data."""
        return (self.KIND,) + tuple(self)

    @classmethod
    def from_wire(cls, data) -> "StartError":
        """The record from :meth:`to_wire`'s tuple, every field checked (ValueError naming a wrong one)."""
        return _checked(cls, data)


class Out(NamedTuple):
    """A piece of the worker's output on ``stream`` (``stdout`` or ``stderr``)."""

    stream: str
    data: bytes
    KIND = "out"

    def to_wire(self) -> tuple:
        """The message as plain data."""
        return (self.KIND,) + tuple(self)

    @classmethod
    def from_wire(cls, data) -> "Out":
        """The record from :meth:`to_wire`'s tuple, every field checked (ValueError naming a wrong one)."""
        return _checked(cls, data)


class Exit(NamedTuple):
    """The worker ended with ``code`` (negative: killed by that signal)."""

    code: int
    KIND = "exit"

    def to_wire(self) -> tuple:
        """The message as plain data."""
        return (self.KIND,) + tuple(self)

    @classmethod
    def from_wire(cls, data) -> "Exit":
        """The record from :meth:`to_wire`'s tuple, every field checked (ValueError naming a wrong one)."""
        return _checked(cls, data)


class Launch(NamedTuple):
    """The driver hands the agent its worker: the command and the planned environment (over the agent's own)."""

    argv: Tuple[str, ...]
    env: Dict[str, str]
    KIND = "launch"

    def to_wire(self) -> tuple:
        """The message as plain data."""
        return (self.KIND, tuple(self.argv), dict(self.env))

    @classmethod
    def from_wire(cls, data) -> "Launch":
        """The record from :meth:`to_wire`'s tuple, every field checked (ValueError naming a wrong one)."""
        return _checked(cls, data)


class Signal(NamedTuple):
    """The driver forwards signal ``sig`` to the worker's process group."""

    sig: int
    KIND = "signal"

    def to_wire(self) -> tuple:
        """The message as plain data."""
        return (self.KIND,) + tuple(self)

    @classmethod
    def from_wire(cls, data) -> "Signal":
        """The record from :meth:`to_wire`'s tuple, every field checked (ValueError naming a wrong one)."""
        return _checked(cls, data)


class Done(NamedTuple):
    """The agent's work is over: it stops what is left of its worker and ends its Spark task."""

    KIND = "done"

    def to_wire(self) -> tuple:
        """The message as plain data."""
        return (self.KIND,)

    @classmethod
    def from_wire(cls, data) -> "Done":
        """The record from :meth:`to_wire`'s tuple (ValueError when it is not one)."""
        return _checked(cls, data)


DONE = Done()
Message = Union[Hello, Started, StartError, Out, Exit, Launch, Signal, Done]
FROM_AGENT: Tuple[type, ...] = (Hello, Started, StartError, Out, Exit)
FROM_DRIVER: Tuple[type, ...] = (Launch, Signal, Done)


def _int_at_least(low: int) -> Callable[[object], bool]:
    return lambda value: type(value) is int and value >= low


def _text(value) -> bool:
    return type(value) is str and value != ""


def _argv(value) -> bool:
    return type(value) is tuple and len(value) > 0 and all(type(a) is str for a in value)


def _env(value) -> bool:
    return type(value) is dict and all(type(k) is str and type(v) is str for k, v in value.items())


# Per kind, each field's check and what its value must be, in the record's field order.
_CHECKS: Dict[str, Tuple[Tuple[Callable[[object], bool], str], ...]] = {
    "hello": ((_int_at_least(0), "an int >= 0"), (_int_at_least(0), "an int >= 0"), (_text, "a non-empty str"),
              (_int_at_least(1), "an int >= 1"), (_text, "a non-empty str")),
    "started": ((_int_at_least(1), "an int >= 1"),),
    "error": ((lambda v: type(v) is str, "a str"),),
    "out": ((lambda v: type(v) is str and v in STREAMS, " or ".join(STREAMS)),
            (lambda v: type(v) is bytes, "bytes")),
    "exit": ((lambda v: type(v) is int, "an int"),),
    "launch": ((_argv, "a non-empty tuple of str"), (_env, "a dict of str to str")),
    "signal": ((lambda v: type(v) is int and 0 < v < signal.NSIG, f"a signal number (1 to {signal.NSIG - 1})"),),
    "done": (),
}
_BY_KIND: Dict[str, type] = {cls.KIND: cls for cls in FROM_AGENT + FROM_DRIVER}


def _checked(cls: type, data) -> Message:
    """``cls``'s record from ``data`` (its kind and fields as plain data), every field checked.

    Raises:
        ValueError: ``data`` is not such a message; the text names the kind and the wrong field.
    """
    if type(data) is not tuple or not data or data[0] != cls.KIND:
        raise ValueError(f"not a {cls.KIND!r} message: {data!r:.100}")
    fields, checks = data[1:], _CHECKS[cls.KIND]
    if len(fields) != len(checks):
        raise ValueError(f"malformed {cls.KIND!r} message: {len(fields)} fields, not {len(checks)}: {data!r:.100}")
    for name, (check, what), value in zip(cls._fields, checks, fields):
        if not check(value):
            raise ValueError(f"malformed {cls.KIND!r} message: {name} is not {what}: {value!r:.80}")
    return cls(*fields)


def decode(data, *allowed: type) -> Message:
    """The record a message holds, checked; with ``allowed``, only those kinds.

    Raises:
        ValueError: the message is not a tuple of a known kind, is of a kind not allowed here, or has a wrong field
            (the text names the kind and the field).
    """
    kind = data[0] if type(data) is tuple and data and type(data[0]) is str else None
    cls = _BY_KIND.get(kind) if kind is not None else None
    if cls is None:
        raise ValueError(f"a Spark link message of unknown kind: {data!r:.100}")
    if allowed and cls not in allowed:
        expected = " or ".join(repr(t.KIND) for t in allowed)
        raise ValueError(f"expected a {expected} message on the Spark link, got {kind!r}: {data!r:.100}")
    return cls.from_wire(data)
