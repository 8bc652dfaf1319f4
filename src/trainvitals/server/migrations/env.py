"""Alembic's entry point: runs the revisions on the connection :func:`upgrade` hands over.

Only online migrations are supported (``trainvitals db upgrade``); there is no offline SQL
mode, because the baseline revision looks at the database to adopt one made before
migrations.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from trainvitals.exceptions import StorageError
from trainvitals.server.migrations import target_metadata

connection: Connection | None = context.config.attributes.get("connection")
if connection is None:
    raise StorageError("run migrations with `trainvitals db upgrade`, not the alembic command")
context.configure(
    connection=connection,
    target_metadata=target_metadata,
    # SQLite alters a column by copying its table: revisions use op.batch_alter_table.
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
