"""The trainvitals server: ingests agent streams, stores them, serves the API and dashboard.

Install with ``pip install 'trainvitals[server]'`` and run ``trainvitals serve``.
"""

from __future__ import annotations

from trainvitals.server.app import create_app
from trainvitals.server.settings import Settings

__all__ = ["Settings", "create_app"]
