"""The type of a JSON value, for what is JSON by nature and has no shape of its own.

Frames and answers with a known shape have their own ``TypedDict``s (``protocol.py``,
``client/answers.py``); :data:`Json` is for the rest: a run's hyper-parameters as the user gives
them, an alert's evidence, a frame from the server before it is told apart. Plain typing: the
light agent imports it.

Example:
    ```python
    config: JsonObject = {"lr": 3e-4, "layers": [64, 64], "optimizer": {"name": "adam"}}
    ```
"""

from __future__ import annotations

from typing import TypeAlias

#: Any JSON value: what ``json.loads`` can give.
Json: TypeAlias = "dict[str, Json] | list[Json] | str | int | float | bool | None"
#: A JSON object: its keys are strings, its values any JSON.
JsonObject: TypeAlias = "dict[str, Json]"
