"""Every collective once, on numpy arrays: naming, validation, submission to the engine, and object collectives.

Bindings convert their tensors to numpy views, call these functions, and convert the results back; nothing about
a collective's semantics lives in a binding. Each ``*_async`` returns a :class:`Handle` whose ``result()`` is the
output array (alltoall: ``(output, received_splits)``; grouped ops: a list).
"""

from __future__ import annotations

import hashlib
import types
from typing import Any, List, Optional, Sequence

import numpy as np

from horovod.runtime import basics
from horovod.runtime import device as _device
from horovod.runtime.process_sets import ProcessSet, global_process_set
from horovod.common.exceptions import UnsupportedOperationError
from horovod.common.types import CPU_DEVICE, OpType, ReduceOp, Request, dtype_name
from horovod.common.util import check_adasum_ranks, get_average_backwards_compatibility_fun
from horovod.core.handles import Handle

Average, Sum, Adasum, Min, Max, Product = (ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.ADASUM, ReduceOp.MIN,
                                           ReduceOp.MAX, ReduceOp.PRODUCT)

def _group_id(base: str) -> int:
    """A group's id, the same on every rank: derived from its name, which every rank of the set shares."""
    return int.from_bytes(hashlib.blake2b(base.encode(), digest_size=8).digest(), "big") & ((1 << 62) - 1)


def _auto_name(prefix: str, process_set: Optional[ProcessSet] = None) -> str:
    """Unnamed tensors are numbered per op and process set in submission order, which must match across the set's
    ranks (as in Horovod). Counting per set keeps ops on a subset from shifting the numbers of everybody else's;
    the counts are the context's, so every ``init`` starts them again (a new elastic round's ranks agree).

    Raises:
        ValueError: Horovod is not initialized.
    """
    set_id = (process_set or global_process_set).process_set_id or 0
    key = prefix if set_id == 0 else f"{prefix}.ps{set_id}"
    return f"{key}.noname.{basics.context().counters.next(key)}"


def _name(prefix: str, name: Optional[str], process_set: Optional[ProcessSet] = None) -> str:
    return f"{prefix}.{name}" if name else _auto_name(prefix, process_set)


# Horovod's rule for the deprecated ``average=`` argument (op and average together is an error; average alone maps
# to Average or Sum, with its DeprecationWarning), the one copy: common.util's, which bindings also export.
_op_or_average = get_average_backwards_compatibility_fun(types.SimpleNamespace(Average=Average, Sum=Sum))


def resolve_op(op: Optional[int], average: Optional[bool]) -> ReduceOp:
    """The reduce op that ``op`` and the deprecated ``average`` ask for (:func:`horovod.common.util.
    get_average_backwards_compatibility_fun`'s rule; neither: Average).

    Raises:
        ValueError: both are given, or ``op`` is not a reduce op.
    """
    if average is not None or op is None:
        op = _op_or_average(op, average)
    found = _REDUCE_OPS.get(op)     # a dict hit instead of the enum's slow constructor: this runs per gradient
    return found if found is not None else ReduceOp(op)


_REDUCE_OPS = {int(op): op for op in ReduceOp}


def _set_id(process_set: Optional[ProcessSet]) -> int:
    ps = process_set or global_process_set
    if ps.process_set_id is None:
        raise ValueError(f"{ps} has not been registered; use hvd.add_process_set() or hvd.init(process_sets=...)")
    return ps.process_set_id


def _set_ranks(set_id: int) -> Sequence[int]:
    ranks = basics.engine().set_ranks(set_id)
    if ranks is None:
        raise ValueError(f"process set {set_id} is not registered")
    return ranks


def _contiguous(array: np.ndarray) -> np.ndarray:
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def _check_output(what: str, output, shape) -> None:
    """An output buffer must have the input's shape, be contiguous and writable (a device tensor's is, by its
    binding)."""
    if output.shape != tuple(shape) or (not _device.is_device(output) and not output.flags.c_contiguous):
        raise ValueError(f"{what} output must be contiguous with shape {tuple(shape)}")
    if not _device.is_device(output) and not output.flags.writeable:
        raise ValueError(f"{what} in place needs a writable array; this one is read-only")


def _dtype(array, dtype: Optional[str]) -> str:
    if dtype:
        return dtype
    return array.dtype if _device.is_device(array) else dtype_name(np.asarray(array))


