"""Plain data shared by every layer: reduce ops, op types, data types, requests and responses.

Requests and responses cross the network as tuples of primitives (see :mod:`horovod.common.wire`); the
``to_wire``/``from_wire`` pairs are the only place that knows their layout, and ``from_wire`` checks every field.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Callable, NamedTuple, Optional, Tuple

import numpy as np


_tuple_new = tuple.__new__   # builds a record from a full tuple of its fields (see Request.fast)

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

    # ``Request.fast(fields)``: the request from a full tuple of its fields in order, unchecked and without the named
    # tuple's Python-level constructor (the per-gradient path: about 0.3 µs less per call).
    fast = classmethod(_tuple_new)

    def to_wire(self) -> tuple:
        """The request as a tuple of primitives, for the control codec (:mod:`horovod.common.wire`). A host
        tensor's request leaves its device out: the common case costs no byte more than before devices existed."""
        wire = (self.name, int(self.op), self.dtype, self.shape, int(self.reduce_op), float(self.prescale),
                float(self.postscale), int(self.root_rank), self.splits, int(self.group), self.payload, self.device)
        return wire[:-1] if self.device == CPU_DEVICE else wire

    @staticmethod
    def from_wire(data) -> "Request":
        """The request from :meth:`to_wire`'s tuple, every field's type and range checked.

        Raises:
            ValueError: the tuple is malformed; the message names the first wrong field.
        """
        # One expression for the common case (rank 0 decodes every uncached request of a step); the table
        # (_REQUEST_FIELDS) names what is wrong, and tests keep the two alike.
        if type(data) is tuple and len(data) == 11:
            data += (CPU_DEVICE,)
        if type(data) is tuple and len(data) == 12:
            name, op, dtype, shape, reduce_op, prescale, postscale, root_rank, splits, group, payload, device = data
            if (type(name) is str and type(op) is int and op in _OP_TYPES and type(dtype) is str
                    and dtype in _DTYPES and type(shape) is tuple and _dims(shape) and type(reduce_op) is int
                    and reduce_op in _REDUCE_OPS and type(prescale) is float and type(postscale) is float
                    and type(root_rank) is int and root_rank >= -1 and type(group) is int and group >= -1
                    and (splits is None or (type(splits) is tuple and _dims(splits)))
                    and (payload is None or (type(payload) is tuple and _ints(payload))) and type(device) is str):
                return _tuple_new(Request, data)
        raise _refusal("request", _REQUEST_FIELDS, data)


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
        """The response as a tuple of primitives, for the control codec (:mod:`horovod.common.wire`); a host
        response leaves its device out, as a request does."""
        wire = (int(self.op), self.names, self.dtype, self.shapes, int(self.reduce_op), float(self.prescale),
                float(self.postscale), int(self.root_rank), self.sizes, self.error, int(self.last_joined),
                self.payload, self.device)
        return wire[:-1] if self.device == CPU_DEVICE else wire

    @staticmethod
    def from_wire(data) -> "Response":
        """The response from :meth:`to_wire`'s tuple, every field's type and range checked.

        Raises:
            ValueError: the tuple is malformed; the message names the first wrong field.
        """
        # As Request.from_wire: one expression for the common case, the table (_RESPONSE_FIELDS) to name what is wrong.
        if type(data) is tuple and len(data) == 12:
            data += (CPU_DEVICE,)
        if type(data) is tuple and len(data) == 13:
            op, names, dtype, shapes, reduce_op, prescale, postscale, root_rank, sizes, error, last_joined, payload, \
                device = data
            if (type(op) is int and op in _OP_TYPES and type(names) is tuple and _strs(names) and type(dtype) is str
                    and (dtype in _DTYPES or dtype == "") and type(shapes) is tuple and _shapes(shapes)
                    and type(reduce_op) is int and reduce_op in _REDUCE_OPS and type(prescale) is float
                    and type(postscale) is float and type(root_rank) is int and root_rank >= -1
                    and (sizes is None or (type(sizes) is tuple and _shapes(sizes)))
                    and (error is None or type(error) is str) and type(last_joined) is int and last_joined >= -1
                    and (payload is None or (type(payload) is tuple and _ints(payload))) and type(device) is str):
                return _tuple_new(Response, data)
        raise _refusal("response", _RESPONSE_FIELDS, data)


