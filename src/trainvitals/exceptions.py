"""Every exception trainvitals raises, in one tree.

All derive from :class:`TrainvitalsError`, so ``except trainvitals.TrainvitalsError`` catches
everything the package raises on purpose. Telemetry failures during training are never raised:
they become one logged warning (see :mod:`trainvitals.agent.transport`). Messages say what was
expected and what arrived.

    TrainvitalsError
    ├── ConfigurationError     a bad argument, environment variable or settings file (ValueError)
    │   ├── RulesError         the alert rules file or a rule override
    │   ├── NotifyError        the notification channels file or one channel
    │   └── StorageError       the database URL, or a database that can't be reached
    ├── ProtocolError          a frame that breaks the wire protocol (docs/protocol.md)
    │   ├── FrameError         not JSON, or JSON that is not a valid frame (server side)
    │   └── IngestRejected     a valid frame at the wrong place: closes with a code and reason
    ├── SpoolError             a spool left on disk that cannot be read or delivered
    │                          (trainvitals sync): what is wrong, and where
    ├── WriterClosed           a write submitted after the server's writer has stopped
    ├── StorageUnavailable     the database cannot store now (down, full, locked): try later
    └── ApiError               a request of trainvitals.Api (or trainvitals export) that failed:
                               the server's status and reason, or why it was not reached

This module imports nothing, so the light agent and the server share it.
"""

from __future__ import annotations

__all__ = [
    "ApiError",
    "ConfigurationError",
    "FrameError",
    "IngestRejected",
    "NotifyError",
    "ProtocolError",
    "RulesError",
    "SpoolError",
    "StorageError",
    "StorageUnavailable",
    "TrainvitalsError",
    "WriterClosed",
]


class TrainvitalsError(Exception):
    """Root of every exception trainvitals raises."""


class ConfigurationError(TrainvitalsError, ValueError):
    """A setting is malformed, e.g. a server URL that is not http(s)://host:port."""


class RulesError(ConfigurationError):
    """A rules file or override that can't be used; the message names the bad setting."""


class NotifyError(ConfigurationError):
    """A channels file or channel that can't be used; the message names the bad setting."""


class StorageError(ConfigurationError):
    """The database is unusable: a bad URL or an unreachable server."""


class ProtocolError(TrainvitalsError):
    """A frame that breaks the wire protocol, in either direction."""


class FrameError(ProtocolError, ValueError):
    """A frame that is not valid JSON or not a valid frame; ``str()`` is a short reason."""


class IngestRejected(ProtocolError):
    """Close the connection with ``code`` and ``reason``; other runs carry on."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason


class SpoolError(TrainvitalsError):
    """A run's spool on disk that cannot be read or delivered: the message names the
    directory or file and what is wrong with it."""


class WriterClosed(TrainvitalsError, RuntimeError):
    """A write was submitted after the writer was closed."""


class StorageUnavailable(TrainvitalsError, RuntimeError):
    """The server's database cannot store now (unreachable, full, locked): nothing of the
    write was stored; the writer tries the database again with backoff meanwhile."""


class ApiError(TrainvitalsError):
    """A request to a server that failed: ``status`` is the HTTP status (None when the server
    was not reached or broke off), ``reason`` what the server said, or what went wrong."""

    def __init__(self, status: int | None, reason: str) -> None:
        super().__init__(f"{status}: {reason}" if status is not None else reason)
        self.status = status
        self.reason = reason
