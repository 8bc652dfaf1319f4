"""Notifications: alerts to Slack, PagerDuty, email, Teams, Discord and signed JSON
webhooks, through a persistent outbox.

- :mod:`~trainvitals.server.notify.config`: the channels file (routing, pace, secrets);
- :mod:`~trainvitals.server.notify.text`: what every channel says, in plain words;
- :mod:`~trainvitals.server.notify.messages`: what is sent (pure: Block Kit, JSON, HMAC),
  with :mod:`~trainvitals.server.notify.pagerduty`, :mod:`~trainvitals.server.notify.mail`
  and :mod:`~trainvitals.server.notify.chat` (Teams, Discord) for their kinds;
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
