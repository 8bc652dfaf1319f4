-- The schema trainvitals 0.1.0's create_schema made (before migrations), frozen.
-- Written for SQLite; tests/server/storage/test_migrations.py reads BLOB as BYTEA on PostgreSQL.
CREATE TABLE alerts ( id VARCHAR(64) NOT NULL, run_id VARCHAR(64) NOT NULL, project VARCHAR(200) NOT NULL, run_name VARCHAR(200) NOT NULL, rule VARCHAR(64) NOT NULL, subject VARCHAR(128) NOT NULL, severity VARCHAR(16) NOT NULL, state VARCHAR(16) NOT NULL, message TEXT NOT NULL, hint TEXT NOT NULL, evidence TEXT NOT NULL, step BIGINT NOT NULL, time FLOAT NOT NULL, updated_time FLOAT NOT NULL, resolved_time FLOAT, count INTEGER NOT NULL, acknowledged_at FLOAT, acknowledged_by VARCHAR(200), silenced_until FLOAT, PRIMARY KEY (id) );
CREATE INDEX ix_alerts_run ON alerts (run_id);
CREATE INDEX ix_alerts_state_time ON alerts (state, time);
CREATE TABLE chunks ( run_id VARCHAR(64) NOT NULL, series VARCHAR(256) NOT NULL, seq BIGINT NOT NULL, n INTEGER NOT NULL, steps BLOB NOT NULL, times BLOB NOT NULL, vals BLOB NOT NULL, PRIMARY KEY (run_id, series, seq) );
CREATE TABLE events ( run_id VARCHAR(64) NOT NULL, seq BIGINT NOT NULL, kind VARCHAR(32) NOT NULL, step BIGINT NOT NULL, time FLOAT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (run_id, seq) );
CREATE TABLE outbox ( id VARCHAR(64) NOT NULL, channel VARCHAR(100) NOT NULL, alert_id VARCHAR(64) NOT NULL, change VARCHAR(16) NOT NULL, alert TEXT NOT NULL, created_at FLOAT NOT NULL, state VARCHAR(16) NOT NULL, attempts INTEGER NOT NULL, last_error TEXT, done_at FLOAT, owner VARCHAR(64) NOT NULL, lease_until FLOAT NOT NULL, PRIMARY KEY (id) );
CREATE INDEX ix_outbox_alert_channel ON outbox (alert_id, channel);
CREATE INDEX ix_outbox_state_lease ON outbox (state, lease_until);
CREATE TABLE runs ( id VARCHAR(64) NOT NULL, project VARCHAR(200) NOT NULL, name VARCHAR(200) NOT NULL, status VARCHAR(16) NOT NULL, started_at FLOAT NOT NULL, ended_at FLOAT, last_step BIGINT, last_seen FLOAT NOT NULL, last_seq BIGINT NOT NULL, host VARCHAR(255) NOT NULL, pid INTEGER NOT NULL, end_reason VARCHAR(200), traceback TEXT, stalled_at FLOAT, stall_stacks TEXT, config TEXT NOT NULL, env TEXT NOT NULL, job_id VARCHAR(64), job_key VARCHAR(128), secret_hash VARCHAR(64), worker VARCHAR(64), PRIMARY KEY (id) );
CREATE INDEX ix_runs_job_id ON runs (job_id);
CREATE INDEX ix_runs_job_key ON runs (project, job_key);
CREATE INDEX ix_runs_started_at ON runs (started_at);
CREATE TABLE series ( run_id VARCHAR(64) NOT NULL, name VARCHAR(256) NOT NULL, PRIMARY KEY (run_id, name) );
CREATE TABLE sessions ( hash VARCHAR(64) NOT NULL, token_id VARCHAR(16) NOT NULL, expires_at FLOAT NOT NULL, PRIMARY KEY (hash) );
CREATE INDEX ix_sessions_token ON sessions (token_id);
CREATE TABLE silences ( id VARCHAR(64) NOT NULL, run_id VARCHAR(64) NOT NULL, rule VARCHAR(64) NOT NULL, subject VARCHAR(128) NOT NULL, until FLOAT NOT NULL, created_at FLOAT NOT NULL, created_by VARCHAR(200), PRIMARY KEY (id) );
CREATE TABLE tokens ( id VARCHAR(16) NOT NULL, name VARCHAR(200) NOT NULL, project VARCHAR(200) NOT NULL, role VARCHAR(16) NOT NULL, hash VARCHAR(64) NOT NULL, created_at FLOAT NOT NULL, revoked_at FLOAT, PRIMARY KEY (id) );
