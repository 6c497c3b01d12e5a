"""Effects as the desk reads them: every held call has an effect state (CM-14)."""

from __future__ import annotations

import pytest

from awl.desk import Desk
from awl.desk.effects import held_calls, list_effects
from awl.desk.settlement import settle
from awl.documents.errors import InvalidTransition
from awl.store.memory import MemoryStore
from tests.awl.server_support import MANAGER, WORKER, forward_call, hold_call, order_fields


@pytest.mark.spec("CM-14", "CM-11")
def test_the_effects_are_the_held_calls_and_a_forwarded_call_has_none() -> None:
    """Listings show exactly the held calls, each with the state the hold wrote; settling
    a call that was forwarded, not held, is refused in one line saying so."""
    store = MemoryStore()
    desk = Desk(store)
    oid = desk.create(order_fields(staged=["mail/send"]), MANAGER).id
    desk.accept(oid, WORKER)
    desk.start(oid, WORKER)
    held = hold_call(store, oid, 1, "mail/send", {"to": "cfo"})
    sent = forward_call(store, oid, 1, "mail/read", {})
    assert [(v.ref, v.state) for v in list_effects(oid, store=store)] == [(held.ref, "held")]
    assert [c.ref for c in held_calls(store, oid)] == [held.ref]
    with pytest.raises(InvalidTransition) as caught:
        settle(oid, sent.ref, "happened", "seen", MANAGER, store=store, desk=desk)
    assert caught.value.message == (
        f"call {sent.ref} of order {oid!r} was not held (its outcome is ok), so it has no "
        "effect to settle")
    with pytest.raises(InvalidTransition, match="is held; only an unknown effect"):
        settle(oid, held.ref, "happened", "seen", MANAGER, store=store, desk=desk)
