"""``GET /metrics`` of a real server, scraped and read with ``prometheus_client``'s parser."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from harness.processes import ServerProcess

#: Each sample's value by its name and labels.
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def scrape(server: ServerProcess, token: str | None) -> tuple[int, str]:
    """The status and body of ``server``'s ``/metrics``, asked with ``token``."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(server.url + "/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
