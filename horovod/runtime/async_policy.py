"""Asynchronous training, once for every binding: what is averaged, when, with which correction, and with whom.

Four modes, each a small state machine over lists of numpy arrays (a binding hands over its parameters as arrays,
lets the policy change them in place, and writes them back; it adds no rule of its own):

* :class:`LocalSGD` (post-local SGD): gradients are averaged for the first ``warmup_steps`` steps; afterwards each
  rank steps on its own and the parameters are averaged every ``period`` steps. The averaging is asynchronous: after
  step ``k*period`` the parameters (plus any progress set aside earlier) are snapshotted and their allreduce is
  submitted; ``overlap_steps`` local steps later the average is applied. The correction: the parameters become
  exactly the average (the same bits on every rank), and the local progress made while the allreduce was in flight
  (parameters minus snapshot) is set aside and added back when the next snapshot is taken, so it is averaged one
  round late instead of being lost. ``overlap_steps=0`` averages synchronously.
* :class:`OuterSteps` (DiLoCo): every ``period`` inner steps the ranks average their parameter deltas from the last
  outer point (``anchor - params``, optionally sent as float16 or bfloat16) and an outer optimizer (SGD with Nesterov
  momentum by default, :class:`NesterovSGD`) moves the anchor; every rank then continues from the new anchor.
* :class:`StaleGradients` (``staleness=s``): a step submits this step's gradients and applies the averaged gradients
  of ``s`` steps ago, so the allreduce runs behind the next forward and backward passes.
* Gossip (:mod:`horovod.runtime.gossip`): each step a rank averages its parameters with one peer. The peers come
  from a schedule of matchings every rank derives alike; each pair is a two-rank process set that only its two
  ranks negotiate, so no rank waits for anybody but its partner.

Every averaging of :class:`LocalSGD`, :class:`OuterSteps` and gossip leaves the ranks concerned with the
same bits (the engine's allreduce gives every member the same result and the corrections are the same arithmetic
everywhere). Counters are plain ints (:meth:`state_dict`), so an elastic commit can save them.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from horovod.common.bfloat16 import from_bfloat16, to_bfloat16
from horovod.runtime import basics
from horovod.runtime import collectives as _c
from horovod.runtime.collectives import Average
from horovod.runtime.compression import Compressor
from horovod.runtime.process_sets import ProcessSet, global_process_set

__all__ = ["TOPOLOGIES", "wire_dtype_of", "to_wire", "from_wire", "average_arrays", "LocalSGD", "NesterovSGD",
           "OuterSteps", "StaleGradients", "Schedule"]

TOPOLOGIES = ("ring", "exponential")


def _check_count(label: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{label} must be an integer >= {minimum}, not {value!r}")
    return value


# -- the wire: float16 / bfloat16 -----------------------------------------------------------------------------------

_WIRE_NAMES = {"none": None, "fp16": "float16", "bf16": "bfloat16", "float16": "float16", "bfloat16": "bfloat16"}


def wire_dtype_of(compression) -> Optional[str]:
    """The wire dtype a compressor stands for: ``"float16"``, ``"bfloat16"`` or None (as is).

    Accepts None, the strings ``"none"``/``"fp16"``/``"bf16"``, or a binding's ``Compression.*`` class (its ``wire``,
    :func:`horovod.runtime.compression.cast_compressor`).

    Raises:
        ValueError: another string, or a compressor that is not a cast to float16 or bfloat16.
    """
    if compression is None:
        return None
    if isinstance(compression, str) and compression.lower() in _WIRE_NAMES:
        return _WIRE_NAMES[compression.lower()]
    if isinstance(compression, type) and issubclass(compression, Compressor) and \
            getattr(compression, "wire", "") in (None, "float16", "bfloat16"):
        return compression.wire
    raise ValueError(f"unknown compression {compression!r}: use none, fp16 or bf16")


def to_wire(array: np.ndarray, wire: Optional[str]) -> np.ndarray:
    """``array`` as it travels: a float16 copy, bfloat16 bits (uint16, rounded to nearest even), or a copy."""
    if wire is None:
        return np.array(array, copy=True)
    if wire == "float16":
        return np.asarray(array, dtype=np.float16)
    return to_bfloat16(array)


def from_wire(array: np.ndarray, wire: Optional[str], dtype) -> np.ndarray:
    """Undo :func:`to_wire`: the values in ``dtype``."""
    if wire == "bfloat16":
        array = from_bfloat16(array)
    return np.asarray(array, dtype=dtype)


def average_arrays(arrays: Sequence[np.ndarray], name: str, process_set: ProcessSet = global_process_set,
                   wire: Optional[str] = None):
    """Submit the average of ``arrays`` over the set as one grouped allreduce; returns ``finish() -> arrays``.

    The arrays travel as copies (in ``wire`` when given), so the caller may change its own at once.
    """
    sent = [to_wire(a, wire) for a in arrays]
    dtypes = ["bfloat16" if wire == "bfloat16" else None] * len(sent)
    handle = _c.grouped_allreduce_async(sent, name=name, op=Average, process_set=process_set, outputs=sent,
                                        dtypes=dtypes)

    def finish() -> List[np.ndarray]:
        handle.result()
        return [from_wire(s, wire, a.dtype) for s, a in zip(sent, arrays)]
    finish.done = handle.done
    return finish


# -- what every mode shares -------------------------------------------------------------------------------------------

class Schedule:
    """Base of the modes: a step counter that every rank of the set agrees on.

    After every ``hvd.init`` (the first, and each elastic reset) the first step on each rank forgets what was in
    flight (:meth:`discard`) and takes the counter from the set's first rank, so survivors and new workers of an
    elastic job continue the same schedule, and nothing of a broken round is applied.
    """

    kind = "schedule"

    def __init__(self, process_set: ProcessSet = global_process_set, name: Optional[str] = None):
        self.process_set = process_set
        self._name = name or (self._number() if basics.is_initialized() else None)
        self.step = 0
        self.averaged = False           # the last step averaged: the ranks concerned hold the same bits
        self._context = None

    @property
    def name(self) -> str:
        """The prefix of the collectives' names (one built before ``init`` is numbered here, at its first use)."""
        self._name = self._name or self._number()
        return self._name

    def _number(self) -> str:
        # Every rank builds its modes in the same order: the job's counter (each init's own) names them alike.
        return f"{self.kind}.{basics.context().counters.next('async_policy')}"     # (ValueError before init)

    def _root(self) -> int:
        ranks = self.process_set.ranks
        return ranks[0] if self.process_set.process_set_id and ranks else 0

    def before_step(self, params: Sequence[np.ndarray]) -> None:
        """Call before every local step with the parameters (the first step after an init agrees on the counter)."""
        context = basics.context()
        if context is self._context:
            return
        self._context = context
        self.discard()
        self.step = int(_c.broadcast_object(self.step, self._root(), name=f"{self.name}.step",
                                            process_set=self.process_set))
        self._started(params)

    def _started(self, params: Sequence[np.ndarray]) -> None:
        """Hook: the schedule (re)starts after an init."""

    def discard(self) -> None:
        """Forget what is in flight or set aside (an elastic reset restores a commit)."""
        self.averaged = False

    def state_dict(self) -> Dict[str, int]:
        """The counter (plain data)."""
        return {"step": self.step}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Restore :meth:`state_dict`'s counter; anything in flight is discarded."""
        self.discard()
        self.step = int(state["step"])


