"""Every control frame the engine sends is a named record of one module, and its decoder takes nothing else
(issue 28, item 1; tier unit)."""

import ast
import pathlib

import pytest

from horovod.common.exceptions import HorovodInternalError
from horovod.common.types import OpType, Request, Response
from horovod.core.decision import Contributors, Message
from horovod.core.negotiation import frames
from horovod.core.negotiation.frames import (GO, WANT_EVERY, WANT_NEW, WANT_NOW, FRAMES, Go, Msg, Peer, Records,
                                             Reply, Up, Want, decode, decode_body, group_messages, receive)

try:
    from horovod.common import wire
except ImportError:     # the codec's older home
    from horovod.transport import wire

pytestmark = pytest.mark.unit

REQUEST = Request("grad/w", OpType.ALLREDUCE, "float32", (3, 2), prescale=0.5, group=7)
JOIN = Request("join", OpType.JOIN, "uint8", ())
RESPONSE = Response(OpType.ALLREDUCE, ("a", "b"), "float32", ((3,), (2, 2)), postscale=2.0)
ERROR = Response(OpType.ERROR, ("c",), error="shapes differ on ranks 0 and 1")
MESSAGE = Message(False, (3, 5), (REQUEST,))
SENT = Msg(False, (3, 5), (REQUEST,), {}).sent()

RECORDS = {
    "go": GO,
    "want": Want(WANT_NEW | WANT_EVERY),
    "want-now": Want(WANT_NOW),
    "msg": Msg(False, (3, 5), (REQUEST,), {"grad/w": b"\x00" * 24}),
    "msg-bare": Msg(True, (), (), {}),
    "reply": Reply(False, [[RESPONSE, 4], [ERROR]], None),
    "reply-with-data": Reply(True, [[1], [RESPONSE]], [b"abcd", None]),
    "up": Up([([1, 3, 4], SENT), ([2], Msg(False, (), (JOIN,), {}).sent())],
             [(Contributors(1), {"x": b"1234"}), (Contributors(4), {}), (Contributors(2, 5), {"y": b"56"})]),
    "peer": Peer(12.5, {0: Msg(False, (3, 5), (REQUEST,), {"t": b"\x8f\x90"}), 2: Msg(True, (), (), {})}),
    "records": Records(["10.0.0.1:5000 host-a 1 - 8", "10.0.0.2:5000 host-b 1 - 8"]),
}


@pytest.mark.parametrize("record", RECORDS.values(), ids=RECORDS.keys())
def test_every_record_round_trips_through_the_wire_codec(record):
    raw = wire.decode(wire.encode(record.encode()))
    assert raw[0] == record.KIND and len(raw) == record.ARITY + 1
    got = decode(raw, 1)
    assert type(got) is type(record) and got == record
    assert decode(raw, 1, type(record)) == record


def test_the_table_lists_every_kind_once():
    kinds = [cls.KIND for cls in FRAMES]
    assert len(set(kinds)) == len(kinds) == 7
    assert {type(r) for r in RECORDS.values()} == set(FRAMES)
    for cls in FRAMES:
        assert f"``{cls.KIND}``" in frames.__doc__      # the module's docstring describes every frame


@pytest.mark.parametrize("raw, shown", [
    (("hello", 1), "'hello'"),
    (("p", 1.0, {}), "'p'"),                    # an old peer frame
    ((7,), "7"),
    ((["go"],), "['go']"),
    ((), "None"),
    (["go"], "None"),
    ({"kind": "go"}, "None"),
    (None, "None"),
    ((False, [], []), "False"),                 # an old untagged message
])
def test_an_unknown_kind_is_refused_naming_it_and_the_sender(raw, shown):
    with pytest.raises(HorovodInternalError, match=r"unknown kind .*from rank 5") as info:
        decode(raw, 5)
    assert shown in str(info.value)


@pytest.mark.parametrize("record", RECORDS.values(), ids=RECORDS.keys())
def test_a_wrong_number_of_fields_is_refused(record):
    raw = record.encode()
    for wrong in (raw[:-1] if len(raw) > 1 else None, raw + (None,)):
        if wrong is None:
            continue
        with pytest.raises(HorovodInternalError, match=rf"malformed '{record.KIND}' frame from rank 2: \d+ fields"):
            decode(wrong, 2)


BAD = {
    "want": [("want", 0), ("want", 8), ("want", True), ("want", "2"), ("want", 1.0)],
    "msg": [("msg", 0, [], [], {}), ("msg", False, [1.5], [], {}), ("msg", False, [], [("t",)], {}),
            ("msg", False, [], None, {}), ("msg", False, [], [], {"t": "text"}), ("msg", False, [], [], {1: b""}),
            ("msg", False, [], [], None), ("msg", False, [True], [], {})],
    "reply": [("reply", 1, [], None), ("reply", False, [1], None), ("reply", False, [["x"]], None),
              ("reply", False, [[1]], [None, None]), ("reply", False, [[1]], [[b"a"]]), ("reply", False, [[1]], ["ab"]),
              ("reply", False, [[(0,)]], None), ("reply", False, ([1],), None)],
    "up": [("up", [([1], (False, [], []), 3)], []), ("up", [([1], (False, [], []))], {}),
           ("up", [([1.0], (False, [], []))], []), ("up", [([1], [False, [], []])], []),
           ("up", [([1], (False, [], [], {}))], []), ("up", [], [(1,)]), ("up", [], [("1", {})]),
           ("up", [], [((1, 1), {"t": 3})]), ("up", (), []),
           ("up", [], [(1, {})]), ("up", [], [((1,), {})]), ("up", [], [((1, 1, 1), {})]), ("up", [], [((-1, 1), {})]),
           ("up", [], [((1, 0), {})]), ("up", [], [((1, True), {})]), ("up", [], [((1.0, 1), {})])],
    "peer": [("peer", 1, {}), ("peer", 1.0, []), ("peer", 1.0, {"0": (False, (), [], {})}),
             ("peer", 1.0, {0: (False, (), [])}), ("peer", 1.0, {0: [False, (), [], {}]}),
             ("peer", 1.0, {0: (False, (), [("t",)], {})})],
    "records": [("records", ("a",)), ("records", ["a", b"b"]), ("records", None)],
}