class GroupHandle(Handle):
    """Handle over several handles; ``result()`` returns their results as a list."""

    __slots__ = ("handles",)

    def __init__(self, name: str, handles: List[Handle]):
        super().__init__(name)
        self.handles = handles

    def done(self) -> bool:
        """Whether every handle is done."""
        return all(h.done() for h in self.handles)

    def wait(self, timeout=None) -> bool:
        """Wait for every handle (``timeout`` each); whether all are done."""
        return all(h.wait(timeout) for h in self.handles)

    def result(self, timeout=None) -> List[Any]:
        """Every handle's result, in order (raising the first error)."""
        return [h.result(timeout) for h in self.handles]


# -- allreduce ------------------------------------------------------------------------------------------------------

def allreduce_async(array: np.ndarray, name: Optional[str] = None, op: Optional[int] = None,
                    average: Optional[bool] = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set, output: Optional[np.ndarray] = None,
                    dtype: Optional[str] = None, *, _full_name: Optional[str] = None, _group: int = -1,
                    _group_size: int = 0) -> Handle:
    """Start an allreduce of ``array``; the handle's result is the reduced array (``output`` if given)."""
    # This runs once per gradient per step: the helpers' common cases are inline.
    reduce_op = _REDUCE_OPS.get(op) if average is None and op is not None else resolve_op(op, average)
    if reduce_op is None:
        reduce_op = resolve_op(op, average)
    set_id = process_set.process_set_id if process_set is not None else None
    if set_id is None:
        set_id = _set_id(process_set)
    device, restore = CPU_DEVICE, None
    if type(array) is not np.ndarray:
        if _device.is_device(array):
            dtype = dtype or array.dtype
            array, output, device, restore = _device.route(basics.engine().device_plane, array, output, reduce_op)
        else:
            array = np.asarray(array)
    if type(array) is np.ndarray:
        array = _contiguous(array)
        dtype = dtype or dtype_name(array)
    if reduce_op == Adasum:
        size = len(_set_ranks(set_id))
        if set_id != 0:
            raise NotImplementedError("Adasum does not support non-global process sets yet")
        check_adasum_ranks(size)
        if not dtype.startswith("float") and dtype != "bfloat16":
            raise ValueError(f"Adasum needs floating-point tensors, not {dtype}")
    if dtype == "bool" and (reduce_op == Average or prescale_factor != 1.0 or postscale_factor != 1.0):
        raise ValueError("boolean tensors cannot be averaged or scaled; use op=hvd.Sum, Min or Max")
    if output is not None:      # (in place too: a read-only array is refused here, not in the engine)
        _check_output("allreduce", output, array.shape)
    full_name = _full_name or (f"allreduce.{name}" if name else _auto_name("allreduce", process_set))
    request = Request.fast((full_name, OpType.ALLREDUCE, dtype, array.shape, int(reduce_op),
                             float(prescale_factor), float(postscale_factor), -1, None, _group,
                             (_group_size,) if _group >= 0 else None, device))
    return _device.wrap_staged(basics.engine().submit(request, array, output, set_id), restore)


def allreduce(array: np.ndarray, **kwargs) -> np.ndarray:
    """:func:`allreduce_async`, waited for: the reduced array."""
    return allreduce_async(array, **kwargs).result()


def grouped_allreduce_async(arrays: Sequence[np.ndarray], name: Optional[str] = None, op: Optional[int] = None,
                            average: Optional[bool] = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
                            outputs: Optional[Sequence[np.ndarray]] = None,
                            dtypes: Optional[Sequence[Optional[str]]] = None) -> GroupHandle:
    """Allreduce a list of arrays as one group: negotiated together and fused together."""
    reduce_op = resolve_op(op, average)
    n = len(arrays)
    base = name if name else _auto_name("grouped_allreduce", process_set)
    base = base if not name else f"grouped_allreduce.{name}"
    group = _group_id(base)
    handles = [allreduce_async(a, op=reduce_op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                               process_set=process_set, output=outputs[i] if outputs else None,
                               dtype=dtypes[i] if dtypes else None, _full_name=f"{base}_{i + 1}of{n}",
                               _group=group, _group_size=n)
               for i, a in enumerate(arrays)]
    return GroupHandle(base, handles)


# -- allgather ------------------------------------------------------------------------------------------------------

def allgather_async(array: np.ndarray, name: Optional[str] = None, process_set: ProcessSet = global_process_set,
                    dtype: Optional[str] = None, *, _full_name: Optional[str] = None, _group: int = -1,
                    _group_size: int = 0) -> Handle:
    """Start an allgather: arrays concatenated on the first dimension, which may differ per rank."""
    set_id = _set_id(process_set)
    dtype = _dtype(array, dtype)
    array, _, device, restore = _device.prepare(array, basics.engine)
    if array.ndim == 0:
        array = _device.one_row(array)
    request = Request(_full_name or _name("allgather", name, process_set), OpType.ALLGATHER, dtype,
                      tuple(array.shape), group=_group, payload=(_group_size,) if _group >= 0 else None,
                      device=device)
    return _device.wrap_staged(basics.engine().submit(request, array, None, set_id), restore)


