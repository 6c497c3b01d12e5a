"""How worker-controlled text is shown to a person (SPEC SEC-14): one rule, every door.

A person reading what a worker wrote (the arguments of the calls it asks to have run, its
report, its notes) must see the characters that will be sent, so wherever the desk shows
such text to a manager it goes through this module, and never what is stored or sent:
hidden characters become ``<U+XXXX>`` marks (the page draws each as a marked box naming the
character; the ignorable ones include the combining grapheme joiner), and look-alikes in
identifiers (``p\u0430yroll@example.com`` with a Cyrillic ``a``) get a warning naming the
characters and what the string looks like.

:func:`pieces` splits text into plain runs and :class:`Mark` s (the page renders those);
:func:`visible` is the plain-text form (the CLI, the briefing, webhooks); :func:`warnings`
and :func:`scan` say what is wrong with one string or with every string inside a JSON value
(an effect's arguments), each warning one line. Pure functions of the text.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from awl.documents.pointers import pointer

__all__ = ["Flag", "Mark", "identifier", "look_alike", "pieces", "scan", "scripts", "shown_value",
           "visible", "warnings"]

_BIDI = frozenset({0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)})
_ZERO_WIDTH = frozenset({0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF, 0x180E})
# Default_Ignorable_Code_Point characters that are not format characters (Cf): shown as
# nothing by most fonts, so as good as hidden.
_IGNORABLE = frozenset({0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0, 0x2800,
                        *range(0x180B, 0x1810), *range(0xFE00, 0xFE10),
                        *range(0xE0100, 0xE01F0), *range(0xFFF0, 0xFFF9)})
_WHY = {
    "bidi": "changes the direction text is shown in, so what you read differs from what is "
            "sent",
    "zero-width": "takes no space, so the text looks like one without it",
    "format": "is not shown by most programs",
    "control": "is a control character",
    "space": "is a space other than the plain one",
    "script": "is a letter of another script than the rest",
}
_MAX_IDENTIFIER = 2048
_BREAKS = frozenset(" \t\n\r\f\v\x85\u2028\u2029")
"""What separates words: a string with none of these is one word (:func:`identifier`)."""

# Letters of other scripts (and a few Latin ones) that look like a Latin letter or digit,
# read as that one in a skeleton. After NFKC, which already folds fullwidth, mathematical
# and other compatibility forms.
_CONFUSABLE = {
    # Cyrillic
    0x0430: "a", 0x0432: "b", 0x0435: "e", 0x0451: "e", 0x04BB: "h", 0x0456: "i",
    0x0457: "i", 0x0458: "j", 0x043A: "k", 0x043C: "m", 0x043D: "h", 0x043E: "o",
    0x0440: "p", 0x0441: "c", 0x0442: "t", 0x0443: "y", 0x0445: "x", 0x0455: "s",
    0x0501: "d", 0x051B: "q", 0x051D: "w", 0x04AF: "y", 0x04CF: "l", 0x0410: "A",
    0x0412: "B", 0x0415: "E", 0x0401: "E", 0x0417: "3", 0x0406: "I", 0x0407: "I",
    0x0408: "J", 0x041A: "K", 0x041C: "M", 0x041D: "H", 0x041E: "O", 0x0420: "P",
    0x0421: "C", 0x0422: "T", 0x0423: "Y", 0x0425: "X", 0x0405: "S", 0x0500: "D",
    0x051A: "Q", 0x051C: "W", 0x04AE: "Y", 0x04C0: "I", 0x042C: "b",
    # Greek
    0x03B1: "a", 0x03B5: "e", 0x03B9: "i", 0x03BA: "k", 0x03BD: "v", 0x03BF: "o",
    0x03C1: "p", 0x03C4: "t", 0x03C5: "u", 0x03C7: "x", 0x03F2: "c", 0x03F3: "j",
    0x0391: "A", 0x0392: "B", 0x0395: "E", 0x0396: "Z", 0x0397: "H", 0x0399: "I",
    0x039A: "K", 0x039C: "M", 0x039D: "N", 0x039F: "O", 0x03A1: "P", 0x03A4: "T",
    0x03A5: "Y", 0x03A7: "X", 0x03F9: "C", 0x037F: "J",
    # Armenian, Cherokee, Lisu and Latin letters that pass for plain ones
    0x0261: "g", 0x0585: "o", 0x057D: "u", 0x0581: "g", 0x0570: "h", 0x0578: "n",
    0x0251: "a", 0x0131: "i", 0x0237: "j", 0x029F: "L", 0xA4DA: "C", 0x13AA: "A",
    0x13AC: "E", 0x13BB: "H", 0x13AB: "J", 0x13E6: "K", 0x13B7: "M", 0x13E2: "P",
    0x13DA: "S", 0x13A2: "T", 0x13B3: "W",
}


@dataclass(frozen=True)
class Mark:
    """One hidden character, made visible: ``char`` itself, ``code`` (``U+202E``), its
    Unicode ``name`` and its ``kind`` (bidi, zero-width, format, control or space)."""

    char: str
    code: str
    name: str
    kind: str

    @property
    def shown(self) -> str:
        """The mark in plain text: ``<U+202E>``."""
        return f"<{self.code}>"

    @property
    def title(self) -> str:
        """What the character is and why it is marked, in words."""
        return f"{self.code} {self.name}: {_WHY[self.kind]}"


@dataclass(frozen=True)
class Flag:
    """What is wrong with one string: ``where`` it is (a JSON pointer into the value
    scanned, ``""`` for the whole) and ``message`` (one line)."""

    where: str
    message: str

    def line(self) -> str:
        """``at /to: message`` (or the message alone for the whole value)."""
        return f"at {self.where}: {self.message}" if self.where else self.message


def _name(ch: str) -> str:
    return unicodedata.name(ch, "") or (
        "CONTROL CHARACTER" if unicodedata.category(ch) == "Cc" else "UNNAMED CHARACTER")


def _kind(ch: str, *, lines: bool, spaces: bool) -> str | None:
    """Why ``ch`` is hidden (a :class:`Mark` kind), or None when it shows as itself."""
    code = ord(ch)
    if 0x20 <= code < 0x7F:
        return None
    if code in _BIDI:
        return "bidi"
    if code in _ZERO_WIDTH:
        return "zero-width"
    category = unicodedata.category(ch)
    if category == "Cc":
        return None if lines and ch in "\n\t" else "control"
    if category in ("Cf", "Zl", "Zp") or code in _IGNORABLE:
        return "format"
    if spaces and category == "Zs":
        return "space"
    return None


def _mark(ch: str, kind: str) -> Mark:
    return Mark(ch, f"U+{ord(ch):04X}", _name(ch), kind)


def pieces(text: str, *, lines: bool = False) -> list[str | Mark]:
    """``text`` as plain runs (str) and :class:`Mark` s for its hidden characters; in an
    identifier (:func:`identifier`) also for its spaces other than U+0020 and, when its
    letters mix scripts, for each letter not of its main script (the one most of its
    letters are in).

    Args:
        lines: the text may have lines: a line break and a tab are shown as themselves.
    """
    spaces = identifier(text)
    main = _main_script(text) if spaces else None
    out: list[str | Mark] = []
    run: list[str] = []
    for ch in text:
        kind = _kind(ch, lines=lines, spaces=spaces)
        if kind is None and main is not None and _script(ch) not in (None, main):
            kind = "script"
        if kind is None:
            run.append(ch)
            continue
        if run:
            out.append("".join(run))
            run = []
        out.append(_mark(ch, kind))
    if run:
        out.append("".join(run))
    return out


def _main_script(text: str) -> str | None:
    """The script most letters of ``text`` are in, when they are in more than one."""
    counts: dict[str, int] = {}
    for ch in text:
        script = _script(ch)
        if script is not None:
            counts[script] = counts.get(script, 0) + 1
    if len(counts) < 2:
        return None
    return max(counts, key=lambda s: counts[s])


def visible(text: str, *, lines: bool = False) -> str:
    """``text`` with each marked character (see :func:`pieces`) written as ``<U+XXXX>``."""
    return "".join(p if isinstance(p, str) else p.shown for p in pieces(text, lines=lines))


def identifier(text: str) -> bool:
    """Whether ``text`` reads as an identifier (an address, a domain, a URL, a path, a
    name): at most 2,048 characters, not only hidden ones, and no space or line break
    (U+0020, tabs, line and paragraph breaks; other spaces are marked in it instead)."""
    if not text or len(text) > _MAX_IDENTIFIER:
        return False
    return not any(ch in _BREAKS for ch in text) and any(
        _kind(ch, lines=False, spaces=False) is None for ch in text)


def _script(ch: str) -> str | None:
    """The script of a letter, from its Unicode name (``LATIN``, ``CYRILLIC``, …)."""
    if not unicodedata.category(ch).startswith("L"):
        return None
    name = unicodedata.name(ch, "")
    word = name.split(" ", 1)[0] if name else ""
    if word in ("CJK", "HIRAGANA", "KATAKANA"):
        return "Han"  # Japanese mixes these three by design
    return word.capitalize() or None


def scripts(text: str) -> list[str]:
    """The scripts of the letters of ``text`` (after NFKC), in the order they first come."""
    seen: dict[str, None] = {}
    for ch in unicodedata.normalize("NFKC", text):
        script = _script(ch)
        if script is not None:
            seen.setdefault(script, None)
    return list(seen)


def look_alike(text: str) -> str:
    """The skeleton of ``text``: its NFKC form with confusable letters read as the Latin
    ones they look like and hidden characters dropped."""
    bare = "".join(ch for ch in text if _kind(ch, lines=False, spaces=False) is None)
    return unicodedata.normalize("NFKC", bare).translate(_CONFUSABLE)


def _chars(keep: list[str]) -> str:
    listed = list(dict.fromkeys(keep))
    shown = ", ".join(f"U+{ord(ch):04X} {_name(ch)}" for ch in listed[:4])
    return shown + (f" and {len(listed) - 4} more" if len(listed) > 4 else "")


def warnings(text: str) -> list[str]:
    """What a person should be told about ``text`` (one line each; none when it shows as
    it is): its hidden characters, and for an identifier mixed scripts and look-alikes."""
    out = []
    spaces = identifier(text)
    marked = [p for p in pieces(text, lines=True) if isinstance(p, Mark)]
    marks = [m for m in marked if m.kind != "script"]
    if marks:
        kinds = ", ".join(dict.fromkeys(_WHY[m.kind] for m in marks))
        out.append(f"hidden characters {_chars([m.char for m in marks])} "
                   f"(each {kinds}); shown as <U+…>")
    if not spaces:
        return out
    mixed = scripts(text)
    if len(mixed) > 1:
        odd = [m.char for m in marked if m.kind == "script"]
        out.append(f"mixes scripts ({', '.join(mixed)}): {_chars(odd)}")
    skeleton = look_alike(text)
    # Bidirectional controls reorder what is shown, so a skeleton would read wrong.
    if skeleton != text and skeleton.isascii() and not any(m.kind == "bidi" for m in marks):
        out.append(f"looks like {skeleton!r} but is not that")
    return out


def shown_value(value: Any) -> Any:
    """A JSON value with every string in it (object keys too) through :func:`visible`,
    each judged on its own, so an identifier inside gets its look-alikes marked; for
    printing (``json.dumps(..., ensure_ascii=False)``), never for sending."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, Mapping):
        return {visible(str(k)): shown_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [shown_value(v) for v in value]
    return value


def scan(value: Any, where: str = "") -> list[Flag]:
    """The :func:`warnings` of every string inside a JSON value (object keys included),
    each with the JSON pointer to where it is."""
    out: list[Flag] = []
    if isinstance(value, str):
        out += [Flag(where, line) for line in warnings(value)]
    elif isinstance(value, Mapping):
        for key, item in value.items():
            here = where + pointer(str(key))
            out += [Flag(here, f"the name of this field {line}")
                    for line in warnings(str(key))]
            out += scan(item, here)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            out += scan(item, f"{where}/{i}")
    return out
