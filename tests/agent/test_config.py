from __future__ import annotations

from pathlib import Path

import pytest

from trainvitals import ConfigurationError, resolve
from trainvitals.agent.config import websocket_url


def test_defaults_come_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINVITALS_SERVER", "http://10.0.0.5:9000")
    monkeypatch.setenv("TRAINVITALS_PROJECT", "mnist")
    monkeypatch.setenv("TRAINVITALS_TOKEN", "s3cret")
    config = resolve()
    assert config.server == "http://10.0.0.5:9000"
    assert config.project == "mnist"
    assert config.token == "s3cret"
    assert config.run_name.startswith("run-")
    assert config.ingest_url == "ws://10.0.0.5:9000/api/v1/ingest"
    # A run's connections name it: a load balancer keeps them on one replica.
    assert config.run_ingest_url("r-1.a") == "ws://10.0.0.5:9000/api/v1/ingest?run=r-1.a"


def test_arguments_override_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINVITALS_PROJECT", "from-env")
    config = resolve(server="https://tv.example.org/base/", project="given", run_name="r1")
    assert (config.project, config.run_name) == ("given", "r1")
    assert config.ingest_url == "wss://tv.example.org/base/api/v1/ingest"


def test_unset_environment_gives_local_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TRAINVITALS_SERVER", "TRAINVITALS_PROJECT", "TRAINVITALS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    config = resolve()
    assert (config.server, config.project, config.token) == (
        "http://127.0.0.1:8600",
        "default",
        None,
    )


@pytest.mark.parametrize("bad", ["10.0.0.5:8600", "ftp://host", "http://"])
def test_bad_server_url_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="Expected a server URL"):
        websocket_url(bad, "/x")


def test_spool_settings_come_from_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TRAINVITALS_SPOOL_DIR", str(tmp_path))
    monkeypatch.setenv("TRAINVITALS_SPOOL_MAX_BYTES", "1000000")
    monkeypatch.setenv("TRAINVITALS_SPOOL_AFTER_BYTES", "4096")
    config = resolve()
    assert (config.spool_dir, config.spool_max_bytes, config.spool_after_bytes) == (
        tmp_path,
        1_000_000,
        4096,
    )
    assert resolve(spool_dir="/x", spool_after_bytes=1).spool_after_bytes == 1  # arguments win


def test_spool_defaults_to_the_user_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TRAINVITALS_SPOOL_DIR", "TRAINVITALS_SPOOL_MAX_BYTES", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    config = resolve()
    assert config.spool_dir == Path.home() / ".cache" / "trainvitals" / "spool"
    assert config.spool_max_bytes == 512 * 2**20


@pytest.mark.parametrize("bad", ["0", "-5", "1.5G", "lots"])
def test_bad_spool_size_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("TRAINVITALS_SPOOL_MAX_BYTES", bad)
    with pytest.raises(ConfigurationError, match=r"\$TRAINVITALS_SPOOL_MAX_BYTES.*bytes"):
        resolve()
