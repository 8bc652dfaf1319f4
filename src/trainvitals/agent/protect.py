"""Protective actions the agent takes by itself, before a crash. Off unless asked for.

``VitalsCallback(protect=Protection(...))`` can, on its own and without the server:

- at the first NaN/Inf step, stop training and put back the last weights known to be finite
  (and save them), so ``fit`` returns a usable model instead of a poisoned one;
- when its own forecast says memory runs out within ``oom_eta`` seconds, save the weights
  (and, if asked, stop training cleanly) before the kernel's OOM killer ends the process.

The memory forecast is the server's ``oom_forecast`` rule (:mod:`trainvitals.detect`),
run on the agent's own samples.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from trainvitals.detect.base import Context
from trainvitals.detect.memory import OomForecastRule
from trainvitals.detect.settings import OomForecast
from trainvitals.detect.types import Record
from trainvitals.exceptions import ConfigurationError

log = logging.getLogger("trainvitals")


@dataclass(frozen=True)
class Protection:
    """What the callback may do by itself when training is about to be lost.

    Args:
        checkpoint_path: where emergency weights are saved with ``model.save_weights`` (a
            ``.weights.h5`` path). Without it weights are restored in memory only.
        on_nonfinite: ``"stop"``: at the first NaN/Inf, stop training and restore the last
            weights known to be finite (saved to ``checkpoint_path``); ``"none"``.
        on_oom: ``"checkpoint"``: save the weights when the memory forecast's ETA drops under
            ``oom_eta``; ``"stop"``: save them and stop training cleanly; ``"none"``.
        oom_eta: seconds of forecast headroom that trigger ``on_oom`` (default 300).
        good_every: steps between in-memory copies of weights known to be finite (the first
            is taken as fit begins). Each copy costs one device-to-host copy of the weights
            (default 100).
        forecast: the forecast's settings (the server's defaults unless given).

    Example:
        ```python
        protect = trainvitals.Protection("rescue.weights.h5", on_oom="stop")
        model.fit(x, y, callbacks=[trainvitals.VitalsCallback(protect=protect)])
        ```
    """

    checkpoint_path: str | None = None
    on_nonfinite: Literal["stop", "none"] = "stop"
    on_oom: Literal["checkpoint", "stop", "none"] = "checkpoint"
    oom_eta: float = 300.0
    good_every: int = 100
    forecast: OomForecast = field(default_factory=OomForecast)

    def __post_init__(self) -> None:
        if self.on_nonfinite not in ("stop", "none"):
            raise ConfigurationError(
                f"on_nonfinite: expected 'stop' or 'none', got {self.on_nonfinite!r}"
            )
        if self.on_oom not in ("checkpoint", "stop", "none"):
            raise ConfigurationError(
                f"on_oom: expected 'checkpoint', 'stop' or 'none', got {self.on_oom!r}"
            )


class Guard:
    """Carries out a :class:`Protection` for one ``fit`` of ``model``."""

    def __init__(self, protection: Protection, model: Any) -> None:
        self.protection = protection
        self.model = model
        self.good_step: int | None = None
        self._good: list[Any] | None = None
        # (step, weights) copies not yet known to be older than the newest good one.
        self._copies: list[tuple[int, list[Any]]] = []
        self._copied = 0
        self._lock = threading.Lock()
        self._rescue = False
        self._forecast = OomForecastRule(Context(), protection.forecast)
        self._oom = threading.Event()
        self._oom_done = False
        self.oom_eta: float | None = None
        self.actions: list[str] = []
        if protection.on_nonfinite != "none" and protection.good_every > 0:
            # The weights fit starts from (step 0), if finite: a NaN/Inf before the first
            # copy every good_every steps would otherwise have none to restore, and leave the
            # model poisoned.
            self._copy(0)

    # -- called from the sampler thread -------------------------------------------------------

    def on_system(self, step: int, time: float, values: Mapping[str, float]) -> None:
        record = Record(step, time, dict(values))
        self._forecast.context.note(record)
        for finding in self._forecast.observe(record):
            eta = finding.evidence.get("eta_s")
            if finding.firing and eta is not None and eta <= self.protection.oom_eta:
                self.oom_eta = float(eta)
                self._oom.set()

    # -- called from Keras's hooks --------------------------------------------------------------

    def after_step(self, step: int) -> None:
        """On the training thread, after an execution ending at ``step``: every
        ``good_every`` steps, copy the weights (one device-to-host copy) if they are finite.
        The copy is kept until a later one is known to come before any NaN/Inf step: the
        vitals reach the host a fraction of a second after their step."""
        every = self.protection.good_every
        if self.protection.on_nonfinite == "none" or every <= 0 or self._rescue:
            return
        if step // every <= self._copied // every:
            return
        self._copied = step
        self._copy(step)

    def _copy(self, step: int) -> None:
        """Keep a copy of the weights as they are after ``step``, if they are all finite (a
        model not built yet has none to keep)."""
        weights = self.model.get_weights()
        if weights and all(np.all(np.isfinite(w)) for w in weights if w.dtype.kind == "f"):
            with self._lock:
                self._copies.append((step, weights))

    def healthy_upto(self, step: int) -> None:
        """Every step up to ``step`` had finite vitals: the newest copy taken by then is the
        one to restore; older copies go."""
        with self._lock:
            if self._rescue:
                return
            confirmed = [i for i, (taken, _) in enumerate(self._copies) if taken <= step]
            if confirmed:
                del self._copies[: confirmed[-1]]
                self.good_step = self._copies[0][0]

    def nonfinite_step(self, step: int) -> str | None:
        """The first NaN/Inf step: stop, to restore the good weights when ``fit`` returns."""
        with self._lock:
            if self.protection.on_nonfinite != "stop" or self._rescue:
                return None
            self._rescue = True
            before = [(taken, weights) for taken, weights in self._copies if taken < step]
            self.good_step, self._good = before[-1] if before else (None, None)
            self._copies = []
        self.model.stop_training = True
        action = f"training stopped at step {step}"
        if self.good_step is not None:
            action += f"; the weights of step {self.good_step} will be restored"
            if self.protection.checkpoint_path:
                action += f" and saved to {self.protection.checkpoint_path}"
            action += " when fit returns"
        self.actions.append(action)
        return action

    def before_step(self) -> None:
        """Between steps, on the training thread: act on a memory forecast."""
        if not self._oom.is_set() or self._oom_done or self.protection.on_oom == "none":
            return
        self._oom_done = True
        what = f"memory runs out in about {self.oom_eta:.0f} s"
        path = self.protection.checkpoint_path
        if path:
            self.model.save_weights(path)
            what += f": weights saved to {path}"
        if self.protection.on_oom == "stop":
            self.model.stop_training = True
            what += "; training stopped"
        log.warning("trainvitals: %s", what)
        self.actions.append(what)

    def at_end(self) -> None:
        """``fit`` returned: hand back the last good weights if a NaN/Inf stopped it."""
        if not self._rescue or self._good is None:
            return
        self.model.set_weights(self._good)
        where = ""
        if self.protection.checkpoint_path:
            self.model.save_weights(self.protection.checkpoint_path)
            where = f" and saved to {self.protection.checkpoint_path}"
        log.warning(
            "trainvitals: NaN/Inf stopped training; the weights of step %d are restored%s",
            self.good_step,
            where,
        )
