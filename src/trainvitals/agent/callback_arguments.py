"""What a ``VitalsCallback`` was made with: what a copy of it is made from.

KerasTuner deep-copies a search's callbacks for each trial. A copy of the callback's state
would record into the same run, with the same locks; so a copy is made again from the
arguments as given (see :meth:`VitalsCallback.__deepcopy__
<trainvitals.VitalsCallback.__deepcopy__>`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainvitals.agent.protect import Protection
    from trainvitals.agent.sampler import Source

__all__ = ["CallbackArguments"]


@dataclass
class CallbackArguments:
    """``VitalsCallback``'s arguments, one field each, as given."""

    server: str | None
    project: str | None
    run_name: str | None
    token: str | None
    config: dict[str, Any] | None
    flush_interval: float
    read_interval: float
    grad_norms_every: int
    weights_every: int
    system_metrics: float | bool
    gpu: Source | None
    watchdog: bool
    protect: Protection | None
    ring_capacity: int
    notebook: bool | None

    def again(self, memo: dict[int, Any], deep: bool) -> CallbackArguments:
        """The arguments of a copy: deep copies (with ``memo``) where ``deep``, except the GPU
        source (it reads a device) and a ``config`` that cannot be deep-copied, copied then
        as a new dict whose values are shared (it is only read); the rest are plain values."""
        config = self.config
        if deep and config is not None:
            try:
                # With a memo of its own: a deep copy that fails halfway leaves its half-made
                # parts in its memo, which must not be the caller's.
                config = copy.deepcopy(config)
            except Exception:  # a value that cannot be copied: the config is only read
                config = dict(config)
        protect = copy.deepcopy(self.protect, memo) if deep else self.protect
        return replace(self, config=config, protect=protect)
