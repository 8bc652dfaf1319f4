"""The trainvitals server: ingests agent streams, stores them, serves the API and dashboard.

Install with ``pip install 'trainvitals[server]'`` and run ``trainvitals serve``.

``create_app`` and ``Settings`` are loaded when first asked for: a command that needs only the
store (``trainvitals token``, ``trainvitals db``) does not pay for the web application's imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainvitals.server.app import create_app
    from trainvitals.server.settings import Settings

__all__ = ["Settings", "create_app"]

#: Where each public name is defined.
_HOMES = {"create_app": "trainvitals.server.app", "Settings": "trainvitals.server.settings"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