def allgather(array: np.ndarray, **kwargs) -> np.ndarray:
    """:func:`allgather_async`, waited for: every rank's rows, in rank order."""
    return allgather_async(array, **kwargs).result()


def grouped_allgather_async(arrays: Sequence[np.ndarray], name: Optional[str] = None,
                            process_set: ProcessSet = global_process_set,
                            dtypes: Optional[Sequence[Optional[str]]] = None) -> GroupHandle:
    """Start one allgather per array, negotiated as a group (executed together); a :class:`GroupHandle`."""
    n = len(arrays)
    base = f"grouped_allgather.{name}" if name else _auto_name("grouped_allgather", process_set)
    group = _group_id(base)
    handles = [allgather_async(a, process_set=process_set, dtype=dtypes[i] if dtypes else None,
                               _full_name=f"{base}_{i + 1}of{n}", _group=group, _group_size=n)
               for i, a in enumerate(arrays)]
    return GroupHandle(base, handles)


# -- broadcast ------------------------------------------------------------------------------------------------------

def broadcast_async(array: np.ndarray, root_rank: int, name: Optional[str] = None,
                    process_set: ProcessSet = global_process_set, output: Optional[np.ndarray] = None,
                    dtype: Optional[str] = None) -> Handle:
    """Start a broadcast from global rank ``root_rank``; the result is the root's array on every rank."""
    set_id = _set_id(process_set)
    ranks = _set_ranks(set_id)
    if root_rank not in ranks:
        raise ValueError(f"broadcast root_rank {root_rank} is not a member of the process set {list(ranks)}")
    dtype = _dtype(array, dtype)
    array, output, device, restore = _device.prepare(array, basics.engine, output)
    if output is not None:
        _check_output("broadcast", output, array.shape)
    request = Request(_name("broadcast", name, process_set), OpType.BROADCAST, dtype, tuple(array.shape),
                      root_rank=int(root_rank), device=device)
    return _device.wrap_staged(basics.engine().submit(request, array, output, set_id), restore)


def broadcast(array: np.ndarray, root_rank: int, **kwargs) -> np.ndarray:
    """:func:`broadcast_async`, waited for: ``root_rank``'s array."""
    return broadcast_async(array, root_rank, **kwargs).result()


# -- alltoall -------------------------------------------------------------------------------------------------------

