"""Track records kept as running tallies: what each order adds, the one rule every backend uses.

A worker's track record (:class:`~awl.store.protocol.TrackRecord`) is kept up to date in the
transaction of every write that changes one of its orders, so reading it costs the same on
a desk of ten orders and of a hundred thousand. Each store keeps two things per worker, once
for the worker as a whole (manager :data:`ALL`) and once per manager that issued it orders
(what a manager may see of it, SEC-8):

- **tallies**: rows ``(kind, key) → orders, spent, budget``: ``outcome``/<outcome> and
  ``rounds``/<rework rounds of an order approved after rework> count orders; ``spend``/<unit>
  counts the orders that reported and budgeted the unit and sums their spend and budget;
  ``ratio``/<unit> and ``seconds`` count the values below;
- **values**: one row per order and ``ratio``/<unit> (its spend over its budget, where the
  budget is above zero) or ``seconds`` (accept to approval, for an approved order), kept in
  value order, so a median is read at the middle of an index.

A write reads the order's :class:`~awl.store.protocol.TrackRow` before and after it and
applies :func:`tally_changes`: the old row's contributions taken away, the new row's added,
in that order, each to the worker's tally and to the manager's. Every backend applies the
same changes in the same order with the same float arithmetic, so memory, SQLite and
PostgreSQL give identical records for the same writes; the sums are running sums, equal to a
sum over the worker's orders up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from awl.documents.lifecycle import ACTIVE
from awl.documents.models import Review, WorkReport, parse_time
from awl.store.protocol import OrderRecord, TrackRecord, TrackRow, UnitSpend

__all__ = ["ALL", "OUTCOMES", "Change", "Tally", "filled", "may_change", "median_of", "middle",
           "outcome_of", "queued", "read_sql", "record_from", "scopes", "tally_changes",
           "track_values", "write_sql"]

OUTCOMES = ("approved_first_time", "approved_after_rework", "failed", "expired",
            "cancelled", "declined", "active")

ALL = ""
"""The manager key of a worker's whole tally (no principal is the empty string)."""


def outcome_of(row: TrackRow | OrderRecord) -> str:
    """The outcome an order counts under (one of :data:`OUTCOMES`)."""
    if isinstance(row, OrderRecord):
        row = TrackRow.of(row)
    if row.state == "approved":
        return "approved_after_rework" if row.reworks else "approved_first_time"
    if row.state in ("cancelled", "expired"):
        return "failed" if row.status == "failed" else row.state
    if row.state == "declined":
        return "declined"
    return "active"


class Change(NamedTuple):
    """One change to a tally row: add ``orders``, ``spent`` and ``budget`` to it."""

    kind: str
    key: str
    orders: int
    spent: float = 0.0
    budget: float = 0.0


def _seconds(row: TrackRow) -> float | None:
    if row.state == "approved" and row.accepted_at and row.approved_at:
        return (parse_time(row.approved_at) - parse_time(row.accepted_at)).total_seconds()
    return None


def scopes(manager: str) -> tuple[str, ...]:
    """The tallies a change of one of ``manager``'s orders goes to: the manager's and the
    worker's whole tally."""
    return (ALL,) if manager == ALL else (manager, ALL)


def track_values(row: TrackRow) -> list[tuple[str, str, float]]:
    """The order's values for medians: ``(kind, key, value)``."""
    out = []
    for unit, value in sorted((row.cost or {}).items()):
        limit = row.budget.get(unit)
        if limit is not None and limit > 0:
            out.append(("ratio", unit, value / limit))
    seconds = _seconds(row)
    if seconds is not None:
        out.append(("seconds", "", seconds))
    return out


def _contributions(row: TrackRow, values: list[tuple[str, str, float]]) -> list[Change]:
    outcome = outcome_of(row)
    out = [Change("outcome", outcome, 1)]
    if outcome == "approved_after_rework":
        out.append(Change("rounds", str(row.reworks), 1))
    for unit, value in sorted((row.cost or {}).items()):
        limit = row.budget.get(unit)
        if limit is not None:
            out.append(Change("spend", unit, 1, value, limit))
    out += [Change(kind, key, 1) for kind, key, _ in values]
    return out


def tally_changes(old: TrackRow | None, new: TrackRow | None) -> list[Change]:
    """What a write that turns the order's row ``old`` into ``new`` (None: no order) changes
    in its worker's tallies, in the order every backend applies them: nothing when the
    contributions are equal."""
    before = _contributions(old, track_values(old)) if old is not None else []
    after = _contributions(new, track_values(new)) if new is not None else []
    if before == after:
        return []
    return [Change(c.kind, c.key, -c.orders, -c.spent, -c.budget) for c in before] + after


