"""Seeded generators of hostile input for the fuzz suite (issue 23).

Every test draws from ``random.Random(seed)`` with a fixed seed, so a failure replays exactly;
``AWL_FUZZ_SCALE`` (default 1) multiplies the number of inputs: CI runs a few thousand,
``AWL_FUZZ_SCALE=20`` runs tens of thousands on demand. ``AWL_FUZZ_SEED`` moves the seeds.
"""

from __future__ import annotations

import copy
import json
import os
import random
from collections.abc import Iterator
from typing import Any


def scale(n: int) -> int:
    """``n`` inputs times ``AWL_FUZZ_SCALE``."""
    return max(1, int(n * float(os.environ.get("AWL_FUZZ_SCALE", "1"))))


def rng(name: str) -> random.Random:
    """The seeded generator of one test (its seed: the test's name and ``AWL_FUZZ_SEED``)."""
    return random.Random(f"{name}:{os.environ.get('AWL_FUZZ_SEED', '23')}")


def _deep(depth: int, leaf: Any) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"d": value}
    return value


# Values that break something somewhere: numbers SQLite or floats cannot hold, text that is
# not Unicode, nesting past the limits, types a field never expects.
SHARP: tuple[Any, ...] = (
    float("nan"), float("inf"), -float("inf"), 2**63, -(2**63) - 1, 2**64, 10**400,
    10**4001, 1e308, -1e308, 5e-324, -0.0, 1.0, 2.0, 0, -1, True, False, None,
    "", " ", "\ud800", "x\udfffy", "\x00", "\u202e", "é" * 3, "a" * 5000, "9" * 40,
    "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00", "2026-02-30T00:00:00Z",
    "2026-10-01T09:00:00Z", "not a time", "*", "a/*", "a/b", "a/b#1", "a/b#call-1",
    "a/b#0", "a/b#" + "9" * 19, "../../etc/passwd", "(a+)+$", "a{99999999999}",
    [], {}, [None], {"": None}, {"$ref": "a/b#1", "pointer": "/x"},
    lambda: _deep(70, 1), lambda: _deep(2000, 0), lambda: ["x"] * 2000,
    lambda: {str(i): i for i in range(300)},
)


def sharp(r: random.Random) -> Any:
    """One hostile value (a fresh one: a test may change what it gets)."""
    chosen = r.choice(SHARP)
    return chosen() if callable(chosen) else copy.deepcopy(chosen)


def value(r: random.Random, depth: int = 0) -> Any:
    """A random JSON-like value, hostile one time in four."""
    roll = r.random()
    if roll < 0.25:
        return sharp(r)
    if depth > 3 or roll < 0.55:
        return r.choice([r.randint(-5, 5), r.random() * 100, r.choice("abcxyz") * r.randint(0, 5),
                         True, None])
    if roll < 0.8:
        return [value(r, depth + 1) for _ in range(r.randint(0, 4))]
    return {r.choice(["a", "b", "id", "x-y", "\ud800", ""]): value(r, depth + 1)
            for _ in range(r.randint(0, 4))}


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if len(prefix) > 8:
        return
    if isinstance(doc, dict):
        for key, item in doc.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(doc, list):
        for i, item in enumerate(doc):
            yield from _paths(item, (*prefix, i))


def mutate(doc: Any, r: random.Random, rounds: int = 3) -> Any:
    """``doc`` (a copy) with a few random changes: values replaced, members dropped or added."""
    out = json.loads(json.dumps(doc))  # the seeds are plain JSON
    for _ in range(r.randint(1, rounds)):
        paths = [p for p in _paths(out) if p]
        if not paths:
            return value(r)
        path = r.choice(paths)
        parent = out
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        action = r.random()
        if action < 0.6:
            parent[last] = value(r)
        elif action < 0.8 and isinstance(parent, dict):
            del parent[last]
        elif isinstance(parent, dict):
            parent[r.choice(["x-extra", "extra", "id", "spec", "attempt"])] = value(r)
        elif isinstance(parent, list):
            parent.append(value(r))
    return out


def damage(text: bytes, r: random.Random) -> bytes:
    """Bytes of a document, damaged: cut, flipped, duplicated or padded."""
    if not text:
        return bytes([r.randint(0, 255)])
    roll = r.random()
    i = r.randrange(len(text))
    if roll < 0.3:
        return text[:i]
    if roll < 0.6:
        return text[:i] + bytes([r.randint(0, 255)]) + text[i + 1:]
    if roll < 0.8:
        return text[:i] + text[i:i + r.randint(1, 40)] * r.randint(2, 5) + text[i:]
    return r.choice([b"\xef\xbb\xbf", b"\xff\xfe", b"[" * 100, b" "]) + text


def dumps(doc: Any) -> bytes:
    """JSON bytes of any value the generators make (NaN and surrogates as Python writes them)."""
    try:
        return json.dumps(doc).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError):
        return b"[]"