# -- local SGD --------------------------------------------------------------------------------------------------------

class LocalSGD(Schedule):
    """Post-local SGD with asynchronous parameter averaging (see the module docstring).

    A binding calls :meth:`before_step`, then (when :meth:`in_warmup`) :meth:`average_gradients`, steps, and calls
    :meth:`after_step`, always with the same list of parameter arrays.

    Args:
        period: local steps between averagings (H >= 1).
        warmup_steps: steps with synchronous gradient averaging first.
        overlap_steps: local steps the allreduce runs behind before its average is applied (0: synchronous;
            else < ``period``, so that one averaging is in flight at a time). Default 1 (0 when ``period`` is 1).
        process_set: the ranks that average.
        name: the reductions' names (default: one per instance, in construction order).
    Raises:
        ValueError: a count out of range.
    """

    kind = "localsgd"

    def __init__(self, period: int, warmup_steps: int = 0, overlap_steps: Optional[int] = None,
                 process_set: ProcessSet = global_process_set, name: Optional[str] = None):
        super().__init__(process_set, name)
        self.period = _check_count("period", period, 1)
        self.warmup_steps = _check_count("warmup_steps", warmup_steps, 0)
        overlap = (1 if period > 1 else 0) if overlap_steps is None else overlap_steps
        self.overlap_steps = _check_count("overlap_steps", overlap, 0)
        if self.overlap_steps and self.overlap_steps >= self.period:
            raise ValueError(f"overlap_steps ({overlap_steps}) must be below period ({period}): one averaging is "
                             f"applied before the next is submitted")
        self._pending = None            # (finish, snapshot, apply at step)
        self._carry: Optional[List[np.ndarray]] = None

    def in_warmup(self) -> bool:
        """Whether the coming step averages gradients synchronously."""
        return self.step < self.warmup_steps

    def average_gradients(self, grads: Sequence[np.ndarray]) -> None:
        """Average ``grads`` over the set, in place (warm-up steps)."""
        for grad, avg in zip(grads, average_arrays(grads, f"{self.name}.grad", self.process_set)()):
            grad[...] = avg

    def after_step(self, params: Sequence[np.ndarray]) -> bool:
        """Count a step; average ``params`` in place when due. True when they now hold the averaged bits."""
        self.step += 1
        self.averaged = False
        local = self.step - self.warmup_steps
        if local <= 0:
            return False
        if self._pending is not None and self.step >= self._pending[2]:
            self._apply(params)
        if local % self.period == 0:
            self._submit(params)
            if self.overlap_steps == 0:
                self._apply(params)
        return self.averaged

    def _submit(self, params: Sequence[np.ndarray]) -> None:
        if self._carry is not None:
            for p, c in zip(params, self._carry):
                p += c
            self._carry = None
        snapshot = [np.array(p, copy=True) for p in params]
        finish = average_arrays(snapshot, f"{self.name}.params", self.process_set)
        self._pending = (finish, snapshot, self.step + self.overlap_steps)

    def _apply(self, params: Sequence[np.ndarray]) -> None:
        finish, snapshot, _ = self._pending
        self._pending = None
        averages = finish()
        carry = [p - s for p, s in zip(params, snapshot)]
        self._carry = carry if any(np.any(c) for c in carry) else None
        for p, a in zip(params, averages):
            p[...] = a
        self.averaged = True

    def flush(self, params: Sequence[np.ndarray]) -> None:
        """Apply the averaging in flight and average everything set aside, synchronously: afterwards every rank
        holds the same parameters and nothing is pending (before evaluating, checkpointing or an elastic commit).
        Every rank of the set must call it at the same step."""
        self.before_step(params)
        if self._pending is not None:
            self._apply(params)
        if self.step > self.warmup_steps:       # the same branch on every rank (the carry is local)
            self._submit(params)
            self._apply(params)
            self._carry = None

    def discard(self) -> None:
        """Forget the averaging in flight and the progress set aside."""
        super().discard()
        self._pending, self._carry = None, None


