"""The REST API fuzzed from its own ``/openapi.json`` by schemathesis, with an admin token,
against a real team server: no answer is a 5xx, every answer matches the documented shape,
content type and status codes, and malformed input is refused with a 4xx.

The schema is the app's own, built in-process at collection time (it does not depend on
the database); the requests go over HTTP to a ``trainvitals serve`` subprocess. Every run
is bounded and seeded by Hypothesis's settings, so it is the same few thousand requests
each time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from harness.processes import ServerProcess, create_token, stream
from trainvitals.server import Settings, create_app

SCHEMA = schemathesis.openapi.from_dict(create_app(Settings(db="sqlite://")).openapi())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    db = str(tmp_path_factory.mktemp("schemathesis") / "team.db")
    token = create_token(db, "*", "admin", "fuzzer")
    server = ServerProcess(db, args=["--auth", "required"], token=token)
    stream(server, token, "p")  # a run and a firing alert, so lists are not empty
    try:
        yield server
    finally:
        server.stop()


@SCHEMA.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
def test_the_api_keeps_its_documented_contract_under_fuzzing(
    case: schemathesis.Case[Any], server: ServerProcess
) -> None:
    case.call_and_validate(
        base_url=server.url,
        headers={"Authorization": f"Bearer {server.token}"},
        # Starlette answers a method no route of a path takes with the Allow of one of that
        # path's routes (GET, POST and DELETE /session are three routes), not their union.
        excluded_checks=[schemathesis.checks.allow_header_conformance],
    )
