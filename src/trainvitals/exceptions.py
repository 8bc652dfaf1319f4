"""Exceptions raised by trainvitals.

All derive from :class:`TrainvitalsError`, so ``except trainvitals.TrainvitalsError`` catches
everything the package raises on purpose. Telemetry failures during training are never raised:
they become one logged warning (see ``trainvitals.agent.transport``).

    TrainvitalsError
    └── ConfigurationError   a bad argument or environment variable
"""

from __future__ import annotations


class TrainvitalsError(Exception):
    """Root of every exception trainvitals raises."""


class ConfigurationError(TrainvitalsError, ValueError):
    """A setting is malformed, e.g. a server URL that is not http(s)://host:port."""