def may_change(old_state: str, state: str, report: WorkReport | None,
               review: Review | None) -> bool:
    """Whether an event can change its order's tallies: one that stores no report or review
    and keeps the order active (or in its state) cannot, so a store need not read its row."""
    if report is not None or review is not None:
        return True
    return not (old_state == state or (old_state in ACTIVE and state in ACTIVE))


def queued(state: str | None) -> bool:
    """Whether an order in ``state`` (None: no order yet) has a row in the question queue a
    SQL backend keeps (only blocked orders have questions)."""
    return state == "blocked"


def middle(count: int) -> tuple[int, int]:
    """Where the median of ``count`` sorted values sits: ``(offset, how many)``."""
    return (count - 1) // 2, 1 if count % 2 else 2


def median_of(values: Iterable[float]) -> float:
    """The median from the values :func:`middle` picked (one, or the two to average)."""
    picked = list(values)
    return picked[0] if len(picked) == 1 else (picked[0] + picked[1]) / 2


Median = Callable[[str, str, int, int], list[float]]
"""How a backend reads values: ``(kind, key, offset, limit)`` → values in order."""


def record_from(worker: str, tallies: Mapping[tuple[str, str], tuple[int, float, float]],
                read: Median) -> TrackRecord:
    """The track record from a worker's (or worker and manager's) tally rows, reading the
    medians' middle values with ``read``."""
    def count(kind: str, key: str = "") -> int:
        return tallies.get((kind, key), (0, 0.0, 0.0))[0]

    def median(kind: str, key: str = "") -> float | None:
        n = count(kind, key)
        return median_of(read(kind, key, *middle(n))) if n > 0 else None

    outcomes = {o: count("outcome", o) for o in OUTCOMES}
    spend = {unit: UnitSpend(orders=orders, spent=spent, budget=budget,
                             median_ratio=median("ratio", unit))
             for (kind, unit), (orders, spent, budget) in sorted(tallies.items())
             if kind == "spend" and orders > 0}
    rounds = {int(key): orders for (kind, key), (orders, _, _) in tallies.items()
              if kind == "rounds" and orders > 0}
    return TrackRecord(
        worker=worker, orders=sum(outcomes.values()),
        approved_first_time=outcomes["approved_first_time"],
        approved_after_rework=outcomes["approved_after_rework"],
        rework_rounds=dict(sorted(rounds.items())),
        failed=outcomes["failed"], expired=outcomes["expired"],
        cancelled=outcomes["cancelled"], declined=outcomes["declined"],
        active=outcomes["active"], spend=spend,
        median_seconds_to_approval=median("seconds"),
    )


class Tally:
    """Tallies and values in memory: the memory store's, and :func:`awl.desk.track.summarize`'s
    (a tally of the rows given, built from scratch). Not thread-safe: its owner locks."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str, str, str], list[float]] = {}
        self._values: dict[str, tuple[str, str, list[tuple[str, str, float]]]] = {}

    def write(self, worker: str, manager: str, order_id: str, old: TrackRow | None,
              new: TrackRow | None) -> None:
        """Apply a write that turns the order's row ``old`` into ``new``."""
        changes = tally_changes(old, new)
        if not changes:
            return
        for change in changes:
            for scope in scopes(manager):
                row = self._rows.setdefault((worker, scope, change.kind, change.key),
                                            [0, 0.0, 0.0])
                row[0] += change.orders
                row[1] += change.spent
                row[2] += change.budget
        self._values[order_id] = (worker, manager, track_values(new) if new else [])

    def record(self, worker: str, manager: str | None = None) -> TrackRecord:
        """The track record of ``worker`` (only ``manager``'s orders, if given)."""
        scope = ALL if manager is None else manager
        tallies = {(kind, key): (int(row[0]), row[1], row[2])
                   for (w, m, kind, key), row in self._rows.items()
                   if w == worker and m == scope}

        def read(kind: str, key: str, offset: int, limit: int) -> list[float]:
            values = sorted(v for w, m, found in self._values.values()
                            if w == worker and (manager is None or m == manager)
                            for k, unit, v in found if (k, unit) == (kind, key))
            return values[offset:offset + limit]

        return record_from(worker, tallies, read)

    def dump(self) -> tuple[list[tuple[str, str, str, str, int, float, float]],
                            list[tuple[str, str, str, str, str, float]]]:
        """Every tally row ``(worker, manager, kind, key, orders, spent, budget)`` and value
        ``(order_id, kind, key, worker, manager, value)``: what a migration writes when it
        fills a store's tallies from the orders already there."""
        rows = [(w, m, kind, key, int(n), spent, budget)
                for (w, m, kind, key), (n, spent, budget) in self._rows.items()]
        values = [(order_id, kind, key, w, m, v)
                  for order_id, (w, m, found) in self._values.items() for kind, key, v in found]
        return rows, values


