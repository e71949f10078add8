"""The host side of every JAX collective: one description (:class:`Spec`), one submission to the engine.

Eager calls and the host callbacks of jitted code both end here: the leaves of a pytree become numpy buffers
(:mod:`horovod.jax._arrays`), go to :mod:`horovod.runtime.collectives` as one op or one group, and come back as
numpy arrays in the leaves' dtypes. What the output shapes are when traced (static shapes for ``jax.jit``) is
decided here too, so the eager and traced paths cannot disagree.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from horovod.jax._arrays import core_dtype, from_core, to_core
from horovod.jax._job import job
from horovod.runtime import collectives as _c
from horovod.runtime.gradient_policy import check_reducescatter_op, check_scale_factors, or_global, set_rank, \
    set_size
from horovod.runtime.process_sets import ProcessSet, global_process_set

KINDS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
ROW_KINDS = ("allgather", "alltoall", "reducescatter")   # ops that work on the first dimension


@dataclass(frozen=True, eq=False)
class Spec:
    """One collective over the leaves of a pytree, everything but the data.

    Attributes:
        kind: one of :data:`KINDS`.
        name: the user's name, a traced call site's name, or None (numbered in submission order; eager only).
        grouped: submit as one group even with a single leaf (any container of arrays is a group).
        shapes, dtypes: the leaves' shapes and dtypes on this rank.
        op, prescale, postscale: the reduction (allreduce, reducescatter).
        root_rank: the broadcast root (a global rank).
        splits: alltoall rows sent to each rank (None: equal parts).
        process_set: the ranks taking part.
        rows: inside ``jax.jit``, the total rows of each allgather output (None: set size x this rank's rows).
        traced: the op runs inside a JAX transformation (static output shapes, row checks).
    """

    kind: str
    name: Optional[str]
    shapes: Tuple[Tuple[int, ...], ...]
    dtypes: Tuple[np.dtype, ...]
    grouped: bool = False
    op: int = _c.Average
    prescale: float = 1.0
    postscale: float = 1.0
    root_rank: int = -1
    splits: Optional[Tuple[int, ...]] = None
    process_set: ProcessSet = global_process_set
    rows: Optional[Tuple[int, ...]] = None
    traced: bool = False


def make_spec(kind: str, leaves: Sequence, name: Optional[str], **options) -> Spec:
    """A validated :class:`Spec` for ``leaves`` (arrays or abstract values with ``shape`` and ``dtype``).

    Raises:
        ValueError: an unsupported dtype, an op the kind does not take, a root outside the set, or indivisible
            rows for an alltoall without splits.
        TypeError: a scale factor that is not a real number.
    """
    options["process_set"] = or_global(options.get("process_set"))
    if "prescale" in options or "postscale" in options:
        options["prescale"], options["postscale"] = check_scale_factors(options.get("prescale", 1.0),
                                                                        options.get("postscale", 1.0))
    spec = Spec(kind, name, tuple(tuple(int(d) for d in x.shape) for x in leaves),
                tuple(np.dtype(x.dtype) for x in leaves), **options)
    for dtype in spec.dtypes:
        core_dtype(dtype)
    _validate(spec)
    return spec


def _validate(spec: Spec) -> None:
    if spec.kind == "allreduce" and any(d == np.bool_ for d in spec.dtypes) and \
            (spec.op == _c.Average or spec.prescale != 1.0 or spec.postscale != 1.0):
        raise ValueError("boolean tensors cannot be averaged or scaled; use op=hvd.Sum, Min or Max")
    if spec.kind == "reducescatter":
        check_reducescatter_op(spec.op)
    if spec.kind == "broadcast":
        set_size(spec.process_set)
        if spec.root_rank not in spec.process_set.ranks:
            raise ValueError(f"broadcast root_rank {spec.root_rank} is not a member of the process set "
                             f"{list(spec.process_set.ranks)}")
    if spec.kind == "alltoall":
        size = set_size(spec.process_set)
        for shape in spec.shapes:
            if not shape:
                raise ValueError("alltoall needs a tensor with at least one dimension")
            if spec.splits is None and shape[0] % size:
                raise ValueError(f"alltoall without splits needs the first dimension ({shape[0]}) to be divisible "
                                 f"by the number of ranks ({size})")


# -- static output shapes -------------------------------------------------------------------------------------------

def _rows(shape) -> Tuple[int, Tuple[int, ...]]:
    shape = tuple(shape) or (1,)
    return shape[0], shape[1:]


def out_shapes(spec: Spec) -> List[Tuple[int, ...]]:
    """The output shape of each leaf when traced (alltoall: then the received splits' shape)."""
    size = set_size(spec.process_set)
    if spec.kind in ("allreduce", "broadcast"):
        return list(spec.shapes)
    if spec.kind == "allgather":
        outs = []
        for i, shape in enumerate(spec.shapes):
            rows, rest = _rows(shape)
            outs.append(((spec.rows[i] if spec.rows else size * rows),) + rest)
        return outs
    if spec.kind == "reducescatter":
        me = set_rank(spec.process_set)
        outs = []
        for shape in spec.shapes:
            rows, rest = _rows(shape)
            base, extra = divmod(rows, size)
            outs.append((base + (1 if me < extra else 0),) + rest)
        return outs
    return [spec.shapes[0], (size,)]   # alltoall: output, received splits


# -- submission -----------------------------------------------------------------------------------------------------

def submit(spec: Spec, arrays: Sequence[np.ndarray]):
    """Start the collective on host arrays; returns the core handle (its result: a list, or alltoall's pair)."""
    inputs = [to_core(a) for a in arrays]
    data, dtypes = [a for a, _ in inputs], [d for _, d in inputs]
    ps, single = spec.process_set, len(data) == 1 and not spec.grouped
    if spec.kind in ("allreduce", "reducescatter"):
        kwargs = dict(op=spec.op, prescale_factor=spec.prescale, postscale_factor=spec.postscale, process_set=ps)
        one, grouped = ((_c.allreduce_async, _c.grouped_allreduce_async) if spec.kind == "allreduce" else
                        (_c.reducescatter_async, _c.grouped_reducescatter_async))
        if single:
            return one(data[0], dtype=dtypes[0], name=spec.name, **kwargs)
        return grouped(data, dtypes=dtypes, name=spec.name, **kwargs)
    if spec.kind == "allgather":
        if spec.traced:   # every rank learns every rank's rows, so a ragged gather fails on all of them alike
            data.append(np.array([a.shape[0] if a.ndim else 1 for a in data], dtype=np.int64))
            dtypes.append(None)
        if len(data) == 1 and not spec.grouped:
            return _c.allgather_async(data[0], dtype=dtypes[0], process_set=ps, name=spec.name)
        return _c.grouped_allgather_async(data, dtypes=dtypes, process_set=ps, name=spec.name)
    if spec.kind == "broadcast":
        if single:
            return _c.broadcast_async(data[0], spec.root_rank, dtype=dtypes[0], process_set=ps, name=spec.name)
        return _GroupOf([_c.broadcast_async(a, spec.root_rank, dtype=d, process_set=ps,
                                            name=None if spec.name is None else f"{spec.name}_{i + 1}of{len(data)}")
                         for i, (a, d) in enumerate(zip(data, dtypes))])
    return _c.alltoall_async(data[0], spec.splits, dtype=dtypes[0], process_set=ps, name=spec.name)


class _GroupOf:
    """Several handles read as one: ``result()`` is the list of their results."""

    def __init__(self, handles):
        self.handles = handles

    def done(self) -> bool:
        return all(h.done() for h in self.handles)

    def result(self):
        return [h.result() for h in self.handles]


def finish(spec: Spec, result) -> List[np.ndarray]:
    """The outputs of a completed collective as arrays in the leaves' dtypes (alltoall: ``[output, splits]``).

    Raises:
        ValueError: inside ``jax.jit``, an allgather whose ranks contributed rows the static shape cannot hold
            (raised on every rank alike).
    """
    if spec.kind == "alltoall":
        output, received = result
        return [from_core(output, spec.dtypes[0]), np.asarray(received, dtype=np.int32)]
    results = list(result) if isinstance(result, list) else [result]
    if spec.kind == "allgather" and spec.traced:
        results = _check_gathered_rows(spec, results)
    return [from_core(r, d) for r, d in zip(results, spec.dtypes)]


def _check_gathered_rows(spec: Spec, results: List[np.ndarray]) -> List[np.ndarray]:
    n = len(spec.shapes)
    rows = np.asarray(results[-1]).reshape(-1, n)
    for i in range(n):
        counts = rows[:, i].tolist()
        expected = spec.rows[i] if spec.rows else counts[0] * len(counts)
        if sum(counts) != expected or (not spec.rows and len(set(counts)) > 1):
            raise ValueError(f"allgather '{spec.name}' inside jax.jit needs the same first dimension on every rank "
                             f"(static shapes), but the ranks contributed {counts} rows; gather ragged arrays "
                             f"eagerly, outside jax.jit")
    return results[:-1]


def run(spec: Spec, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
    """Submit, wait, and return :func:`finish`'s outputs."""
    return finish(spec, submit(spec, arrays).result())


def run_many(specs: Sequence[Spec], arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
    """Start several collectives at once (``arrays`` holds their leaves one spec after another), so the engine
    negotiates and fuses them together, then wait for all; returns every output in the same order."""
    handles, start = [], 0
    for spec in specs:
        handles.append(submit(spec, arrays[start:start + len(spec.shapes)]))
        start += len(spec.shapes)
    outs: List[np.ndarray] = []
    for spec, handle in zip(specs, handles):
        outs.extend(finish(spec, handle.result()))
    return outs


# -- handles for asynchronous ops inside jax.jit --------------------------------------------------------------------

# Process-lifetime (docs/architecture.md): an id never repeats in a process (the parked handles are the job's).
_pending_ids = itertools.count(1)


def submit_pending(spec: Spec, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Start the collective and park its handle in this job's state; returns the handle's id as an int32 scalar."""
    core = submit(spec, arrays)
    state = job()
    with state.lock:
        handle_id = next(_pending_ids) & 0x7FFFFFFF
        state.pending[handle_id] = (spec, core)
    return np.int32(handle_id)


def wait_pending(handle_id) -> List[np.ndarray]:
    """Wait for a parked collective and return its outputs.

    Raises:
        ValueError: the id names no pending collective (already synchronized).
    """
    state = job()
    with state.lock:
        entry = state.pending.pop(int(handle_id), None)
    if entry is None:
        raise ValueError(f"synchronize: handle {int(handle_id)} is not pending (synchronized twice?)")
    spec, core = entry
    return finish(spec, core.result())


__all__ = ["Spec", "KINDS", "ROW_KINDS", "make_spec", "out_shapes", "submit", "finish", "run", "run_many", "submit_pending",
           "wait_pending"]
