"""Notifications: alerts to Slack and signed JSON webhooks, through a persistent outbox.

- :mod:`~trainvitals.server.notify.config`: the channels file (routing, pace, secrets);
- :mod:`~trainvitals.server.notify.messages`: what is sent (pure: Block Kit, JSON, HMAC);
- :mod:`~trainvitals.server.notify.delivery`: how it is sent (retries, rate, grouping);
- :mod:`~trainvitals.server.notify.outbox`: the notifier that ties them to stored alerts;
- :mod:`~trainvitals.server.notify.store`: the outbox's table and queries.

See ``docs/notifications.md``.
"""

from __future__ import annotations

from trainvitals.exceptions import NotifyError
from trainvitals.server.notify.config import Channel, NotifyConfig, load_notify
from trainvitals.server.notify.messages import sign, verify_signature
from trainvitals.server.notify.outbox import Notifier

__all__ = [
    "Channel",
    "Notifier",
    "NotifyConfig",
    "NotifyError",
    "load_notify",
    "sign",
    "verify_signature",
]