# -- outer steps on averaged deltas (DiLoCo) -------------------------------------------------------------------------

class NesterovSGD:
    """The default outer optimizer: SGD with (Nesterov) momentum on numpy arrays, in place.

    ``v = momentum * v + g``; the step is ``g + momentum * v`` with Nesterov, else ``v``; ``x -= lr * step``.
    """

    def __init__(self, lr: float = 0.7, momentum: float = 0.9, nesterov: bool = True):
        if not lr > 0 or not 0 <= momentum < 1:
            raise ValueError(f"outer lr must be > 0 and momentum in [0, 1), not lr={lr!r} momentum={momentum!r}")
        self.lr, self.momentum, self.nesterov = float(lr), float(momentum), bool(nesterov)
        self.velocity: Optional[List[np.ndarray]] = None

    def __call__(self, anchor: Sequence[np.ndarray], grads: Sequence[np.ndarray]) -> None:
        """Move ``anchor`` in place by the outer gradients ``grads``."""
        if self.velocity is None:
            self.velocity = [np.zeros_like(a) for a in anchor]
        for x, g, v in zip(anchor, grads, self.velocity):
            g = np.asarray(g, dtype=x.dtype)
            mu = x.dtype.type(self.momentum)
            v *= mu
            v += g
            x -= x.dtype.type(self.lr) * (g + mu * v if self.nesterov else v)