def filled(rows: Iterable[tuple[str, str, TrackRow]]) -> tuple[
        list[tuple[str, str, str, str, int, float, float]],
        list[tuple[str, str, str, str, str, float]]]:
    """The tally rows and values (:meth:`Tally.dump`) of the orders whose ``(worker,
    manager, track row)`` are given, oldest first: what a migration writes."""
    tally = Tally()
    for worker, manager, row in rows:
        tally.write(worker, manager, row.order_id, None, row)
    return tally.dump()


Run = Callable[[str, Sequence[Any]], Iterable[Sequence[Any]]]
"""How a SQL backend runs one statement in its read transaction: ``(sql, params)`` → rows."""


def read_sql(worker: str, manager: str | None, run: Run, mark: str) -> TrackRecord:
    """The track record from the tables ``track_tally`` and ``track_values`` a SQL backend
    keeps (``mark``: its parameter placeholder, ``?`` or ``%s``): the tally rows of one
    scope, and each median read at the middle of an index."""
    scope = ALL if manager is None else manager
    tallies = {(str(kind), str(key)): (int(n), float(spent), float(budget))
               for kind, key, n, spent, budget in run(
                   "SELECT kind, key, orders, spent, budget FROM track_tally"
                   f" WHERE worker = {mark} AND manager = {mark}", (worker, scope))}
    mine = "" if manager is None else f" AND manager = {mark}"
    # Every median's middle values in one statement (a round trip saved per median).
    wanted = [(kind, key, *middle(n)) for (kind, key), (n, _, _) in sorted(tallies.items())
              if kind in ("ratio", "seconds") and n > 0]
    found: dict[tuple[str, str], list[float]] = {(kind, key): [] for kind, key, _, _ in wanted}
    if wanted:
        parts, params = [], []
        for i, (kind, key, offset, limit) in enumerate(wanted):
            parts.append(f"SELECT {i} AS i, value FROM (SELECT value FROM track_values"
                         f" WHERE worker = {mark}{mine} AND kind = {mark} AND key = {mark}"
                         f" ORDER BY value LIMIT {mark} OFFSET {mark}) AS m{i}")
            params += [worker, *(() if manager is None else (manager,)), kind, key, limit,
                       offset]
        for i, value in run(" UNION ALL ".join(parts), params):
            found[wanted[int(i)][:2]].append(float(value))
        for values in found.values():
            values.sort()

    return record_from(worker, tallies, lambda kind, key, offset, limit: found[(kind, key)])


def adding_sql(mark: str) -> str:
    """The statement that adds one change to a tally row (``mark``: the placeholder)."""
    return (f"INSERT INTO track_tally (worker, manager, kind, key, orders, spent, budget)"
            f" VALUES ({', '.join([mark] * 7)}) ON CONFLICT (worker, manager, kind, key)"
            " DO UPDATE SET orders = track_tally.orders + excluded.orders,"
            " spent = track_tally.spent + excluded.spent,"
            " budget = track_tally.budget + excluded.budget")


def value_sql(mark: str) -> str:
    """The statement that stores one value of an order."""
    return ("INSERT INTO track_values (order_id, kind, key, worker, manager, value)"
            f" VALUES ({', '.join([mark] * 6)})")


Many = Callable[[str, list[tuple[Any, ...]]], object]
"""How a SQL backend runs one statement for each of many parameter rows, in its write."""


def write_sql(many: Many, mark: str, worker: str, manager: str, order_id: str,
              old: TrackRow | None, new: TrackRow) -> None:
    """Apply, in a SQL backend's write transaction, a write that turned the order's row
    ``old`` into ``new`` (None: the order is new): the changes added to the tally rows in
    order, and the order's values replaced. Writes nothing when nothing changes."""
    changes = tally_changes(old, new)
    if not changes:
        return
    many(adding_sql(mark), [(worker, scope, c.kind, c.key, c.orders, c.spent, c.budget)
                            for c in changes for scope in scopes(manager)])
    if old is not None:
        many(f"DELETE FROM track_values WHERE order_id = {mark}", [(order_id,)])
    values = [(order_id, kind, key, worker, manager, v) for kind, key, v in track_values(new)]
    if values:
        many(value_sql(mark), values)
