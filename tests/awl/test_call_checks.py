"""The stores check a reserved call's fields and a call's ending by hand (a gateway does
both on every call); these tests hold those checks to CallRecord's own answers, field by
field, so the model stays the one home of what a call record is."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from awl.documents.errors import BadRequest
from awl.documents.models import CallRecord
from awl.store.rules import _encode, _quoted, check_ending, check_hold, new_call, record_from

T0 = "2030-01-01T00:00:00Z"
START: dict[str, Any] = {"order_id": "o1", "attempt": 1, "tool": "srv/read",
                         "arguments": {"q": 1}, "pass_jti": None, "started_at": T0}
"""The fields a reservation gives, all valid."""

# Values tried for each field: good ones and bad ones, the awkward cases included.
_TIMES = [T0, "2030-01-01T00:00:00.123+02:00", "2030-01-01t00:00:00z", "2030-01-01T00:00:00",
          "2030-02-30T00:00:00Z", "yesterday", "", "2030-01-01T00:00:00Z\n", 5, None, b"x"]
TRIED: dict[str, list[Any]] = {
    "order_id": ["o1", "", 7, None],
    "attempt": [1, 2, 2.0, 2.5, 0, -1, True, "1", None],
    "tool": ["srv/read", "a.b-c_d/E9", "srv", "srv/", "/read", "srv/read/x", "srv/read\n",
             "srv/re ad", "srv/*", "srv/réad", 5, None],
    "arguments": [{}, {"q": [1, {"x": None}]}, [], "x", None],
    "pass_jti": [None, "jti-1", "", 5],
    "started_at": _TIMES,
}
ENDINGS: dict[str, list[Any]] = {
    "outcome": ["ok", "error", "refused", "maybe", "OK", 1, None],
    "result": [None, {}, {"content": []}, {1: "x"}, [], "x"],
    "error": [None, "", "boom", 5],
    "ended_at": _TIMES,
}


def _model_accepts(data: dict[str, Any]) -> bool:
    try:
        CallRecord.model_validate(data)
    except ValidationError:
        return False
    return True


def _record(fields: dict[str, Any], n: int = 1) -> dict[str, Any]:
    """The record CallRecord would be given: the ref made, None fields left out."""
    data = {"ref": f"{fields['tool']}#{n}" if isinstance(fields["tool"], str) else "x#1",
            **{k: v for k, v in fields.items() if v is not None}}
    data.setdefault("outcome", "pending")
    data.setdefault("ended_at", fields.get("started_at"))
    return data


@pytest.mark.parametrize("field", sorted(TRIED))
def test_a_reservation_s_fields_are_checked_as_call_record_checks_them(field: str) -> None:
    for value in TRIED[field]:
        fields = {**START, field: value}
        expected = _model_accepts(_record(fields))
        try:
            data = new_call(fields["order_id"], 1, attempt=fields["attempt"],
                            tool=fields["tool"], arguments=fields["arguments"],
                            pass_jti=fields["pass_jti"], started_at=fields["started_at"])
        except BadRequest as exc:
            assert not expected, f"{field}={value!r} refused, but CallRecord accepts it: {exc}"
            assert f"/{field}:" in exc.message, exc.message
            continue
        assert expected, f"{field}={value!r} accepted, but CallRecord refuses it"
        # What the store keeps is the record CallRecord makes of the same fields.
        assert record_from(data) == CallRecord.model_validate(_record(fields))


@pytest.mark.parametrize("field", sorted(ENDINGS))
def test_a_call_s_ending_is_checked_as_call_record_checks_it(field: str) -> None:
    base: dict[str, Any] = {"outcome": "ok", "result": None, "error": None, "ended_at": T0}
    for value in ENDINGS[field]:
        ending = {**base, field: value}
        record = {**_record(START), "outcome": ending["outcome"], "ended_at": ending["ended_at"],
                  **{k: ending[k] for k in ("result", "error") if ending[k] is not None}}
        expected = _model_accepts(record)
        try:
            check_ending(ending["outcome"], ending["result"], ending["error"],
                         ending["ended_at"])
        except BadRequest as exc:
            assert not expected, f"{field}={value!r} refused, but CallRecord accepts it: {exc}"
            continue
        assert expected, f"{field}={value!r} accepted, but CallRecord refuses it"


def test_only_a_final_outcome_ends_a_call_and_a_hold_is_checked_alike() -> None:
    for outcome in ("pending", "held"):
        with pytest.raises(BadRequest, match=r"hold_call|final outcome"):
            check_ending(outcome, None, None, T0)
    check_hold({"content": []}, T0)
    for result, ended_at in (([], T0), ({"x": 1}, "later")):
        with pytest.raises(BadRequest):
            check_hold(result, ended_at)  # type: ignore[arg-type]


def test_a_whole_number_attempt_is_stored_as_an_integer() -> None:
    data = new_call("o1", 3, attempt=2.0, tool="srv/read",  # type: ignore[arg-type]
                    arguments={}, pass_jti="j", started_at=T0)
    assert data["attempt"] == 2 and isinstance(data["attempt"], int)
    assert data["ref"] == "srv/read#3" and data["pass_jti"] == "j"
    assert record_from(data).attempt == 2


def test_names_refs_and_patterns_end_where_the_text_ends() -> None:
    """A trailing newline makes no tool name, pattern or ref (Python's ``$`` would let one
    through; the schemas' patterns do not)."""
    from awl.documents.patterns import is_pattern, is_tool_name, matches, parse_ref

    assert is_tool_name("srv/read") and not is_tool_name("srv/read\n")
    assert is_pattern("srv/*") and not is_pattern("srv/*\n") and not is_pattern("*\n")
    assert parse_ref("srv/read#3") is not None and parse_ref("srv/read#3\n") is None
    assert matches("srv/*", "srv/read") and not matches("srv/*", "srv/read\n")
    assert not matches("*", "srv/read\n")
    assert not _model_accepts(_record({**START, "tool": "srv/read\n"}))


@given(st.text() | st.sampled_from(['a"b', "a\\b", "tab\there", "\x7f", "\x1f", "é", "\ud800",
                                    "2030-01-01T00:00:00.123Z", "ok", ""]))
def test_a_string_quoted_without_the_encoder_reads_as_the_encoder_writes_it(text: str) -> None:
    """``ended_doc`` quotes times and outcomes without the JSON encoder when no character
    needs an escape; whatever the string, the text is the encoder's own."""
    assert _quoted(text) == _encode(text)
