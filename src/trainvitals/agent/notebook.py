"""The run shown inline in a notebook: its link and its dashboard page in an ``IFrame``.

Jupyter, JupyterLab and VS Code run notebooks on an ipykernel (``ZMQInteractiveShell``),
Colab on a shell of its own (``google.colab``); a terminal IPython or a plain script has
neither, and gets the one-line link instead. IPython is never imported here: a process
without it loaded is not in a notebook. ``TRAINVITALS_NOTEBOOK=0`` turns the inline view off.
"""

from __future__ import annotations

import html
import logging
import os
import sys
from typing import Any

log = logging.getLogger("trainvitals")

#: The IFrame's height in pixels: the run page's header and its first charts.
HEIGHT = 640


def kernel() -> Any:
    """The notebook kernel's shell, or None outside a notebook (IPython not loaded, no
    shell, or a terminal one)."""
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    if get_ipython is None:
        return None
    try:
        shell = get_ipython()
    except Exception:
        return None
    kind = type(shell)
    if kind.__name__ == "ZMQInteractiveShell" or kind.__module__.startswith("google.colab"):
        return shell
    return None


def enabled(inline: bool | None) -> bool:
    """Whether to show runs inline: ``inline`` if given, else not when
    ``TRAINVITALS_NOTEBOOK`` is ``0``/``false``/``off``/``no``."""
    if inline is not None:
        return inline
    return os.environ.get("TRAINVITALS_NOTEBOOK", "").strip().lower() not in (
        "0", "false", "off", "no",
    )  # fmt: skip


def show(url: str, run_name: str, inline: bool | None = None) -> bool:
    """Display the run's link and page in the notebook's output; whether it did (False:
    not in a notebook, or turned off; the caller then prints the link)."""
    if not enabled(inline) or kernel() is None:
        return False
    try:
        import IPython.display
    except ImportError:
        return False
    ipython: Any = IPython.display  # untyped
    try:
        link = html.escape(url, quote=True)
        ipython.display(
            ipython.HTML(
                f"<div>trainvitals: View run <strong>{html.escape(run_name)}</strong> at "
                f'<a href="{link}" target="_blank" rel="noopener">{link}</a></div>'
            )
        )
        ipython.display(ipython.IFrame(url, width="100%", height=HEIGHT))
    except Exception as exc:  # a front-end that cannot display: the line instead
        log.debug("trainvitals: cannot show the run inline: %s", exc)
        return False
    return True
