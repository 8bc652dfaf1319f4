"""The schema of release 0.1.0, and the adoption of databases made before migrations.

A fresh database gets every table. A database made by 0.1.0's ``create_schema`` (or an older
release) has no ``alembic_version`` yet, so Alembic runs this revision on it too: the tables
it lacks are made, and the nullable columns and the indexes older releases lacked are added
(as 0.1.0's ``create_schema`` did). Rows are never touched.

The tables are a frozen copy, not the models: later revisions change the models and add
their own steps, and this one must keep making exactly what 0.1.0 made.

Revision ID: 0001
Revises:
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from trainvitals.exceptions import StorageError

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_baseline = sa.MetaData()

sa.Table(
    "runs",
    _baseline,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("project", sa.String(200), nullable=False),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float),
    sa.Column("last_step", sa.BigInteger),
    sa.Column("last_seen", sa.Float, nullable=False),
    sa.Column("last_seq", sa.BigInteger, nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("end_reason", sa.String(200)),
    sa.Column("traceback", sa.Text),
    sa.Column("stalled_at", sa.Float),
    sa.Column("stall_stacks", sa.Text),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("env", sa.Text, nullable=False),
    sa.Column("job_id", sa.String(64)),
    sa.Column("job_key", sa.String(128)),
    sa.Column("secret_hash", sa.String(64)),
    sa.Column("worker", sa.String(64)),
    sa.Index("ix_runs_started_at", "started_at"),
    sa.Index("ix_runs_job_key", "project", "job_key"),
    sa.Index("ix_runs_job_id", "job_id"),
)
sa.Table(
    "series",
    _baseline,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(256), primary_key=True),
)
sa.Table(
    "chunks",
    _baseline,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("series", sa.String(256), primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True),
    sa.Column("n", sa.Integer, nullable=False),
    sa.Column("steps", sa.LargeBinary, nullable=False),
    sa.Column("times", sa.LargeBinary, nullable=False),
    sa.Column("vals", sa.LargeBinary, nullable=False),
)
sa.Table(
    "alerts",
    _baseline,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("project", sa.String(200), nullable=False),
    sa.Column("run_name", sa.String(200), nullable=False),
    sa.Column("rule", sa.String(64), nullable=False),
    sa.Column("subject", sa.String(128), nullable=False),
    sa.Column("severity", sa.String(16), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("hint", sa.Text, nullable=False),
    sa.Column("evidence", sa.Text, nullable=False),
    sa.Column("step", sa.BigInteger, nullable=False),
    sa.Column("time", sa.Float, nullable=False),
    sa.Column("updated_time", sa.Float, nullable=False),
    sa.Column("resolved_time", sa.Float),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Column("acknowledged_at", sa.Float),
    sa.Column("acknowledged_by", sa.String(200)),
    sa.Column("silenced_until", sa.Float),
    sa.Index("ix_alerts_run", "run_id"),
    sa.Index("ix_alerts_state_time", "state", "time"),
)
sa.Table(
    "silences",
    _baseline,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("rule", sa.String(64), nullable=False),
    sa.Column("subject", sa.String(128), nullable=False),
    sa.Column("until", sa.Float, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("created_by", sa.String(200)),
)
sa.Table(
    "events",
    _baseline,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("step", sa.BigInteger, nullable=False),
    sa.Column("time", sa.Float, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
)
sa.Table(
    "tokens",
    _baseline,
    sa.Column("id", sa.String(16), primary_key=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("project", sa.String(200), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("hash", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("revoked_at", sa.Float),
)
sa.Table(
    "sessions",
    _baseline,
    sa.Column("hash", sa.String(64), primary_key=True),
    sa.Column("token_id", sa.String(16), nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Index("ix_sessions_token", "token_id"),
)
sa.Table(
    "outbox",
    _baseline,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("channel", sa.String(100), nullable=False),
    sa.Column("alert_id", sa.String(64), nullable=False),
    sa.Column("change", sa.String(16), nullable=False),
    sa.Column("alert", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("last_error", sa.Text),
    sa.Column("done_at", sa.Float),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("lease_until", sa.Float, nullable=False),
    sa.Index("ix_outbox_state_lease", "state", "lease_until"),
    sa.Index("ix_outbox_alert_channel", "alert_id", "channel"),
)


def upgrade() -> None:
    bind = op.get_bind()
    _baseline.create_all(bind, checkfirst=True)
    _adopt(bind)


def downgrade() -> None:
    _baseline.drop_all(op.get_bind())


def _adopt(bind: sa.Connection) -> None:
    """Add what a database of an older release lacks: nullable columns and indexes."""
    inspector = sa.inspect(bind)
    for table in _baseline.sorted_tables:
        have = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in have:
                continue
            if not column.nullable:
                raise StorageError(
                    f"the database's table {table.name!r} lacks the column {column.name!r}, "
                    "which cannot be added to existing rows: use a new database"
                )
            op.add_column(table.name, sa.Column(column.name, column.type))
        indexes = {index["name"] for index in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in indexes:
                index.create(bind)
