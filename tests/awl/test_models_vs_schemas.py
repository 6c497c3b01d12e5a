"""The pydantic models and the normative JSON Schemas agree on every conformance document."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from awl import CallRecord, Event, PassClaims, Review, WorkOrder, WorkReport
from awl.documents.models import _Model
from awl.documents.schemas import conformance_dir, validator

_BY_TYPE: dict[str, tuple[str, type[_Model]]] = {
    "order": ("order", WorkOrder),
    "suborder": ("order", WorkOrder),
    "report": ("report", WorkReport),
    "pass": ("pass", PassClaims),
    "call": ("call", CallRecord),
    "event": ("event", Event),
    "review": ("review", Review),
}
# Which document a context key holds, by group type.
_CONTEXT: dict[str, dict[str, str]] = {
    "suborder": {"parent": "order"},
    "report": {"order": "order"},
    "pass": {"order": "order", "parent": "pass"},
}


def _documents() -> Iterator[Any]:
    folder = conformance_dir()
    assert folder is not None
    for path in sorted((folder / "cases").glob("*.json")):
        for group in json.loads(path.read_text(encoding="utf-8")):
            kind = group["type"]
            for test in group["tests"]:
                name = f"{path.stem}: {test['description']}"
                yield pytest.param(kind, test["document"], id=name)
                context = {**group.get("context", {}), **test.get("context", {})}
                for key, doc_kind in _CONTEXT.get(kind, {}).items():
                    if key in context:
                        yield pytest.param(doc_kind, context[key], id=f"{name} [{key}]")
                for i, call in enumerate(context.get("calls", [])):
                    yield pytest.param("call", call, id=f"{name} [calls/{i}]")


def _unique(params: Iterator[Any]) -> list[Any]:
    seen: set[str] = set()
    out = []
    for param in params:
        key = json.dumps([param.values[0], param.values[1]], sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(param)
    return out


DOCUMENTS = _unique(_documents())


def test_there_are_documents_of_every_type() -> None:
    """The suite holds documents of every type the models cover."""
    kinds = {param.values[0] for param in DOCUMENTS}
    assert {"order", "report", "pass"} <= kinds
    assert len(DOCUMENTS) >= 150


@pytest.mark.parametrize(("kind", "document"), DOCUMENTS)
def test_model_and_schema_agree(kind: str, document: Any) -> None:
    """Schema-valid and model-valid are the same verdict; valid documents round-trip exactly."""
    name, model_cls = _BY_TYPE[kind]
    schema_ok = validator(name).is_valid(document)
    try:
        model = model_cls.model_validate(document, by_alias=True, by_name=False)
    except ValidationError as exc:
        assert not schema_ok, f"the schema accepts what the model refuses: {exc}"
        return
    assert schema_ok, "the model accepts what the schema refuses: " + "; ".join(
        e.message for e in validator(name).iter_errors(document))
    dumped = model.to_json()
    assert dumped == document
    assert json.loads(json.dumps(dumped)) == document