_OP_TYPES = frozenset(int(t) for t in OpType)
_REDUCE_OPS = frozenset(int(o) for o in ReduceOp)
_DTYPES = frozenset(DTYPE_NAMES)


def _ints(values: tuple) -> bool:
    for value in values:
        if type(value) is not int:
            return False
    return True


def _dims(values: tuple) -> bool:
    for value in values:
        if type(value) is not int or value < 0:
            return False
    return True


def _dims_tuple(value) -> bool:
    return type(value) is tuple and _dims(value)


def _shapes(values: tuple) -> bool:
    for value in values:
        if type(value) is not tuple or not _dims(value):
            return False
    return True


def _strs(values: tuple) -> bool:
    for value in values:
        if type(value) is not str:
            return False
    return True


def _member(values: frozenset) -> Callable[[object], bool]:
    return lambda value: type(value) is int and value in values


def _optional(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or check(value)


def _of_type(kind: type) -> Callable[[object], bool]:
    return lambda value: type(value) is kind


def _at_least_minus_one(value) -> bool:
    return type(value) is int and value >= -1


_Field = Tuple[str, Callable[[object], bool], str]     # (name, check, what a value must be)
_REQUEST_FIELDS: Tuple[_Field, ...] = (
    ("name", _of_type(str), "a str"),
    ("op", _member(_OP_TYPES), "an OpType value"),
    ("dtype", lambda v: type(v) is str and v in _DTYPES, f"one of {', '.join(DTYPE_NAMES)}"),
    ("shape", _dims_tuple, "a tuple of dimensions (ints >= 0)"),
    ("reduce_op", _member(_REDUCE_OPS), "a ReduceOp value"),
    ("prescale", _of_type(float), "a float"),
    ("postscale", _of_type(float), "a float"),
    ("root_rank", _at_least_minus_one, "an int >= -1"),
    ("splits", _optional(_dims_tuple), "None or a tuple of ints >= 0"),
    ("group", _at_least_minus_one, "an int >= -1"),
    ("payload", _optional(lambda v: type(v) is tuple and _ints(v)), "None or a tuple of ints"),
    ("device", _of_type(str), "a str"),
)
_RESPONSE_FIELDS: Tuple[_Field, ...] = (
    ("op", _member(_OP_TYPES), "an OpType value"),
    ("names", lambda v: type(v) is tuple and _strs(v), "a tuple of str"),
    ("dtype", lambda v: type(v) is str and (v == "" or v in _DTYPES), f"'' or one of {', '.join(DTYPE_NAMES)}"),
    ("shapes", lambda v: type(v) is tuple and _shapes(v), "a tuple of shapes (tuples of ints >= 0)"),
    ("reduce_op", _member(_REDUCE_OPS), "a ReduceOp value"),
    ("prescale", _of_type(float), "a float"),
    ("postscale", _of_type(float), "a float"),
    ("root_rank", _at_least_minus_one, "an int >= -1"),
    ("sizes", _optional(lambda v: type(v) is tuple and _shapes(v)), "None or a tuple of tuples of ints >= 0"),
    ("error", _optional(_of_type(str)), "None or a str"),
    ("last_joined", _at_least_minus_one, "an int >= -1"),
    ("payload", _optional(lambda v: type(v) is tuple and _ints(v)), "None or a tuple of ints"),
    ("device", _of_type(str), "a str"),
)


def _refusal(record: str, fields: Tuple[_Field, ...], data) -> ValueError:
    """The ValueError that says why ``data`` is not a ``record`` with these ``fields``: its first wrong field."""
    if type(data) is not tuple or len(data) != len(fields):
        return ValueError(f"malformed {record}: not a tuple of {len(fields)} fields: {data!r:.200}")
    for (name, check, what), value in zip(fields, data):
        if not check(value):
            return ValueError(f"malformed {record}: {name} is not {what}: {value!r:.80}")
    return ValueError(f"malformed {record} {data!r:.200}")     # the fast check and the table disagree (a bug)


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
