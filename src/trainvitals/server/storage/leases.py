"""Leases: which server process does a piece of work that only one may do at a time.

Replicas behind one load balancer share the database, and a lease is a row in it: a name
(``run:<id>`` for a run's detector, ``sweep:lost`` for the lost-run sweep), the owner (a
process's random id) and when the lease runs out unless renewed. Rows rather than
PostgreSQL advisory locks: they hold without a connection each (thousands of runs), and they
work the same on SQLite, where the one process always holds them.
"""

from __future__ import annotations

from sqlalchemy import Engine, delete, select, update

from trainvitals.server.storage.schema import dialect_insert, leases
from trainvitals.server.storage.unit_of_work import UnitOfWork

#: The prefix of the lease on a run's detector: ``run:<id>``.
RUN = "run:"


class LeaseStore:
    """The ``leases`` table. Every method writes, in the writer's transaction."""

    def __init__(self, engine: Engine) -> None:
        self._insert = dialect_insert(engine, leases)

    def take(self, work: UnitOfWork, name: str, owner: str, until: float) -> bool:
        """Take ``name`` whoever holds it (an agent said hello here: its run is ours now).
        Returns whether ``owner`` held it already, so that what it knows is still current."""
        conn = work.connection()
        held = conn.execute(select(leases.c.owner).where(leases.c.name == name)).scalar()
        statement = self._insert.values(name=name, owner=owner, expires=until)
        conn.execute(
            statement.on_conflict_do_update(
                index_elements=["name"], set_={"owner": owner, "expires": until}
            )
        )
        return held == owner

    def claim(self, work: UnitOfWork, name: str, owner: str, now: float, until: float) -> bool:
        """Take or renew ``name`` unless another owner holds it unexpired; whether it is
        ``owner``'s now. One statement, so two processes never both get it."""
        conn = work.connection()
        statement = self._insert.values(name=name, owner=owner, expires=until)
        taken = conn.execute(
            statement.on_conflict_do_update(
                index_elements=["name"],
                set_={"owner": owner, "expires": until},
                where=(leases.c.owner == owner) | (leases.c.expires < now),
            ).returning(leases.c.name)
        ).first()
        return taken is not None

    def renew(self, work: UnitOfWork, owner: str, prefix: str, until: float) -> set[str]:
        """Renew every lease of ``owner`` whose name starts with ``prefix``; returns the names
        it still holds (the others were taken over)."""
        conn = work.connection()
        renewed = conn.execute(
            update(leases)
            .where(leases.c.owner == owner, leases.c.name.startswith(prefix, autoescape=True))
            .values(expires=until)
            .returning(leases.c.name)
        )
        return {name for (name,) in renewed}

    def release(self, work: UnitOfWork, owner: str, names: list[str]) -> None:
        """``owner`` is done with ``names``: whoever asks next gets them at once."""
        conn = work.connection()
        conn.execute(delete(leases).where(leases.c.owner == owner, leases.c.name.in_(names)))
