"""The wire protocol: framing, size limits, schema checks, version handshake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlwatch import wire
from dlwatch.wire import FrameDecoder, WireError

# --- sample messages ------------------------------------------------------------


def window_msg(seq: int = 1, n_workers: int = 2) -> dict:
    return {
        "type": "window",
        "seq": seq,
        "t": 1700000000.25,
        "mono_ns": 123_000_000_000 + seq,
        "loaders": [
            {
                "id": 0,
                "epoch": 3,
                "batches": 1200,
                "wait_ns": 5_000_000,
                "step_ns": 9_000_000,
                "num_workers": n_workers,
                "batch_size": 32,
                "pin_memory": False,
                "persistent_workers": True,
                "prefetch_factor": 2,
                "kind": "map",
                "epoch_start_ms": [12.5, 3.25],
                "name": "trän λ 日本",
                "queue": {"ready": 1, "in_flight": 3, "capacity": 4},
                "workers": [
                    {
                        "id": i,
                        "pid": 4000 + i,
                        "batches": 600,
                        "fetch_ns": 7_000_000,
                        "busy_ns": 8_000_000,
                        "started_ns": 1_000,
                    }
                    for i in range(n_workers)
                ],
            }
        ],
        "main": {"cuda_initialized": None, "py_threads": 4},
    }


SERVER_HELLO = {
    "type": "hello",
    "protocol": wire.PROTOCOL_VERSION,
    "job": {
        "pid": 42,
        "cmdline": "python train.py --lr 3e-4",
        "rank": None,
        "torch_version": "2.13.0",
        "started": 1.5,
    },
}
CLIENT_HELLO = wire.client_hello("dlwatch test")
ERROR = {"type": "error", "message": "nope ✗"}

ALL = [SERVER_HELLO, CLIENT_HELLO, ERROR, window_msg(1), window_msg(2, n_workers=0)]


def decode_one(line: bytes, limit: int = wire.MAX_FRAME_BYTES):
    out = FrameDecoder(limit).feed(line)
    assert len(out) == 1, out
    return out[0]


def expect_error(line: bytes, *fragments: str) -> WireError:
    got = decode_one(line)
    assert isinstance(got, WireError), f"accepted {line!r} as {got!r}"
    msg = str(got)
    assert "\n" not in msg and len(msg) < 300, msg
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in {msg!r}"
    return got


# --- encode / decode ----------------------------------------------------------------


@pytest.mark.parametrize("msg", ALL, ids=lambda m: m["type"])
def test_round_trip(msg):
    data = wire.encode(msg)
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert b", " not in data and b": " not in data  # compact separators
    assert wire.validate(json.loads(data)) == msg
    assert FrameDecoder().feed(data) == [msg]


def test_encode_refuses_frames_over_the_limit():
    msg = {"type": "error", "message": "x" * 100}
    n = len(wire.encode(msg))
    assert len(wire.encode(msg, limit=n)) == n  # exactly at the limit: fine
    with pytest.raises(WireError, match=f"{n} bytes exceeds the {n - 1}-byte limit"):
        wire.encode(msg, limit=n - 1)


def test_encode_refuses_nan():
    with pytest.raises(ValueError):
        wire.encode({"type": "window", "t": float("nan")})
    with pytest.raises(ValueError):
        wire.encode({"type": "window", "t": float("inf")})


def test_several_frames_in_one_chunk_and_byte_by_byte():
    stream = b"".join(wire.encode(m) for m in ALL)
    assert FrameDecoder().feed(stream) == ALL
    dec = FrameDecoder()
    got = []
    for i in range(len(stream)):
        got += dec.feed(stream[i : i + 1])
    assert got == ALL
    assert dec.pending == 0


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_random_splits_give_the_same_messages(data):
    msgs = data.draw(st.lists(st.sampled_from(ALL), min_size=1, max_size=8))
    stream = b"".join(wire.encode(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    dec = FrameDecoder()
    got = []
    prev = 0
    for c in cuts + [len(stream)]:
        got += dec.feed(stream[prev:c])
        prev = c
    assert got == msgs
    assert dec.pending == 0


def test_partial_frame_is_held_until_its_newline():
    data = wire.encode(ERROR)
    dec = FrameDecoder()
    assert dec.feed(data[:-1]) == []
    assert dec.pending == len(data) - 1
    assert dec.feed(b"\n") == [ERROR]
    assert dec.pending == 0


# --- size limit -----------------------------------------------------------------------


def _msg_of_size(n: int) -> tuple[dict, bytes]:
    """An error message whose encoded frame (newline included) is exactly n bytes."""
    base = len(wire.encode({"type": "error", "message": ""}))
    msg = {"type": "error", "message": "m" * (n - base)}
    data = wire.encode(msg)
    assert len(data) == n
    return msg, data


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_frame_exactly_at_limit_is_accepted_one_over_is_rejected_once(chunk):
    limit = 256
    ok_msg, ok = _msg_of_size(limit)
    _, over = _msg_of_size(limit + 1)
    stream = over + ok + over + over + ok
    dec = FrameDecoder(limit)
    got = []
    for i in range(0, len(stream), chunk):
        got += dec.feed(stream[i : i + chunk])
        assert dec.pending <= limit
    kinds = ["err" if isinstance(g, WireError) else g for g in got]
    assert kinds == ["err", ok_msg, "err", "err", ok_msg]
    assert all("exceeds the 256-byte limit" in str(g) for g in got if isinstance(g, WireError))


def test_oversized_frame_reported_once_and_skipped_without_buffering():
    limit = 1024
    dec = FrameDecoder(limit)
    errors = []
    # 1 MB of one endless line, in 4 KiB chunks: one error, nothing kept.
    for _ in range(256):
        out = dec.feed(b"A" * 4096)
        errors += out
        assert dec.pending <= limit
    assert len(errors) == 1 and isinstance(errors[0], WireError)
    assert "exceeds the 1024-byte limit" in str(errors[0])
    assert dec.pending == 0
    # The rest of the bad line, its newline, then a good frame in the same chunk.
    assert dec.feed(b"tail of the bad line\n" + wire.encode(ERROR)) == [ERROR]
    assert dec.pending == 0


def test_oversized_line_in_a_single_chunk_then_good_frame():
    dec = FrameDecoder(100)
    out = dec.feed(b"{" + b'"x":1,' * 50 + b"}\n" + wire.encode(ERROR))
    assert len(out) == 2
    assert isinstance(out[0], WireError) and "exceeds" in str(out[0])
    assert out[1] == ERROR


def test_partial_buffer_that_grows_over_the_limit_is_dropped():
    dec = FrameDecoder(100)
    assert dec.feed(b"x" * 60) == []
    assert dec.pending == 60
    out = dec.feed(b"y" * 60)  # 120 > 100: reported now, buffer freed
    assert len(out) == 1 and isinstance(out[0], WireError)
    assert dec.pending == 0
    assert dec.feed(b"z" * 500) == []  # still the same bad line: no second report
    assert dec.pending == 0
    assert dec.feed(b"\n" + wire.encode(ERROR)) == [ERROR]


# --- malformed frames -------------------------------------------------------------------


def test_malformed_json():
    expect_error(b'{"type": "error", "message": \n', "malformed frame")
    expect_error(b"\x00\x01garbage\n", "malformed frame")
    expect_error(b"\n", "malformed frame")  # an empty line is not a message


def test_invalid_utf8():
    expect_error(b'{"type":"error","message":"\xff\xfe"}\n', "malformed frame", "utf-8")


@pytest.mark.parametrize("const", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_rejected(const):
    expect_error(
        b'{"type":"error","message":"m","x":' + const + b"}\n", "malformed frame", const.lstrip(b"-").decode()
    )


def test_overflowing_number_is_rejected_like_infinity():
    frame = json.dumps(window_msg()).replace("1700000000.25", "1e400").encode() + b"\n"
    got = decode_one(frame)
    assert isinstance(got, WireError), f"accepted t={got['t']!r}"


def test_deep_nesting_is_an_error_not_a_crash():
    expect_error(b"[" * 100_000 + b"\n", "malformed frame")


@pytest.mark.parametrize(
    "line,what",
    [
        (b"[1, 2]\n", "list"),
        (b'"hello"\n', "str"),
        (b"42\n", "int"),
        (b"null\n", "NoneType"),
    ],
)
def test_non_object_json(line, what):
    expect_error(line, "must be a JSON object", what)


def test_unknown_or_missing_type():
    expect_error(b'{"type":"bogus","protocol":1}\n', "unknown message type 'bogus'")
    expect_error(b'{"protocol":1}\n', "unknown message type None")
    expect_error(b'{"type":7}\n', "unknown message type 7")


def _patched(msg: dict, path: list, value=..., delete=False) -> bytes:
    m = json.loads(json.dumps(msg))
    obj = m
    for k in path[:-1]:
        obj = obj[k]
    if delete:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return json.dumps(m).encode() + b"\n"


@pytest.mark.parametrize(
    "path,value,fragment",
    [
        (["seq"], "1", "window.seq has the wrong type (str)"),
        (["seq"], True, "window.seq has the wrong type (bool)"),
        (["seq"], 1.0, "window.seq has the wrong type (float)"),
        (["t"], "now", "window.t has the wrong type (str)"),
        (["t"], False, "window.t has the wrong type (bool)"),
        (["mono_ns"], 1.5, "window.mono_ns has the wrong type (float)"),
        (["loaders"], {}, "window.loaders has the wrong type (dict)"),
        (["main"], [], "window.main has the wrong type (list)"),
        (["loaders", 0], "x", "window.loaders[0] must be a JSON object, got str"),
        (["loaders", 0, "batches"], True, "window.loaders[0].batches has the wrong type (bool)"),
        (["loaders", 0, "pin_memory"], 1, "window.loaders[0].pin_memory has the wrong type (int)"),
        (["loaders", 0, "batch_size"], "32", "window.loaders[0].batch_size has the wrong type (str)"),
        (["loaders", 0, "queue"], [], "window.loaders[0].queue has the wrong type (list)"),
        (["loaders", 0, "queue", "ready"], True, "window.loaders[0].queue.ready has the wrong type (bool)"),
        (
            ["loaders", 0, "workers", 1, "busy_ns"],
            "9",
            "window.loaders[0].workers[1].busy_ns has the wrong type (str)",
        ),
        (
            ["loaders", 0, "workers", 1, "pid"],
            False,
            "window.loaders[0].workers[1].pid has the wrong type (bool)",
        ),
    ],
)
def test_wrong_field_types(path, value, fragment):
    expect_error(_patched(window_msg(), path, value), fragment)


@pytest.mark.parametrize(
    "msg,path,fragment",
    [
        (window_msg(), ["loaders"], "window lacks required field 'loaders'"),
        (window_msg(), ["mono_ns"], "window lacks required field 'mono_ns'"),
        (window_msg(), ["loaders", 0, "queue"], "window.loaders[0] lacks required field 'queue'"),
        (
            window_msg(),
            ["loaders", 0, "workers", 1, "fetch_ns"],
            "window.loaders[0].workers[1] lacks required field 'fetch_ns'",
        ),
        (SERVER_HELLO, ["job", "cmdline"], "hello.job lacks required field 'cmdline'"),
        (CLIENT_HELLO, ["protocol"], "hello lacks required field 'protocol'"),
        (ERROR, ["message"], "error lacks required field 'message'"),
    ],
)
def test_missing_fields(msg, path, fragment):
    expect_error(_patched(msg, path, delete=True), fragment)


def test_hello_field_types():
    expect_error(_patched(CLIENT_HELLO, ["protocol"], True), "hello.protocol has the wrong type (bool)")
    expect_error(_patched(CLIENT_HELLO, ["protocol"], "1"), "hello.protocol has the wrong type (str)")
    expect_error(_patched(SERVER_HELLO, ["job"], "me"), "hello.job has the wrong type (str)")
    expect_error(_patched(SERVER_HELLO, ["job", "pid"], True), "hello.job.pid has the wrong type (bool)")
    expect_error(_patched(SERVER_HELLO, ["job", "rank"], "0"), "hello.job.rank has the wrong type (str)")


def test_optional_fields_may_be_null_and_extra_fields_are_allowed():
    m = window_msg()
    m["loaders"][0].update(batch_size=None, pin_memory=None, prefetch_factor=None)
    m["loaders"][0]["queue"] = {"ready": None, "in_flight": None, "capacity": None}
    m["future_field"] = {"anything": [1, 2]}
    m["loaders"][0]["workers"][0]["extra"] = "ok"
    assert decode_one(wire.encode(m)) == m


def test_worker_started_ns_is_type_checked():
    from dlwatch.collect.window import loader_window

    m = window_msg()
    m["loaders"][0]["workers"][0]["started_ns"] = "soon"
    got = decode_one(wire.encode(m))
    if isinstance(got, WireError):
        return
    loader_window([got], 0, 1.0)  # raises TypeError: '>' between int and str


def test_validate_returns_the_same_object_and_rejects_non_dicts():
    m = window_msg()
    assert wire.validate(m) is m
    with pytest.raises(WireError, match="must be a JSON object, got list"):
        wire.validate([m])


# --- protocol version -----------------------------------------------------------------------


def test_check_protocol():
    wire.check_protocol(CLIENT_HELLO)
    wire.check_protocol(SERVER_HELLO)
    with pytest.raises(WireError) as e:
        wire.check_protocol({"type": "hello", "protocol": wire.PROTOCOL_VERSION + 1})
    msg = str(e.value)
    assert "protocol version mismatch" in msg
    assert f"peer speaks {wire.PROTOCOL_VERSION + 1}" in msg
    assert f"this dlwatch speaks {wire.PROTOCOL_VERSION}" in msg
    assert "same dlwatch version" in msg
    with pytest.raises(WireError, match="peer speaks None"):
        wire.check_protocol({"type": "hello"})


def test_client_hello():
    h = wire.client_hello("dlwatch 9.9")
    assert h == {"type": "hello", "protocol": wire.PROTOCOL_VERSION, "client": "dlwatch 9.9"}
    assert wire.validate(h) is h


# --- fuzzing -------------------------------------------------------------------------------

_chunks = st.lists(
    st.one_of(
        st.binary(max_size=300),
        st.sampled_from(
            [
                b"\n",
                b"{",
                b"}",
                b'"',
                b"\xff",
                b"[" * 50,
                b'{"type":"window"}\n',
                b"NaN",
                b"\\u0000",
                wire.encode(ERROR),
            ]
        ),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks=_chunks, limit=st.integers(16, 512))
def test_fuzz_feed_never_raises_and_stays_bounded(chunks, limit):
    dec = FrameDecoder(limit)
    for c in chunks:
        out = dec.feed(c)
        assert dec.pending <= limit
        for m in out:
            assert isinstance(m, (dict, WireError))
            if isinstance(m, dict):
                assert wire.validate(m) is m


@settings(max_examples=200, deadline=None)
@given(chunks=_chunks)
def test_decoder_resynchronises_after_garbage(chunks):
    limit = 512
    dec = FrameDecoder(limit)
    for c in chunks:
        dec.feed(c)
    out = dec.feed(b"\n" + wire.encode(ERROR))
    assert out and out[-1] == ERROR
    assert dec.pending == 0


# --- every message has a builder and a schema ---------------------------------------------

BUILT = {
    "hello/client": wire.client_hello("dlwatch test", every=5, history_frames=0),
    "hello/server": wire.server_hello({"pid": 1, "cmdline": "python t.py"}, 3, [wire.FEATURE_PROFILE]),
    "window": wire.window(1, 1.5, 10, [], {"cuda_initialized": False, "py_threads": 3}),
    "error": wire.error("nope"),
    "profile": wire.profile_request(10, 30.0, "/tmp/x"),
    "profile_status": wire.profile_status("running", "late", steps=10, steps_done=2, loader={"id": 0}),
    "profile_result": wire.profile_result({"steps": 10}, "the job exited"),
    "worker_profile": wire.worker_profile_request(5.0, 100),
    "worker_profile_result": wire.worker_profile_result({"stacks": []}, "no worker fetched", broadcast=True),
    "stacks": wire.stacks_request(),
    "stacks_result": wire.stacks_result({"processes": []}, "the job exited", broadcast=True),
}


def test_every_message_has_a_builder_whose_output_is_valid_and_declared():
    assert set(BUILT) == set(wire.MESSAGES)
    for kind, msg in BUILT.items():
        assert wire.message_kind(msg) == kind
        assert wire.validate(msg) is msg
        assert wire.undeclared(msg) == [], kind
        # Every field the builder can set is in the schema, and vice versa.
        assert set(msg) - {"type"} == wire.MESSAGES[kind].fields, kind


def test_a_real_jobs_stream_is_fully_declared():
    """The recorded stream of a real demo job: nothing it sends is outside
    the schema (an undeclared field passes validation unchecked)."""
    path = Path(__file__).resolve().parent.parent / "data" / "recorded_stream.jsonl"
    msgs = wire.FrameDecoder().feed(path.read_bytes())
    assert msgs and not [m for m in msgs if isinstance(m, WireError)]
    assert [f for m in msgs for f in wire.undeclared(m)] == []
    assert wire.undeclared({**wire.error("x"), "colour": "red"}) == ["error.colour"]


@pytest.mark.parametrize("field, bad", [("every", "2"), ("every", True), ("history_frames", 2.0)])
def test_client_hello_fields_are_typed(field, bad):
    with pytest.raises(WireError, match=f"hello.{field} has the wrong type"):
        wire.validate({**wire.client_hello("t"), field: bad})