class OuterSteps(Schedule):
    """DiLoCo-style outer steps (see the module docstring): :meth:`before_step`, the inner step, :meth:`after_step`.

    Args:
        period: inner steps between outer steps (H >= 1).
        outer_lr, outer_momentum, nesterov: the default outer optimizer, :class:`NesterovSGD`.
        outer_step: instead, ``(anchor arrays, averaged outer gradients) -> None`` moving the anchor in place.
        compression: the deltas' wire dtype (:func:`wire_dtype_of`: none, fp16, bf16).
        process_set: the ranks that average.
        name: the reductions' names.
    """

    kind = "outer"

    def __init__(self, period: int, outer_lr: float = 0.7, outer_momentum: float = 0.9, nesterov: bool = True,
                 outer_step: Optional[Callable] = None, compression=None,
                 process_set: ProcessSet = global_process_set, name: Optional[str] = None):
        super().__init__(process_set, name)
        self.period = _check_count("period", period, 1)
        self.outer_step = outer_step if outer_step is not None else NesterovSGD(outer_lr, outer_momentum, nesterov)
        self.wire = wire_dtype_of(compression)
        self.anchor: Optional[List[np.ndarray]] = None

    def _started(self, params: Sequence[np.ndarray]) -> None:
        # The anchor (the outer point) is the set's first rank's parameters; every rank starts from it.
        anchor = [np.array(p, copy=True) for p in params]
        handles = [_c.broadcast_async(a, self._root(), name=f"{self.name}.anchor.{i}", process_set=self.process_set,
                                      output=a) for i, a in enumerate(anchor)]
        for handle in handles:
            handle.result()
        for p, a in zip(params, anchor):
            p[...] = a
        self.anchor = anchor
        if isinstance(self.outer_step, NesterovSGD):
            self.outer_step.velocity = _c.broadcast_object(self.outer_step.velocity, self._root(),
                                                           name=f"{self.name}.velocity", process_set=self.process_set)

    def after_step(self, params: Sequence[np.ndarray]) -> bool:
        """Count an inner step; every ``period`` steps do the outer step and set ``params`` to the new anchor.
        True when it did (every rank then holds the same bits)."""
        self.step += 1
        self.averaged = self.step % self.period == 0
        if self.averaged:
            self.outer(params)
        return self.averaged

    def outer(self, params: Sequence[np.ndarray]) -> None:
        """The outer step now (also at the end of training): average the deltas, move the anchor, take it."""
        deltas = [a - p for a, p in zip(self.anchor, params)]
        self.outer_step(self.anchor, average_arrays(deltas, f"{self.name}.delta", self.process_set, self.wire)())
        for p, a in zip(params, self.anchor):
            p[...] = a

    def state_dict(self) -> Dict[str, object]:
        """The counter, and the default outer optimizer's momentum."""
        velocity = getattr(self.outer_step, "velocity", None)
        return {"step": self.step, "velocity": None if velocity is None else [v.copy() for v in velocity]}

    def load_state_dict(self, state: Dict[str, object]) -> None:
        """Restore :meth:`state_dict`; the anchor is taken again from the parameters at the next step."""
        super().load_state_dict(state)
        if isinstance(self.outer_step, NesterovSGD):
            velocity = state.get("velocity")
            self.outer_step.velocity = None if velocity is None else [np.array(v) for v in velocity]


# -- stale gradients ------------------------------------------------------------------------------------------------

class StaleGradients(Schedule):
    """Gradients applied ``staleness`` steps late, so their allreduce overlaps the next steps' computation.

    Args:
        staleness: how many steps late (>= 1).
        compression: the wire dtype (:func:`wire_dtype_of`).
        process_set: the ranks that average.
        name: the reductions' names.
    """

    kind = "stale"

    def __init__(self, staleness: int = 1, compression=None, process_set: ProcessSet = global_process_set,
                 name: Optional[str] = None):
        super().__init__(process_set, name)
        self.staleness = _check_count("staleness", staleness, 1)
        self.wire = wire_dtype_of(compression)
        self._in_flight: List[Callable] = []

    def exchange(self, grads: Sequence[np.ndarray]) -> Optional[List[np.ndarray]]:
        """Submit the average of ``grads`` (copied) and return the average submitted ``staleness`` calls ago, or
        None while there is none yet (the first ``staleness`` steps apply nothing)."""
        # Names cycle over staleness + 1 slots: a name is reused only after its allreduce completed.
        slot = self.step % (self.staleness + 1)
        self.step += 1
        self._in_flight.append(average_arrays(grads, f"{self.name}.{slot}", self.process_set, self.wire))
        if len(self._in_flight) <= self.staleness:
            return None
        return self._in_flight.pop(0)()

    def drain(self) -> List[List[np.ndarray]]:
        """Wait for every allreduce in flight; their averages, oldest first (the end of training)."""
        out = [finish() for finish in self._in_flight]
        self._in_flight.clear()
        return out

    def discard(self) -> None:
        """Forget the allreduces in flight (an elastic reset); the next steps start stale again."""
        super().discard()
        self._in_flight.clear()