def alltoall_async(array: np.ndarray, splits=None, name: Optional[str] = None,
                   process_set: ProcessSet = global_process_set, dtype: Optional[str] = None) -> Handle:
    """Start an alltoall; the result is ``(output, received_splits)``.

    Raises:
        ValueError: without ``splits`` the first dimension must divide evenly by the set size.
    """
    set_id = _set_id(process_set)
    size = len(_set_ranks(set_id))
    dtype = _dtype(array, dtype)
    array, _, device, restore = _device.prepare(array, basics.engine)
    if array.ndim == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    if splits is None:
        if array.shape[0] % size:
            raise ValueError(f"alltoall without splits needs the first dimension ({array.shape[0]}) to be "
                             f"divisible by the number of ranks ({size})")
        splits = [array.shape[0] // size] * size
    splits = tuple(int(s) for s in np.asarray(splits).reshape(-1))
    if len(splits) != size or any(s < 0 for s in splits) or sum(splits) != array.shape[0]:
        raise ValueError(f"alltoall splits {list(splits)} must hold {size} non-negative values summing to the first "
                         f"dimension {array.shape[0]}")
    request = Request(_name("alltoall", name, process_set), OpType.ALLTOALL, dtype, tuple(array.shape),
                      splits=splits, device=device)
    return _device.wrap_staged(basics.engine().submit(request, array, None, set_id), restore)


def alltoall(array: np.ndarray, splits=None, **kwargs):
    """:func:`alltoall_async`, waited for: what this rank received, and the splits it received."""
    return alltoall_async(array, splits, **kwargs).result()


# -- reducescatter --------------------------------------------------------------------------------------------------

def check_reducescatter_op(op, ndims: Sequence[int] = ()) -> None:
    """A reducescatter takes Sum or Average, and tensors of at least one dimension (``ndims``: their ranks).

    Raises:
        UnsupportedOperationError: another op (Adasum...), or a 0-d tensor; a ``RuntimeError``, as Horovod's.
    """
    if op not in (Sum, Average):
        raise UnsupportedOperationError(f"reducescatter supports only hvd.Sum and hvd.Average, not "
                                        f"{getattr(op, 'name', op)}")
    if any(n == 0 for n in ndims):
        raise UnsupportedOperationError("reducescatter cannot split a rank-zero (0-d) tensor; reshape it to (1,) "
                                        "or use allreduce")


def reducescatter_async(array: np.ndarray, name: Optional[str] = None, op: int = Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0, dtype: Optional[str] = None, *,
                        _full_name: Optional[str] = None, _group: int = -1, _group_size: int = 0) -> Handle:
    """Start a reducescatter: reduce over ranks, rank i keeps slice i of the first dimension.

    Ranks below ``dim0 % size`` receive one extra row. Only Sum and Average are supported.
    """
    check_reducescatter_op(op)
    set_id = _set_id(process_set)
    dtype = _dtype(array, dtype)
    array, _, device, restore = _device.prepare(array, basics.engine)
    if array.ndim == 0:
        array = _device.one_row(array)
    if dtype == "bool":
        raise ValueError("reducescatter does not support boolean tensors")
    request = Request(_full_name or _name("reducescatter", name, process_set), OpType.REDUCESCATTER, dtype,
                      tuple(array.shape), int(op), float(prescale_factor), float(postscale_factor), group=_group,
                      payload=(_group_size,) if _group >= 0 else None, device=device)
    return _device.wrap_staged(basics.engine().submit(request, array, None, set_id), restore)


def reducescatter(array: np.ndarray, **kwargs) -> np.ndarray:
    """:func:`reducescatter_async`, waited for: this rank's slice of the reduction."""
    return reducescatter_async(array, **kwargs).result()


def grouped_reducescatter_async(arrays: Sequence[np.ndarray], name: Optional[str] = None, op: int = Average,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0,
                                dtypes: Optional[Sequence[Optional[str]]] = None) -> GroupHandle:
    """Start one reducescatter per array, negotiated as a group (executed together); a :class:`GroupHandle`."""
    n = len(arrays)
    base = f"grouped_reducescatter.{name}" if name else _auto_name("grouped_reducescatter", process_set)
    group = _group_id(base)
    handles = [reducescatter_async(a, op=op, process_set=process_set, prescale_factor=prescale_factor,
                                   postscale_factor=postscale_factor, dtype=dtypes[i] if dtypes else None,
                                   _full_name=f"{base}_{i + 1}of{n}", _group=group, _group_size=n)
               for i, a in enumerate(arrays)]
    return GroupHandle(base, handles)


# -- synchronisation ------------------------------------------------------------------------------------------------

def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of the set reaches the barrier."""
    set_id = _set_id(process_set)
    basics.engine().submit(Request(_auto_name("barrier", process_set), OpType.BARRIER, "uint8", ()), None, None,
                           set_id).result()


def join() -> int:
    """Declare that this rank has no more data; blocks until every rank joined and returns the last one to join.

    Meanwhile this rank contributes zeros to the other ranks' allreduces.
    """
    engine = basics.engine()
    engine.mark_joined()
    return engine.submit(Request("join", OpType.JOIN, "uint8", ()), None, None, 0).result()


# -- objects --------------------------------------------------------------------------------------------------------

def broadcast_object(obj: Any, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Broadcast any cloudpicklable object from ``root_rank``; returns the root's object on every rank."""
    import cloudpickle     # (only in object collectives: its import costs every rank's start-up ~10 ms)
    name = name or type(obj).__name__
    if basics.rank() == root_rank:
        payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
        length = np.array([payload.size], dtype=np.int64)
    else:
        payload, length = None, np.zeros(1, dtype=np.int64)
    length = broadcast(length, root_rank, name=f"{name}.sz", process_set=process_set)
    if payload is None:
        payload = np.empty(int(length[0]), dtype=np.uint8)
    data = broadcast(payload, root_rank, name=f"{name}.t", process_set=process_set)
    return obj if basics.rank() == root_rank else cloudpickle.loads(data.tobytes())


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set) -> List[Any]:
    """Gather one cloudpicklable object from every rank of the set; returns them ordered by rank."""
    name = name or type(obj).__name__
    import cloudpickle
    payload = np.frombuffer(cloudpickle.dumps(obj), dtype=np.uint8)
    sizes = allgather(np.array([payload.size], dtype=np.int64), name=f"{name}.sz", process_set=process_set)
    data = allgather(payload, name=f"{name}.t", process_set=process_set)
    objects, offset = [], 0
    for size in sizes.tolist():
        objects.append(cloudpickle.loads(data[offset:offset + size].tobytes()))
        offset += size
    return objects
