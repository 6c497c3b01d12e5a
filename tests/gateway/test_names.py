import hashlib
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from awl import NotFound
from gateway._names import (
    EXPOSED_NAME_RE,
    SEPARATOR,
    NameTable,
    exposed_name,
    hashed_name,
    split_canonical,
)

NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"
# Few characters make collisions (a.b vs a-b) and hashed-looking tails likely.
TIGHT_CHARS = "ab01_.-f"

servers = st.text(alphabet=NAME_CHARS, min_size=1, max_size=40) | st.text(
    alphabet=TIGHT_CHARS, min_size=1, max_size=6)
tools = st.text(alphabet=NAME_CHARS, min_size=1, max_size=120) | st.text(
    alphabet=TIGHT_CHARS, min_size=1, max_size=14)
canonical_names = st.builds(lambda s, t: f"{s}/{t}", servers, tools)


@pytest.mark.spec("GW-1")
def test_plain_names_read_naturally() -> None:
    """A usual canonical name becomes server__tool, with dots as dashes."""
    assert exposed_name("notes/send_email") == "notes__send_email"
    assert exposed_name("mail.v2/send.now") == "mail-v2__send-now"
    table = NameTable(["notes/send_email", "time/get_current_time"])
    assert table.exposed("notes/send_email") == "notes__send_email"
    assert table.resolve("time__get_current_time") == ("time", "get_current_time")


@pytest.mark.spec("GW-1")
def test_colliding_plain_forms_are_all_hashed() -> None:
    """Two names with the same plain form both get distinct hashed names."""
    table = NameTable(["a.b/x", "a-b/x", "c/y"])
    first, second = table.exposed("a.b/x"), table.exposed("a-b/x")
    assert first != second
    assert first == hashed_name("a.b/x") and second == hashed_name("a-b/x")
    assert table.exposed("c/y") == "c__y"
    assert table.canonical(first) == "a.b/x"


@pytest.mark.spec("GW-1")
def test_long_and_hash_shaped_names_are_hashed() -> None:
    """A plain form over 64 characters, or ending like a hash, is hashed."""
    long = "s" * 40 + "/" + "t" * 40
    assert len(exposed_name(long)) == 64
    assert exposed_name(long).startswith("s" * 40 + SEPARATOR)
    shaped = "s/x_0123456789"
    assert exposed_name(shaped) == hashed_name(shaped) != "s__x_0123456789"


def _documented_hash(canonical: str) -> str:
    """SPEC GW-1's hashed form, written out here rather than taken from the module."""
    server, tool = canonical.split("/")
    plain = server.replace(".", "-") + "__" + tool.replace(".", "-")
    return plain[:53] + "_" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:10]


@pytest.mark.spec("GW-1")
def test_hashed_names_follow_the_documented_rule() -> None:
    """A hashed name is plain[:53], '_', and the first 10 hex of SHA-256 of the canonical name."""
    long = "mail.v2/" + "send_the_quarterly_report_to_every_regional_office_today"
    shaped = "s/x_0123456789"
    table = NameTable([long, shaped, "a.b/x", "a-b/x"])
    for name in (long, shaped, "a.b/x", "a-b/x"):
        assert table.exposed(name) == _documented_hash(name), name
    assert len(table.exposed(long)) == 64
    assert table.exposed(long).startswith("mail-v2__send_the_quarterly_report_to_every_reg")
    # Known answers, from sha256sum of the canonical names (dots kept, not the plain form).
    assert table.exposed("a.b/x") == "a-b__x_efa51c8e11"
    assert table.exposed("a-b/x") == "a-b__x_6c8ed8e32d"
    assert table.exposed(shaped) == "s__x_0123456789_01f4cff4d2"


@pytest.mark.spec("GW-2")
@pytest.mark.parametrize(
    "trick",
    ["Notes__send_email", "notes__send_email ", " notes__send_email", "notes__send_emai1",
     "notes__send_em\u0430il",  # a Cyrillic a
     "notes__send_email\n", "notes/send_email", "notes__..", "..__send_email",
     "other__send_email", "notes__send-email", "", "notes____send_email"],
)
def test_lookups_need_an_exact_match(trick: str) -> None:
    """Case, whitespace, look-alikes, '..', the canonical form or another server never resolve."""
    table = NameTable(["notes/send_email", "notes/send.email2"])
    assert trick not in table
    with pytest.raises(NotFound):
        table.canonical(trick)
    with pytest.raises(NotFound):
        table.resolve(trick)


def test_unknown_canonical_names_and_bad_input_are_refused() -> None:
    """Names outside server/tool are refused when building, and unknown ones when looking up."""
    with pytest.raises(ValueError):
        NameTable(["no-slash"])
    with pytest.raises(ValueError):
        split_canonical("a/b\n")
    with pytest.raises(ValueError):
        exposed_name("a/b c")
    with pytest.raises(NotFound):
        NameTable(["a/b"]).exposed("a/c")


def test_reserved_names_are_protected() -> None:
    """A reserved name the table would produce is refused; names without '__' are always free."""
    with pytest.raises(ValueError):
        NameTable(["awl/get_order"], reserved=["awl__get_order"])
    table = NameTable(["awl/get_order", "awl_/get"], reserved=["awl_get_order"])
    assert "awl_get_order" not in table


@pytest.mark.spec("GW-1")
@given(st.lists(canonical_names, max_size=30))
def test_mapping_is_valid_injective_and_round_trips(names: list[str]) -> None:
    """Every exposed name is accepted by model APIs, contains '__', and maps back to its name."""
    table = NameTable(names)
    exposed = [table.exposed(n) for n in set(names)]
    assert len(set(exposed)) == len(exposed)
    for name in set(names):
        shown = table.exposed(name)
        assert EXPOSED_NAME_RE.match(shown)
        assert SEPARATOR in shown
        assert table.canonical(shown) == name
    assert len(table) == len(set(names))


@pytest.mark.spec("GW-1")
@given(st.lists(canonical_names, max_size=20), st.randoms())
def test_mapping_does_not_depend_on_order(names: list[str], rnd: random.Random) -> None:
    """The same set of names gives the same table in any order."""
    shuffled = list(names)
    rnd.shuffle(shuffled)
    assert list(NameTable(names).items()) == list(NameTable(shuffled).items())
