"""Plain data shared by every layer: reduce ops, op types, data types, requests and responses.

Requests and responses cross the network as tuples of primitives (see :mod:`horovod.common.wire`); the
``to_wire``/``from_wire`` pairs are the only place that knows their layout, and ``from_wire`` checks every field.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import NamedTuple, Optional, Tuple

import numpy as np


CPU_DEVICE = "cpu"   # a request's device when its tensor is in host memory (Horovod's CPU_DEVICE_ID)


def device_kind(device: str) -> str:
    """The kind of a device name, what every rank of a collective must agree on: ``"cuda:1"`` → ``"cuda"`` (ranks
    use different device indices, as each rank drives its own GPU)."""
    return device.split(":", 1)[0]


class ReduceOp(enum.IntEnum):
    """Horovod's op constants (``hvd.Average`` ... ``hvd.Product``), same values."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


class OpType(enum.IntEnum):
    """The kind of a collective request: which operation the engine runs for it."""

    ALLREDUCE = 0
    ALLGATHER = 1
    BROADCAST = 2
    ALLTOALL = 3
    REDUCESCATTER = 4
    BARRIER = 5
    JOIN = 6
    ADD_PROCESS_SET = 7
    REMOVE_PROCESS_SET = 8
    ERROR = 9


# Horovod's timeline and messages name ops in capitals.
OP_NAMES = {t: t.name for t in OpType}

# numpy has no bfloat16: it travels as 2-byte words and is widened to float32 to reduce.
_NUMPY_DTYPES = {
    "uint8": np.dtype(np.uint8), "int8": np.dtype(np.int8), "uint16": np.dtype(np.uint16),
    "int16": np.dtype(np.int16), "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
    "float16": np.dtype(np.float16), "bfloat16": np.dtype(np.uint16), "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64), "bool": np.dtype(np.bool_),
}
DTYPE_NAMES = tuple(_NUMPY_DTYPES)


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype that carries a Horovod data type (``bfloat16`` → ``uint16`` words)."""
    try:
        return _NUMPY_DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unsupported data type {dtype!r}; supported: {', '.join(DTYPE_NAMES)}") from None


_NAMES_BY_DTYPE = {dtype: name for name, dtype in _NUMPY_DTYPES.items() if name != "bfloat16"}


def dtype_name(array: np.ndarray) -> str:
    """The Horovod data type of a numpy array (never ``bfloat16``: bindings say so explicitly)."""
    try:
        return _NAMES_BY_DTYPE[array.dtype]
    except KeyError:
        raise ValueError(f"unsupported data type {array.dtype}; supported: {', '.join(DTYPE_NAMES)}") from None


class Request(NamedTuple):
    """What one rank asks for: one named tensor and the parameters every rank must agree on."""

    name: str
    op: int                      # OpType
    dtype: str
    shape: Tuple[int, ...]
    reduce_op: int = ReduceOp.SUM
    prescale: float = 1.0
    postscale: float = 1.0
    root_rank: int = -1          # broadcast root, as a rank of the process set
    splits: Optional[Tuple[int, ...]] = None   # alltoall rows sent to each rank
    group: int = -1              # grouped ops and optimizer groups stay fused together
    payload: Optional[Tuple[int, ...]] = None  # process-set ranks for ADD/REMOVE
    device: str = CPU_DEVICE                   # where the tensor lives: "cpu", or an accelerator ("cuda:1")

    def to_wire(self) -> tuple:
        """The request as a tuple of primitives, for the control codec (:mod:`horovod.common.wire`)."""
        return (self.name, int(self.op), self.dtype, self.shape, int(self.reduce_op), float(self.prescale),
                float(self.postscale), int(self.root_rank), self.splits, int(self.group), self.payload, self.device)

    @staticmethod
    def from_wire(data) -> "Request":
        """The request from :meth:`to_wire`'s tuple, every field checked (ValueError when malformed)."""
        if not isinstance(data, tuple) or len(data) != len(Request._fields):
            raise ValueError("malformed request")
        r = Request(*data)
        if not (isinstance(r.name, str) and isinstance(r.op, int) and isinstance(r.dtype, str)
                and isinstance(r.shape, tuple) and all(isinstance(d, int) and d >= 0 for d in r.shape)
                and isinstance(r.reduce_op, int) and isinstance(r.prescale, float)
                and isinstance(r.postscale, float) and isinstance(r.root_rank, int) and isinstance(r.group, int)
                and (r.splits is None or (isinstance(r.splits, tuple) and all(isinstance(s, int) for s in r.splits)))
                and (r.payload is None or isinstance(r.payload, tuple)) and isinstance(r.device, str)):
            raise ValueError(f"malformed request {data!r:.200}")
        return r


class Response(NamedTuple):
    """What the coordinator tells every rank of a set to execute, in this order.

    ``names`` has more than one entry when tensors are fused. ``sizes`` carries per-rank first dimensions for
    allgather (one tuple per tensor) and the full splits matrix for alltoall (row = sender). ``error`` is set on
    ERROR responses, which fail the named tensors on every rank.
    """

    op: int
    names: Tuple[str, ...]
    dtype: str = ""
    shapes: Tuple[Tuple[int, ...], ...] = ()
    reduce_op: int = ReduceOp.SUM
    prescale: float = 1.0
    postscale: float = 1.0
    root_rank: int = -1
    sizes: Optional[Tuple[Tuple[int, ...], ...]] = None
    error: Optional[str] = None
    last_joined: int = -1
    payload: Optional[Tuple[int, ...]] = None
    device: str = CPU_DEVICE     # the kind of device every rank's tensors live on ("cpu", "cuda"): which data plane

    def to_wire(self) -> tuple:
        """The response as a tuple of primitives, for the control codec (:mod:`horovod.common.wire`)."""
        return (int(self.op), self.names, self.dtype, self.shapes, int(self.reduce_op), float(self.prescale),
                float(self.postscale), int(self.root_rank), self.sizes, self.error, int(self.last_joined),
                self.payload, self.device)

    @staticmethod
    def from_wire(data) -> "Response":
        """The response from :meth:`to_wire`'s tuple, every field checked (ValueError when malformed)."""
        if not isinstance(data, tuple) or len(data) != len(Response._fields):
            raise ValueError("malformed response")
        r = Response(*data)
        if not (isinstance(r.op, int) and isinstance(r.names, tuple) and all(isinstance(n, str) for n in r.names)
                and isinstance(r.shapes, tuple) and (r.error is None or isinstance(r.error, str))
                and isinstance(r.device, str)):
            raise ValueError(f"malformed response {data!r:.200}")
        return r


def nbytes(dtype: str, shape: Tuple[int, ...]) -> int:
    """Bytes of a tensor of ``dtype`` (a dtype name) and ``shape``."""
    n = numpy_dtype(dtype).itemsize
    for d in shape:
        n *= d
    return n


@dataclasses.dataclass(frozen=True)
class Topology:
    """A worker's place in the job (rank, host, rendezvous), as its launcher or the rendezvous decided it."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    hostname: str
    rendezvous_addr: Optional[str] = None
    rendezvous_port: int = -1
    secret: Optional[bytes] = None
    scope: str = "job"
    # The mesh generation, where the launcher decides it (an elastic round); None: a process-local counter.
    generation: Optional[int] = None
