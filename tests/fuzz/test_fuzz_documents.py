"""Fuzz: mutated and damaged documents, context documents and gateway configs (SEC-4).

Every input yields findings or one :class:`~awl.AWLError` with a one-line message; nothing
else escapes, and no check runs for long.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from awl import AWLError, Finding
from awl.documents.checks import check, load_document
from gateway._config import load_config
from tests.awl.test_checks import (
    make_call,
    make_calls,
    make_child,
    make_claims,
    make_event,
    make_order,
    make_report,
    make_review,
)
from tests.fuzz.generators import damage, dumps, mutate, rng, scale, sharp, value

pytestmark = pytest.mark.slow

SEEDS: dict[str, Any] = {
    "order": make_order(), "report": make_report(), "call": make_call(),
    "event": make_event(), "review": make_review(), "pass": make_claims(),
    "suborder": make_child(),
}


def _one_line(exc: AWLError) -> None:
    assert exc.message and "\n" not in exc.message and "Traceback" not in exc.message, exc
    assert len(exc.message) < 2000, exc.message[:200]


def _judge(doc: Any, **context: Any) -> None:
    started = time.monotonic()
    try:
        found = check(doc, **context)
    except AWLError as exc:
        _one_line(exc)
    else:
        assert all(isinstance(f, Finding) for f in found)
        for f in found:
            assert "\n" not in f.rule and f.kind in ("invalid", "limit")
    assert time.monotonic() - started < 10


@pytest.mark.spec("SEC-4", "DOC-1", "DOC-11", "DOC-12", "DOC-13", "DOC-14", "DOC-16")
def test_mutated_documents_yield_findings_or_one_error() -> None:
    r = rng("documents")
    order = make_order(output_schema={"type": "object", "properties": {
        "n": {"type": "integer", "maximum": 10}, "s": {"pattern": "^(a+)+$"}}})
    for i in range(scale(1500)):
        kind = r.choice(sorted(SEEDS))
        doc = mutate(SEEDS[kind], r)
        if kind == "report":
            if r.random() < 0.5:
                doc.setdefault("result", {})
                if isinstance(doc["result"], dict):
                    doc["result"]["output"] = value(r)
            _judge(doc, order=r.choice([order, make_order(), mutate(make_order(), r)]),
                   calls=r.choice([None, make_calls(), [mutate(make_call(), r)]]))
        elif kind == "pass":
            _judge(doc, type="pass", order=r.choice([None, make_order()]),
                   parent=r.choice([None, make_claims(), sharp(r)]),
                   remaining=r.choice([None, {"usd": 1}, sharp(r)]),
                   now=r.choice([None, 1_800_000_000, sharp(r)]))
        elif kind == "suborder":
            _judge(doc, parent=r.choice([make_order(), mutate(make_order(), r)]),
                   remaining=r.choice([None, {"usd": 0.5}, sharp(r)]))
        else:
            _judge(doc, type=r.choice([None, kind, kind, "order"]))
        if i % 7 == 0:
            _judge(sharp(r))


@pytest.mark.spec("SEC-4", "DOC-1", "DOC-17", "BIND-1")
def test_damaged_bytes_and_files_are_read_or_refused_in_one_line(tmp_path: Path) -> None:
    r = rng("bytes")
    path = tmp_path / "doc.json"
    for i in range(scale(800)):
        data = damage(dumps(mutate(SEEDS[r.choice(sorted(SEEDS))], r, rounds=1)), r)
        source: Any = data
        if i % 4 == 0:
            path.write_bytes(data)
            source = path
        elif i % 4 == 1:
            source = data.decode("utf-8", "surrogateescape")
        try:
            doc = load_document(source)
        except AWLError as exc:
            _one_line(exc)
            continue
        _judge(doc)


def _config(r: Any) -> dict[str, Any]:
    return {"mcpServers": {"mail": {"command": "python", "args": ["-m", "x"],
                                    "env": {"A": "1"}, "timeout": 5, "connect_timeout": 3,
                                    "costs": {"send": 0.1, "*": 0}, "hold": ["send"],
                                    "max_result_bytes": 4096},
                           "web": {"url": "http://127.0.0.1:1/mcp",
                                   "headers": {"X": "y"}}},
            "gateway": {"safe_mode": r.random() < 0.5}}


@pytest.mark.spec("SEC-4", "BIND-5", "DOC-11", "DOC-12")
def test_mutated_gateway_configs_load_or_refuse_in_one_line(tmp_path: Path) -> None:
    r = rng("configs")
    path = tmp_path / "gateway.json"
    for i in range(scale(800)):
        doc = mutate(_config(r), r)
        try:
            if i % 2:
                load_config(doc)
            else:
                data = dumps(doc)
                path.write_bytes(damage(data, r) if i % 6 == 0 else data)
                load_config(path)
        except AWLError as exc:
            _one_line(exc)
