"""Schema migrations: Alembic revisions that bring any trainvitals database to the current
schema (``trainvitals db upgrade``, and every server start).

The revisions live beside this module (``versions/``) and ship in the wheel, so no
``alembic.ini`` is needed: :func:`upgrade` builds Alembic's configuration in code. The first
revision is the schema of release 0.1.0; it also adopts a database made before migrations
existed (by 0.1.0's ``create_schema`` or older), which has no ``alembic_version`` table yet.

On PostgreSQL the upgrade holds an advisory lock, so replicas that start together against
one database migrate it once: the others wait, then find it at the head and do nothing.
How to add a revision: docs/operations.md.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, MetaData, text

from trainvitals.exceptions import StorageError
from trainvitals.server.storage.schema import metadata

__all__ = ["alembic_config", "current_revision", "head_revision", "target_metadata", "upgrade"]

#: The schema the code expects: what the head revision must produce (a test compares them).
target_metadata: MetaData = metadata

_HERE = Path(__file__).parent
#: Any fixed 64-bit number, the same in every replica ("tvmigr" in ASCII).
_LOCK_KEY = 0x74766D696772


def upgrade(engine: Engine) -> str:
    """Bring the database to the head revision; returns the revision it is at.

    Example:
        ```python
        from trainvitals.server.storage.schema import connect, database_url

        upgrade(connect(database_url("runs.db")))  # "0001"
        ```
    """
    with engine.connect() as conn:
        locking = conn.dialect.name == "postgresql"
        if locking:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _LOCK_KEY})
            conn.commit()
        try:
            command.upgrade(alembic_config(conn), "head")
            conn.commit()
            return current_revision(conn) or "base"
        except CommandError as exc:  # several heads, or a revision this version lacks
            raise StorageError(f"cannot migrate the database: {exc}") from None
        finally:
            conn.rollback()  # a failed revision leaves its transaction aborted
            if locking:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _LOCK_KEY})
                conn.commit()


def current_revision(conn: Connection) -> str | None:
    """The revision the database is at (None: not under migrations yet, or empty)."""
    return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    """The newest revision shipped with this version of trainvitals."""
    head = ScriptDirectory.from_config(alembic_config(None)).get_current_head()
    assert head is not None, "the package ships at least the baseline revision"
    return head


def alembic_config(conn: Connection | None) -> Config:
    """Alembic's configuration for the packaged revisions, running them on ``conn``: for
    ``alembic.command`` (drafting a revision, see docs/operations.md)."""
    config = Config()
    config.set_main_option("script_location", str(_HERE))
    # env.py runs the revisions on this connection (a URL in the config would open another).
    config.attributes["connection"] = conn
    return config