@pytest.mark.parametrize("raw", [raw for raws in BAD.values() for raw in raws], ids=repr)
def test_a_field_of_the_wrong_type_is_refused(raw):
    with pytest.raises(HorovodInternalError, match=rf"malformed '{raw[0]}' frame from rank 3"):
        decode(raw, 3)


def test_contributions_are_keyed_by_one_record_and_travel_as_plain_pairs():
    # One key type, a member's own data or a relay's folded subtree, told apart by its count, not by its type.
    raw = wire.decode(wire.encode(RECORDS["up"].encode()))
    assert [key for key, _ in raw[2]] == [(1, 1), (4, 1), (2, 5)]
    keys = [key for key, _ in decode(raw, 1).datas]
    assert all(type(key) is Contributors for key in keys) and [key.folded for key in keys] == [False, False, True]


@pytest.mark.parametrize("key, field", [((1, 0), "count >= 1"), ((-1, 1), "first rank >= 0"), (3, "not a list")])
def test_a_wrong_contributors_key_is_refused_naming_it(key, field):
    with pytest.raises(HorovodInternalError, match=rf"malformed 'up' frame from rank 3: .*contributors.*{field}"):
        decode(("up", [], [(key, {})]), 3)


@pytest.mark.parametrize("field, value", [("dtype", 123), ("prescale", "big"), ("names", ("a", 1)),
                                          ("device", None), ("last_joined", -2)])
def test_a_reply_with_a_wrong_response_field_is_refused_naming_the_field(field, value):
    wrong = list(RESPONSE.to_wire()) + ([RESPONSE.device] if RESPONSE.device == "cpu" else [])
    wrong[Response._fields.index(field)] = value
    with pytest.raises(HorovodInternalError, match=rf"malformed 'reply' frame from rank 4: malformed response: "
                                                   rf"{field} is not"):
        decode(("reply", False, [[tuple(wrong)]], None), 4)


def test_a_kind_not_expected_here_is_refused_naming_both():
    with pytest.raises(HorovodInternalError, match=r"expected a 'go' or 'reply' frame from rank 0, got a 'want'"):
        decode(Want(WANT_NOW).encode(), 0, Go, Reply)
    # The kind is judged before the fields: a peer frame at a star's rank 0 says so, not "malformed".
    with pytest.raises(HorovodInternalError, match=r"expected a 'msg' or 'want' frame .* got a 'peer'.*NEGOTIATION"):
        decode(("peer", "not a clock", None), 4, Msg, Want)


def test_receive_names_the_receiving_rank():
    class _Transport:
        rank = 6

        def recv_obj(self, peer):
            assert peer == 2
            return ("up", [], [])

    assert receive(_Transport(), 2, Up) == Up([], [])
    with pytest.raises(HorovodInternalError, match="rank 6 expected a 'go' frame from rank 2, got a 'up'"):
        receive(_Transport(), 2, Go)


def test_a_message_body_decodes_alone_and_refuses_what_is_not_one():
    body = RECORDS["msg"].body()
    assert decode_body(wire.decode(wire.encode(body))) == RECORDS["msg"]
    for bad in (body[:3], list(body), None, (False, (), [], {}, None)):
        with pytest.raises(HorovodInternalError, match="malformed negotiation message"):
            decode_body(bad)


def test_equal_messages_compare_equal_as_sent_and_decode_equal():
    # The tree lists ranks that sent the very same message together, comparing them as sent; rank 0 decodes them.
    up = decode(wire.decode(wire.encode(Up([([1, 2], SENT)], []).encode())), 1)
    assert up.groups[0][1] == Msg(False, (3, 5), (REQUEST,), {"t": b"data travels apart"}).sent()
    assert group_messages(up.groups) == [([1, 2], MESSAGE)]
    assert decode(Msg(False, (3, 5), (REQUEST,), {}).encode(), 2).message == MESSAGE


@pytest.mark.parametrize("requests", [[("t",)], [None], [REQUEST.to_wire()[:-2] + ("payload", "cpu")]], ids=repr)
def test_a_groups_requests_are_checked_in_full_where_they_are_decoded(requests):
    up = decode(("up", [([3, 9], (False, (), requests))], []), 1)     # passed on by the ranks in between
    with pytest.raises(HorovodInternalError, match=r"malformed negotiation message from ranks \[3, 9\]"):
        group_messages(up.groups)


def _calls(tree: ast.AST, method: str):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method:
            yield node


def test_the_engine_sends_and_reads_control_frames_only_through_the_records():
    core = pathlib.Path(frames.__file__).resolve().parents[1]
    for path in sorted(core.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for call in _calls(tree, "recv_obj"):
            assert path.name == "frames.py", f"{path}:{call.lineno} reads a control frame outside frames.py"
        for call in _calls(tree, "send_obj"):
            sent = call.args[1]
            encoded = isinstance(sent, ast.Call) and isinstance(sent.func, ast.Attribute) \
                and sent.func.attr == "encode"
            assert encoded or isinstance(sent, ast.Name), \
                f"{path}:{call.lineno} sends a control frame not built by horovod.core.negotiation.frames"
