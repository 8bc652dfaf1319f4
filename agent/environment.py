"""What the run's ``hello`` says about where it runs."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any


def describe() -> dict[str, Any]:
    """Host, process and library versions. Imports nothing heavy: frameworks are only
    reported when the training script already imported them."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "argv": list(sys.argv),
        "cwd": os.getcwd(),
    }
    for module in ("tensorflow", "keras", "numpy"):
        loaded = sys.modules.get(module)
        version = getattr(loaded, "__version__", None) if loaded else None
        if version:
            env[module] = str(version)
    return env


def host() -> str:
    return socket.gethostname()
