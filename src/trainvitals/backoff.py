"""Reconnect and retry delays: exponential with full jitter, so that agents reconnecting to a
restarted server, or a server retrying a webhook, don't arrive all at once.

Used by the agent's sender and watchdog and by the server's notification delivery; plain
Python, so the light agent can import it.

The jitter comes from this module's own generator, never from :mod:`random`'s shared one: the
agent's sender runs inside the training process, where the shared generator is the user's
(``keras.utils.set_random_seed`` seeds it, and Keras draws every unseeded initializer's seed
from it). A draw there at each reconnect would make a seeded run's next layer, or a data
loader's next shuffle, depend on when the network failed.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

#: Seeded from the operating system's entropy when this module is imported, and again in each
#: forked child (as :mod:`random` reseeds its own): children must not back off in step.
_jitter = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_jitter.seed)


def backoff_delays(
    initial: float = 0.2, factor: float = 2.0, maximum: float = 10.0
) -> Iterator[float]:
    """Endless delays (seconds): each drawn uniformly below a ceiling that starts at
    ``initial`` and grows by ``factor`` up to ``maximum``.

    Example:
        >>> delays = backoff_delays(initial=1.0, maximum=4.0)
        >>> all(0.0 <= next(delays) <= ceiling for ceiling in (1.0, 2.0, 4.0, 4.0))
        True
    """
    ceiling = initial
    while True:
        yield _jitter.uniform(0.0, ceiling)
        ceiling = min(ceiling * factor, maximum)
