"""trainvitals: live training-health monitoring for TensorFlow/Keras.

``import trainvitals`` is light: TensorFlow and Keras load only when the Keras callback is
first touched, httpx when ``trainvitals.Api`` (the HTTP client) is, and the server's web
stack is never imported here.

Example:
    ```python
    import trainvitals

    model.fit(x, y, epochs=5, callbacks=[trainvitals.VitalsCallback(project="mnist")])
    ```
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainvitals.agent.config import AgentConfig, resolve
from trainvitals.agent.monitor import Monitor
from trainvitals.agent.run import Run
from trainvitals.exceptions import ConfigurationError, TrainvitalsError

if TYPE_CHECKING:
    from trainvitals.agent.keras_callback import VitalsCallback
    from trainvitals.agent.protect import Protection
    from trainvitals.client import Api

__version__ = "0.1.0"

__all__ = [
    "AgentConfig",
    "Api",
    "ConfigurationError",
    "Monitor",
    "Protection",
    "Run",
    "TrainvitalsError",
    "VitalsCallback",
    "__version__",
    "resolve",
]


def __getattr__(name: str) -> Any:
    if name == "VitalsCallback":
        from trainvitals.agent.keras_callback import VitalsCallback

        return VitalsCallback
    if name == "Api":  # the HTTP client needs httpx, which the light agent lacks
        from trainvitals.client import Api

        return Api
    if name == "Protection":  # its memory forecast uses numpy, which the light agent lacks
        from trainvitals.agent.protect import Protection

        return Protection
    if name == "SimulatedGpu":  # a test double, not part of the API; kept for older scripts
        from trainvitals.agent.gpu import SimulatedGpu

        return SimulatedGpu
    raise AttributeError(f"module 'trainvitals' has no attribute {name!r}")
