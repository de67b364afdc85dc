"""``mesh._pool._textbook`` reads a head not kept yet as the one without its Date line when that
line is a field ``_read_head`` accepts (``_undated``): every head reads to what ``_read_head``
makes of the whole head, whatever its Date line holds, wherever it is, and however many heads
came before."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mesh import _pool
from mesh._pool import _read_head, _textbook, _undated

STATUS = b"HTTP/1.1 200 OK"
FIELDS = [
    b"server: uvicorn",
    b"content-length: 734",
    b"content-type: application/json",
]
DATE = b"date: Thu, 03 Dec 2026 05:40:00 GMT"

# Lines a head may hold: the usual ones, the ones that change the verdict, and odd ones.
LINES = st.sampled_from(
    [
        *FIELDS,
        DATE,
        b"Date: Thu, 03 Dec 2026 05:40:01 GMT",
        b"date:",
        b"date:   ",
        b"date: \t x \t",
        b"date: caf\xc3\xa9",
        b"date: a\x00b",
        b"date: a\x7fb",
        b"date: a\rb",
        b"date: a\nb",
        b"date : x",
        b"Date : x",
        b"dates: x",
        b"Dates: x",
        b"date\tx: y",
        b"DATE: x",
        b"content-length: 735",
        b"content-length: 12a",
        b"connection: close",
        b"connection: keep-alive",
        b"content-encoding: gzip",
        b"content-encoding: identity",
        b"transfer-encoding: chunked",
        b"x-odd: \x01",
        b"",
        b"no colon",
    ]
)
DATE_VALUES = st.binary(max_size=40) | st.text(
    alphabet=st.characters(min_codepoint=0, max_codepoint=0x2FF), max_size=40
).map(lambda t: t.encode("utf-8", "surrogatepass"))


def _head(status: bytes, lines: list[bytes]) -> bytes:
    return b"\r\n".join([status, *lines])


@settings(max_examples=400, deadline=None)
@given(
    status=st.sampled_from([STATUS, b"HTTP/1.1 404 Not Found", b"HTTP/1.1 101 Switching", b"x"]),
    lines=st.lists(LINES, max_size=7),
    value=DATE_VALUES,
    where=st.integers(min_value=0, max_value=7),
    name=st.sampled_from([b"date:", b"Date:", b"date: ", b"Date:\t"]),
)
def test_any_head_reads_as_read_head_reads_it(
    status: bytes, lines: list[bytes], value: bytes, where: int, name: bytes
) -> None:
    lines = list(lines)
    lines.insert(min(where, len(lines)), name + value)
    head = _head(status, lines)
    expected = _read_head(head)
    assert _textbook(head) == expected
    assert _textbook(head) == expected  # kept: the same again
    undated = _undated(head)
    if undated is not None:
        assert _read_head(undated) == expected


@settings(max_examples=200, deadline=None)
@given(value=DATE_VALUES, lines=st.lists(LINES, max_size=5))
def test_a_head_whose_date_changed_reads_as_its_own_bytes(value: bytes, lines: list[bytes]) -> None:
    # The same head an earlier Date made kept (undated): this one is still read by its own
    # Date line's bytes.
    first = _head(STATUS, [DATE, *FIELDS, *lines])
    assert _textbook(first) == _read_head(first)
    again = _head(STATUS, [b"date: " + value, *FIELDS, *lines])
    assert _textbook(again) == _read_head(again)


def test_the_date_line_found_and_cut() -> None:
    head = _head(STATUS, [DATE, *FIELDS])
    assert _undated(head) == _head(STATUS, FIELDS)
    assert _undated(_head(STATUS, [*FIELDS, DATE])) == _head(STATUS, FIELDS)
    assert _undated(_head(STATUS, [*FIELDS, b"Date: x"])) == _head(STATUS, FIELDS)
    assert _undated(_head(STATUS, FIELDS)) is None  # no Date line
    assert _undated(_head(STATUS, [b"date: a\x00b", *FIELDS])) is None  # refused by _FIELD
    assert _read_head(_head(STATUS, [b"date: a\x00b", *FIELDS])) is None
    for odd in (b"Date : x", b"date : x", b"Dates: x", b"dates: x", b"date", b"Date"):
        # Not a Date field (refused, or another name): not cut, read as it is.
        assert _undated(_head(STATUS, [odd, *FIELDS])) is None
        assert _textbook(_head(STATUS, [odd, *FIELDS])) == _read_head(_head(STATUS, [odd, *FIELDS]))


def test_a_new_date_each_time_is_read_right_past_what_is_kept() -> None:
    # A new Date per call (calls a second or more apart): each read right, past both bounds.
    for n in range(60):
        for length in (734, 900 + n):
            head = _head(
                STATUS,
                [
                    b"date: Thu, 03 Dec 2026 05:%02d:%02d GMT" % divmod(n, 60),
                    b"server: uvicorn",
                    b"content-length: %d" % length,
                    b"content-type: application/json",
                ],
            )
            found = _textbook(head)
            assert found is not None
            assert (found.status, found.length, found.closes, found.encoding) == (
                200,
                length,
                False,
                None,
            )
    assert len(_pool._HEADS_READ) <= _pool._HEADS_READ_KEPT
    assert len(_pool._UNDATED_READ) <= _pool._UNDATED_READ_KEPT
