"""This process's leases, on the event loop: taken, renewed and released through the writer.

Replicas share the database; a lease (:mod:`~trainvitals.server.storage.leases`) says which
of them does what only one may do at a time: judge a run (its detector), or sweep for lost
runs. With one process, on SQLite too, that process holds them all.
"""

from __future__ import annotations

import time
import uuid
from functools import partial

from trainvitals.server.storage.leases import RUN, LeaseStore
from trainvitals.server.writer import Writer

#: The lost-run sweep's lease.
SWEEP = "sweep:lost"
#: The lease of the sweep that deletes archived runs past their days.
RETENTION = "sweep:retention"

__all__ = ["RETENTION", "RUN", "SWEEP", "Leases"]


class Leases:
    """Leases held by this process (``owner``, a random id) for ``ttl`` seconds at a time.

    Example:
        ```python
        leases = Leases(store.leases, writer, ttl=15.0)
        if await leases.claim(SWEEP):
            ...  # nobody else sweeps for the next 15 s
        ```
    """

    def __init__(self, store: LeaseStore, writer: Writer, ttl: float) -> None:
        self._store, self._writer = store, writer
        self.ttl = ttl
        self.owner = uuid.uuid4().hex

    async def take(self, name: str) -> bool:
        """Take ``name`` from whoever holds it; whether this process held it already."""
        until = time.time() + self.ttl
        return await self._writer.submit(
            partial(self._store.take, name=name, owner=self.owner, until=until)
        )

    async def claim(self, name: str) -> bool:
        """Take or renew ``name`` unless another process holds it; whether it is ours."""
        now = time.time()
        return await self._writer.submit(
            partial(self._store.claim, name=name, owner=self.owner, now=now, until=now + self.ttl)
        )

    async def renew(self, prefix: str) -> set[str]:
        """Renew the leases named ``prefix...``; returns those still ours."""
        until = time.time() + self.ttl
        return await self._writer.submit(
            partial(self._store.renew, owner=self.owner, prefix=prefix, until=until)
        )

    async def release(self, *names: str) -> None:
        await self._writer.submit(partial(self._store.release, owner=self.owner, names=list(names)))
