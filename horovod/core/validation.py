"""Validation: whether every rank's request for one ready tensor name agrees, and the response they all execute.

Pure functions over plain data, for the coordinator (:mod:`horovod.core.coordinator`): dtype, shape, op, scales,
root and process set must agree; a mismatch is an ERROR response that names the tensor, the field and what each
rank sent, failing the op on every rank while the job goes on.
"""

from __future__ import annotations

from typing import Collection, Dict, Optional, Sequence

from horovod.common.types import OP_NAMES, OpType, ReduceOp, Request, Response, device_kind

__all__ = ["respond", "error"]

_JOIN_UNSUPPORTED = (OpType.ALLGATHER, OpType.BROADCAST, OpType.ALLTOALL, OpType.REDUCESCATTER)


def _scale(value: float):
    """A scale factor as compared between ranks: NaN equals NaN (every rank asked for the same thing)."""
    return "nan" if value != value else value


def _reduce_op_name(value: int):
    return ReduceOp(value).name if value in ReduceOp._value2member_map_ else value


def error(name: str, text: str) -> Response:
    """An ERROR response failing tensor ``name`` with ``text`` on every rank."""
    return Response(OpType.ERROR, (name,), error=text)


def _mismatch(name: str, op: int, field: str, got: Dict[int, Request], ranks: Sequence[int],
              value) -> Optional[Response]:
    values = {i: value(r) for i, r in got.items()}
    if len(set(values.values())) <= 1:
        return None
    listing = ", ".join(f"rank {ranks[i]}: {values[i]}" for i in sorted(values))
    return error(name, f"Mismatched {OP_NAMES.get(op, op)} {field} for tensor '{name}': {listing}. "
                       f"Every rank must submit the same {field} for a tensor name.")


def _device_mismatch(name: str, op: int, got: Dict[int, Request], ranks: Sequence[int]) -> Optional[Response]:
    """CPU against GPU fails, as Horovod's "Mismatched CPU/GPU device selection"; the listing names each rank's
    device, indices included (ranks rightly use different GPUs, so only the kind must agree)."""
    if len({device_kind(r.device) for r in got.values()}) <= 1:
        return None
    listing = ", ".join(f"rank {ranks[i]}: {got[i].device}" for i in sorted(got))
    return error(name, f"Mismatched {OP_NAMES.get(op, op)} CPU/GPU device selection for tensor '{name}': {listing}. "
                       f"Every rank must submit the tensor on the same kind of device.")


def _checks(op: int) -> list:
    """(field, how to read it) of every field that must agree for ``op``."""
    checks = [("operation", lambda r: OP_NAMES.get(r.op, r.op)), ("data type", lambda r: r.dtype)]
    if op in (OpType.ALLREDUCE, OpType.BROADCAST, OpType.REDUCESCATTER):
        checks.append(("shape", lambda r: r.shape))
    if op in (OpType.ALLGATHER, OpType.ALLTOALL):
        checks.append(("rank (number of dimensions)", lambda r: len(r.shape)))
        checks.append(("trailing dimensions", lambda r: r.shape[1:]))
    if op in (OpType.ALLREDUCE, OpType.REDUCESCATTER):
        checks.append(("reduce op", lambda r: _reduce_op_name(r.reduce_op)))
        checks.append(("prescale factor", lambda r: _scale(r.prescale)))
        checks.append(("postscale factor", lambda r: _scale(r.postscale)))
    if op == OpType.BROADCAST:
        checks.append(("root rank", lambda r: r.root_rank))
    if op in (OpType.ADD_PROCESS_SET, OpType.REMOVE_PROCESS_SET):
        checks.append(("process set", lambda r: r.payload))
    return checks


def respond(name: str, got: Dict[int, Request], ranks: Sequence[int], joined: Collection[int]) -> Response:
    """The response to ``name``, submitted by the members at the positions ``got`` holds (the others of ``ranks``
    have joined: ``joined`` holds their positions), or the ERROR response that says what disagrees."""
    first = got[min(got)]
    op = first.op
    for field, value in _checks(op):
        failed = _mismatch(name, op, field, got, ranks, value)
        if failed is not None:
            return failed
    failed = _device_mismatch(name, op, got, ranks)
    if failed is not None:
        return failed
    device = device_kind(first.device)
    absent = [ranks[i] for i in joined if i not in got]
    if absent and op in _JOIN_UNSUPPORTED:
        return error(name, f"{OP_NAMES[op]} is not supported with Join at this time (tensor '{name}'; "
                           f"ranks {absent} have joined)")
    size = len(ranks)
    if op == OpType.ALLGATHER:
        dims = tuple(got[i].shape[0] if i in got else 0 for i in range(size))
        return Response(op, (name,), first.dtype, (first.shape,), sizes=(dims,), device=device)
    if op == OpType.ALLTOALL:
        matrix = []
        for i in range(size):
            splits = got[i].splits
            if splits is None or len(splits) != size or sum(splits) != got[i].shape[0] or any(s < 0 for s in splits):
                return error(name, f"ALLTOALL splits of rank {ranks[i]} for tensor '{name}' are {splits}: need "
                                   f"{size} non-negative values summing to the first dimension {got[i].shape[0]}")
            matrix.append(tuple(splits))
        return Response(op, (name,), first.dtype, (first.shape,), sizes=tuple(matrix), device=device)
    return Response(op, (name,), first.dtype, (first.shape,), first.reduce_op, first.prescale, first.postscale,
                    first.root_rank, payload=first.payload, device=device)
