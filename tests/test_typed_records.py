"""Requests and responses decode only when every field has its type and range, and a refusal names the field; records
are built by position only inside their own modules (issue 47, item 3; tier unit)."""

import pathlib
import re

import pytest

import horovod
from horovod.common import types
from horovod.common.types import OpType, ReduceOp, Request, Response
from horovod.core.decision import Decision

pytestmark = pytest.mark.unit

REQUEST = Request("allreduce.grad/w", OpType.ALLREDUCE, "float32", (3, 2), ReduceOp.AVERAGE, 0.5, 2.0, -1, None, 7,
                  (2,), "cuda:1")
ALLTOALL = Request("alltoall.x", OpType.ALLTOALL, "int64", (4,), splits=(1, 3), device="cpu+gloo:0")
ADD_SET = Request("process_set.add_process_set.1", OpType.ADD_PROCESS_SET, "uint8", (), payload=(0, 2))
RESPONSE = Response(OpType.ALLGATHER, ("a", "b"), "bfloat16", ((3,), (2, 2)), sizes=((1, 2), (3, 4)), device="cuda")
ERROR = Response(OpType.ERROR, ("c",), error="shapes differ", last_joined=3)
JOIN = Response(OpType.JOIN, ("join",), last_joined=-1)

# field -> values it must refuse (the value a user saw decode before: dtype=123, prescale='big')
WRONG_REQUEST = {
    "name": [None, b"x", 3],
    "op": [99, -1, True, "0", 0.0],
    "dtype": [123, "float128", "", None],
    "shape": [[3, 2], (3, -1), (3.0,), (True,), None],
    "reduce_op": [6, -1, False, 1.0],
    "prescale": ["big", 1, None],
    "postscale": ["big", 2, None],
    "root_rank": [-2, 1.0, None, True],
    "splits": [[1, 3], (1, -3), (1.0,), "13"],
    "group": [-2, "7", None],
    "payload": [[0, 2], (0, "2"), (1.5,), 3],
    "device": [None, 0, b"cpu"],
}
WRONG_RESPONSE = {
    "op": [10, -1, "0", True],
    "names": [["a"], ("a", 1), "a", None],
    "dtype": [123, "float128", None],
    "shapes": [[(3,)], ((3,), [2]), ((-1,),), ((1.0,),), None],
    "reduce_op": [6, "1", None],
    "prescale": ["big", 1],
    "postscale": [1, None],
    "root_rank": [-2, "0"],
    "sizes": [[(1,)], ((1, -2),), ((1,), None), "x"],
    "error": [1, b"text"],
    "last_joined": [-2, 0.5, None],
    "payload": [[1], (1, None), 2],
    "device": [None, 1],
}


def _full(record) -> list:
    """Every field on the wire, the device too (to_wire leaves a host tensor's out)."""
    wire = list(record.to_wire())
    return wire + [record.device] if len(wire) < len(type(record)._fields) else wire


def _with(record, field: str, value) -> tuple:
    wire = _full(record)
    wire[type(record)._fields.index(field)] = value
    return tuple(wire)


@pytest.mark.parametrize("record", [REQUEST, ALLTOALL, ADD_SET, Request("join", OpType.JOIN, "uint8", ())], ids=repr)
def test_every_request_round_trips(record):
    got = Request.from_wire(record.to_wire())
    assert got == record and type(got) is Request


@pytest.mark.parametrize("record", [RESPONSE, ERROR, JOIN, Response(OpType.BARRIER, ("b",))], ids=repr)
def test_every_response_round_trips(record):
    got = Response.from_wire(record.to_wire())
    assert got == record and type(got) is Response


@pytest.mark.parametrize("field, value", [(f, v) for f, vs in WRONG_REQUEST.items() for v in vs], ids=repr)
def test_a_request_with_a_wrong_field_is_refused_naming_it(field, value):
    for record in (REQUEST, ALLTOALL, ADD_SET):
        with pytest.raises(ValueError, match=rf"^malformed request: {field} is not "):
            Request.from_wire(_with(record, field, value))


@pytest.mark.parametrize("field, value", [(f, v) for f, vs in WRONG_RESPONSE.items() for v in vs], ids=repr)
def test_a_response_with_a_wrong_field_is_refused_naming_it(field, value):
    for record in (RESPONSE, ERROR, JOIN):
        with pytest.raises(ValueError, match=rf"^malformed response: {field} is not "):
            Response.from_wire(_with(record, field, value))


@pytest.mark.parametrize("decoder, size", [(Request.from_wire, 12), (Response.from_wire, 13)])
def test_what_is_not_a_tuple_of_all_fields_is_refused(decoder, size):
    for data in (None, [0] * size, (0,) * (size - 2), (0,) * (size + 1), "x" * size):
        with pytest.raises(ValueError, match=rf"not a tuple of {size} fields"):
            decoder(data)


@pytest.mark.parametrize("record", [Request("t", OpType.ALLREDUCE, "float32", (2,)),
                                    Request("t", OpType.ALLREDUCE, "float32", (2,), device="cuda:1"),
                                    Response(OpType.ALLREDUCE, ("t",), "float32", ((2,),)),
                                    Response(OpType.ALLREDUCE, ("t",), "float32", ((2,),), device="cuda")], ids=repr)
def test_a_host_record_leaves_its_device_off_the_wire_and_comes_back_on_the_cpu(record):
    wire = record.to_wire()
    assert len(wire) == len(type(record)._fields) - (record.device == "cpu")
    assert type(record).from_wire(wire) == record


@pytest.mark.parametrize("decoder, record, wrong", [(Request.from_wire, REQUEST, WRONG_REQUEST),
                                                    (Response.from_wire, RESPONSE, WRONG_RESPONSE)])
def test_the_fast_check_and_the_table_that_names_the_field_agree(decoder, record, wrong):
    """from_wire checks the common case in one expression and names a wrong field from a table: every value the
    table refuses, the expression refuses too (else from_wire would accept it), and every field's refusal names it
    rather than the table's fallback for a disagreement."""
    fields = types._REQUEST_FIELDS if type(record) is Request else types._RESPONSE_FIELDS
    assert tuple(name for name, _, _ in fields) == type(record)._fields
    for name, check, _ in fields:
        assert check(getattr(record, name) if name not in ("op", "reduce_op") else int(getattr(record, name)))
        for value in wrong[name]:
            assert not check(value), (name, value)
            with pytest.raises(ValueError, match=f": {name} is not"):
                decoder(_with(record, name, value))


def test_fast_constructors_build_the_same_records():
    assert Request.fast(tuple(REQUEST)) == REQUEST and type(Request.fast(tuple(REQUEST))) is Request
    decision = Decision.fast(([["b"]], True, (), ()))
    assert decision == Decision([["b"]], True) and decision.shutdown is True and type(decision) is Decision


RECORD_MODULES = {"common/types.py", "core/decision.py", "core/negotiation/frames.py"}


def test_records_are_built_by_position_only_in_their_own_modules():
    package = pathlib.Path(horovod.__file__).resolve().parent
    found = {str(path.relative_to(package)) for path in package.rglob("*.py") if "tuple.__new__" in path.read_text()}
    assert found <= RECORD_MODULES, f"tuple.__new__ outside the records' modules: {sorted(found - RECORD_MODULES)}"
    source = (package / "runtime" / "collectives.py").read_text()
    assert re.search(r"Request\.fast\(", source), "the per-gradient path builds its request with Request.fast"
