"""The input limits of SPEC section 3.5, through the library's doors (awl.documents.limits)."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from awl import BadRequest, DocumentError
from awl.documents.checks import iter_order_findings, load_document, to_plain
from awl.documents.limits import (
    INT64_MAX,
    MAX_EPOCH,
    MIN_EPOCH,
    check_epoch,
    check_integer,
    check_json_value,
    check_text,
    loads,
    read_regular_file,
)
from awl.documents.models import format_epoch, format_time, parse_time, stored_time
from tests.awl.test_checks import make_order


@pytest.mark.spec("DOC-11", "DOC-12")
@pytest.mark.parametrize(("text", "says"), [
    ("1e400", "too large to hold"),
    ("-1e400", "too large to hold"),
    ('{"a": [1, 2e999]}', "too large to hold"),
    ("NaN", "not a JSON number"),
    ("[Infinity]", "not a JSON number"),
    ("1" * 4001, "4001 digits"),
    ('{"a": 1, "a": 2}', "duplicate key"),
    ("[" * 65 + "]" * 65, "nests deeper than 64"),
    ("[" * 5000 + "]" * 5000, "nests deeper than 64"),
    ('"\\ud800"', "lone surrogate"),
    ('{"\\udfff": 1}', "lone surrogate"),
    ("{", "not valid JSON"),
])
def test_loads_refuses_what_cannot_be_held(text: str, says: str) -> None:
    with pytest.raises(DocumentError, match=says) as caught:
        loads(text, where="the arguments")
    assert caught.value.message.startswith("the arguments")
    assert "\n" not in caught.value.message


@pytest.mark.spec("DOC-12")
def test_numbers_within_the_limits_are_held_exactly() -> None:
    big = int("9" * 4000)
    assert loads(str(big)) == big
    assert loads("1.7976931348623157e308") == 1.7976931348623157e308
    assert loads("1e-400") == 0.0  # underflow is a faithful rounding, not a refusal


@pytest.mark.spec("DOC-11", "DOC-12", "DOC-13")
@pytest.mark.parametrize("value", [
    float("nan"), float("inf"), {"a": [float("-inf")]}, 10 ** 4001, "x\ud800", {"\udc00": 1},
    b"bytes", {1: "x"}, object(),
])
def test_check_json_value_refuses_what_json_cannot_hold(value: Any) -> None:
    with pytest.raises(DocumentError, match=r"^the frame is not valid JSON data"):
        check_json_value(value, where="the frame")


@pytest.mark.spec("DOC-11")
def test_check_json_value_refuses_deep_and_large_data() -> None:
    deep: Any = []
    for _ in range(70):
        deep = [deep]
    with pytest.raises(DocumentError, match="nests deeper than 64"):
        check_json_value(deep, where="x")
    with pytest.raises(DocumentError, match="larger than 8 MiB"):
        check_json_value(["a" * 1024 * 1024] * 9, where="x")
    assert check_json_value(({"a": (1, 2.5, None, True)},)) == [{"a": [1, 2.5, None, True]}]


@pytest.mark.spec("DOC-12")
def test_integer_arguments_stay_within_64_bits_and_accept_whole_floats() -> None:
    assert check_integer(2.0, name="limit") == 2
    assert check_integer(INT64_MAX, name="offset") == INT64_MAX
    for bad in (2**63, 2**64, 10**5000, -1, 1.5, float("nan"), float("inf"), 1e300, True, "3",
                None):
        with pytest.raises(BadRequest, match=r"^offset must be a whole number from 0 to "
                                             r"9223372036854775807, not "):
            check_integer(bad, name="offset")
    with pytest.raises(BadRequest, match="about 5001 digits"):
        check_integer(10**5000, name="offset")
    with pytest.raises(BadRequest, match="from 1 to 5"):
        check_integer(6, name="attempt", minimum=1, maximum=5)


@pytest.mark.spec("DOC-13")
def test_text_must_be_valid_unicode() -> None:
    assert check_text("ünïcode ✓", name="--worker") == "ünïcode ✓"
    # A non-UTF-8 command-line byte reaches Python as a lone surrogate (surrogateescape).
    arg = os.fsdecode(b"\xff")
    with pytest.raises(BadRequest, match=r"^--worker is not valid UTF-8 text"):
        check_text(arg, name="--worker")
    assert to_plain({"a": "ok"}) == {"a": "ok"}
    with pytest.raises(DocumentError, match="lone surrogate"):
        to_plain({"a": arg})


@pytest.mark.spec("DOC-14")
@pytest.mark.parametrize("text", [
    "9999-12-31T23:59:59-01:00", "0001-01-01T00:30:00+01:00", "2026-02-30T00:00:00Z",
])
def test_dates_outside_years_1_to_9999_in_utc_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"years 1 to 9999|does not exist|exists"):
        parse_time(text)


def test_times_are_written_in_utc_to_the_millisecond_and_read_back() -> None:
    """format_time writes what parse_time reads: UTC, milliseconds, ``Z``; a pass's epoch
    times are shown to the second, a fraction cut off rather than rounded up."""
    moment = datetime(2027, 1, 15, 10, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    assert format_time(moment) == "2027-01-15T08:00:00.123Z"
    assert parse_time(format_time(moment)) == moment.replace(microsecond=123000)
    assert format_epoch(1800000000) == "2027-01-15T08:00:00Z"
    assert format_epoch(1800000000.999) == "2027-01-15T08:00:00Z"


def test_a_utc_time_is_written_alike_whether_its_second_was_written_before() -> None:
    """format_time keeps the text of the last second it wrote; each moment still comes out
    as isoformat writes it, across seconds, minutes, years and back again."""
    starts = [datetime(1970, 1, 1, tzinfo=UTC), datetime(2026, 12, 31, 23, 59, 58, tzinfo=UTC),
              datetime(9999, 12, 31, 23, 59, 50, tzinfo=UTC),
              datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC)]
    steps = [timedelta(0), timedelta(microseconds=999), timedelta(milliseconds=999),
             timedelta(microseconds=999_999), timedelta(seconds=1), timedelta(seconds=-1)]
    for start in starts:
        for step in steps:
            for moment in (start, start + step, start, start + step * 2):
                expected = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
                assert format_time(moment) == expected
                other = moment.astimezone(timezone(timedelta(hours=-5)))
                assert format_time(other) == expected


@pytest.mark.parametrize("text", [
    "2027-01-15T08:00:00.123Z", "2027-01-15t08:00:00z", "2027-01-15T10:00:00+02:00",
    "2027-01-15T08:00:00.1234567Z", "0001-01-01T00:30:00+00:30", "2027-01-15T08:00:00-00:00",
])
def test_a_stored_time_is_the_instant_parse_time_reads(text: str) -> None:
    """stored_time, the quick read of a checked timestamp, gives what parse_time gives, also
    for the spellings its quicker parse refuses (lowercase letters, seven digits)."""
    assert stored_time(text) == parse_time(text)
    assert stored_time(text).utcoffset() == parse_time(text).utcoffset()


@pytest.mark.spec("DOC-14", "O1")
def test_an_order_whose_deadline_is_the_year_10000_in_utc_has_a_schema_finding() -> None:
    found = list(iter_order_findings(make_order(deadline="9999-12-31T23:59:59-01:00")))
    assert [(f.rule, f.path) for f in found] == [("O1", "/deadline")]
    assert "9999" in found[0].message
    assert list(iter_order_findings(make_order(deadline="9999-12-31T23:59:59+01:00"))) == []


@pytest.mark.spec("DOC-14")
def test_epoch_times_stay_within_the_same_years() -> None:
    assert check_epoch(MAX_EPOCH, name="exp") == MAX_EPOCH
    assert check_epoch(MIN_EPOCH, name="nbf") == MIN_EPOCH
    for bad in (MAX_EPOCH + 1, MIN_EPOCH - 1, 1e20, -1e20, float("nan"), True, "5", 10**5000):
        with pytest.raises(BadRequest, match=r"^exp must be seconds since the epoch"):
            check_epoch(bad, name="exp")


@pytest.mark.spec("DOC-17", "DOC-1")
def test_non_regular_files_are_refused_before_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(DocumentError, match="it is a FIFO, not a regular file"):
        load_document(fifo)
    with pytest.raises(DocumentError, match="it is a folder"):
        load_document(tmp_path)
    with pytest.raises(DocumentError, match="it is a device"):
        read_regular_file("/dev/zero")
    with pytest.raises(DocumentError, match="No such file"):
        load_document(tmp_path / "missing.json")
    assert time.monotonic() - started < 5


@pytest.mark.spec("DOC-17")
def test_a_regular_file_is_read_up_to_one_byte_past_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "doc.json"
    path.write_bytes(b"[" + b"1," * 100 + b"1]")
    assert read_regular_file(path, max_bytes=10) == path.read_bytes()[:11]
    with pytest.raises(DocumentError, match="larger than 10 bytes"):
        load_document(path, max_bytes=10)
    assert load_document(path) == [1] * 101


@pytest.mark.parametrize("text", [
    "2027-01-15T08:00:00.123Z", "0001-01-01T00:00:00.000Z", "9999-12-31T23:59:59.999Z",
    "2028-02-29T12:00:00.000Z", "1969-12-31T23:59:59.999Z",
])
def test_the_desk_s_own_spelling_reads_as_the_general_parse_reads_it(text: str) -> None:
    """The spelling format_time writes takes a quicker read than other RFC 3339 texts: the
    same instant, in UTC, as the same text written with ``+00:00`` reads."""
    general = parse_time(text.replace("Z", "+00:00"))
    assert parse_time(text) == general
    assert parse_time(text).utcoffset() == timedelta(0)
    assert format_time(parse_time(text)) == text


@pytest.mark.parametrize("text", [
    "2027-02-29T08:00:00.000Z", "0000-01-01T00:00:00.000Z", "2027-01-15T24:00:00.000Z",
    "2027-13-01T00:00:00.000Z", "2027-01-15T08:00:00.000Z\n", "٢٠٢٧-01-15T08:00:00.000Z",
])
def test_a_time_in_the_desk_s_spelling_that_does_not_exist_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"^not (a date and time that exists|an RFC 3339)"):
        parse_time(text)
