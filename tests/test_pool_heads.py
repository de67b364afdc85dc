"""``DirectPool`` reads an answer's head once per distinct bytes (``mesh._pool._textbook`` keeps
the last few): the same bytes read the same, any byte different is read again."""

from __future__ import annotations

from mesh._pool import _textbook

HEAD = (
    b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 11:25:12 GMT\r\nserver: uvicorn\r\n"
    b"content-length: 734\r\ncontent-type: application/json"
)


def test_a_head_read_again_is_the_same_and_a_changed_one_is_read_anew() -> None:
    first = _textbook(HEAD)
    assert first is not None
    assert (first.status, first.length, first.closes, first.encoding) == (200, 734, False, None)
    assert _textbook(bytes(HEAD)) == first
    closing = _textbook(HEAD + b"\r\nconnection: close")
    assert closing is not None
    assert closing.closes
    longer = _textbook(HEAD.replace(b"734", b"735"))
    assert longer is not None
    assert longer.length == 735
    assert _textbook(HEAD.replace(b"200 OK", b"101 Switching")) is None  # not textbook: h11
    assert _textbook(HEAD + b"\r\ntransfer-encoding: chunked") is None
    for n in range(40):  # more heads than are kept: each still read right
        head = _textbook(HEAD.replace(b"734", str(1000 + n).encode()))
        assert head is not None
        assert head.length == 1000 + n
    assert _textbook(HEAD) == first
