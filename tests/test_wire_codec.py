"""The control-frame decoder takes plain data only and fails one clear way (issue 19, item 6; tier unit)."""

import pickle

import pytest

from horovod.common import wire
from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import Request
from horovod.core.negotiation.frames import decode_body

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value", [{1, 2}, frozenset([1]), bytearray(b"x"), [1, {2}], {"a": bytearray(3)},
                                   ("p", 1.0, {0: (False, {1}, [], {})})], ids=repr)
def test_sets_and_bytearrays_are_refused(value):
    for protocol in (2, 4, 5):
        with pytest.raises(HorovodInternalError, match="plain data|names a class"):
            wire.decode(pickle.dumps(value, protocol=protocol))


def test_plain_data_decodes():
    request = Request("t", 0, "float32", (3,), 1, 1.0, 1.0, -1, None, -1, None).to_wire()
    frame = ("p", 12.5, {0: (False, [1, 2], [request], {"t": b"\x8f\x90\x96 bytes that look like opcodes"})})
    assert wire.decode(wire.encode(frame)) == frame


@pytest.mark.parametrize("message", [
    (False, [], [("t", 0, "float32", (3,), 1, "not a float", 1.0, -1, None, -1, None)], {}),
    (False, [], [("t",)], {}),
    (False, [], [None], {}),
    (False, [], [("t", 0, "float32", (-3,), 1, 1.0, 1.0, -1, None, -1, None)], {}),
], ids=["bad-field", "short", "none", "negative-shape"])
def test_malformed_requests_are_one_clear_error(message):
    with pytest.raises(HorovodInternalError, match="malformed"):
        decode_body(message)


def test_garbage_is_one_clear_error():
    for payload in (b"", b"\x80\x05garbage", pickle.dumps(object), b"\x80\x04\x95" + b"\xff" * 20):
        with pytest.raises(HorovodInternalError):
            wire.decode(payload)
