"""One meaning of waiting on a turn, from Python and over HTTP: by default a wait returns
once the turn settles (final, or parked awaiting approval, which the status tells);
``until="final"`` waits past a park. Both paths run the same body against real workers and
a real gateway process."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from convoq.client import Client
from convoq.errors import ConvoqError, TurnTimeoutError
from tests.support.gateway import GatewayProcess, module_gateway
from tests.support.workers import WorkerPool, module_pool

pytestmark = pytest.mark.slow

pool = module_pool(1)
gateway = module_gateway()

# (conversation, turn, until or None for the default, seconds) -> (status, pending call ids)
Wait = Callable[[str, str, str | None, float], tuple[str, list[str]]]


@pytest.fixture
def client(pool: WorkerPool) -> Iterator[Client]:
    with pool.client() as started:
        yield started


def _python_wait(client: Client) -> Wait:
    def wait(cid: str, tid: str, until: str | None, seconds: float) -> tuple[str, list[str]]:
        options: dict[str, Any] = {} if until is None else {"until": until}
        try:
            result = client.handle(cid, tid).wait(seconds, **options)
        except TurnTimeoutError as exc:
            # Python says so with an error; the status it carries is where the turn stands.
            return str(exc.details["status"]), []
        return result.status, [call.id for call in result.pending_approvals]

    return wait


def _http_wait(http: httpx.Client) -> Wait:
    def wait(cid: str, tid: str, until: str | None, seconds: float) -> tuple[str, list[str]]:
        params: dict[str, Any] = {"wait": seconds} | ({} if until is None else {"until": until})
        response = http.get(f"/v1/conversations/{cid}/turns/{tid}", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        return body["status"], [call["id"] for call in body["pending_approvals"]]

    return wait


@pytest.fixture(params=["python", "http"])
def wait(request: pytest.FixtureRequest, client: Client, gateway: GatewayProcess) -> Iterator[Wait]:
    if request.param == "python":
        yield _python_wait(client)
        return
    with gateway.client() as http:
        yield _http_wait(http)


def test_a_wait_returns_when_the_turn_parks_and_until_final_waits_past_it(
    client: Client, wait: Wait
) -> None:
    cid = f"wait-{uuid.uuid4().hex[:8]}"
    handle = client.submit(cid, "pay", agent="approver")

    status, pending = wait(cid, handle.turn_id, None, 30)
    assert status == "awaiting_approval" and len(pending) == 1
    assert wait(cid, handle.turn_id, "settled", 30) == (status, pending)
    # Parked turns wait for a person: a wait for the final status runs out meanwhile.
    assert wait(cid, handle.turn_id, "final", 1)[0] == "awaiting_approval"

    client.approve(handle, pending[0])
    assert wait(cid, handle.turn_id, "final", 30) == ("succeeded", [])
    assert wait(cid, handle.turn_id, None, 30) == ("succeeded", [])


def test_a_turn_without_approvals_is_waited_for_until_final_either_way(
    client: Client, wait: Wait
) -> None:
    cid = f"wait-{uuid.uuid4().hex[:8]}"
    handle = client.submit(cid, "hello", agent="echo")
    assert wait(cid, handle.turn_id, None, 30) == ("succeeded", [])


def test_an_unknown_until_is_refused(client: Client, gateway: GatewayProcess) -> None:
    handle = client.submit(f"wait-{uuid.uuid4().hex[:8]}", "hello", agent="echo")
    with pytest.raises(ConvoqError, match="until must be 'settled' or 'final'"):
        handle.wait(30, until="soon")  # type: ignore[arg-type]
    with gateway.client() as http:
        url = f"/v1/conversations/{handle.conversation_id}/turns/{handle.turn_id}"
        assert http.get(url, params={"wait": 1, "until": "soon"}).status_code == 422


def test_a_wait_after_every_call_is_decided_waits_for_the_resumed_turn(
    client: Client, pool: WorkerPool, wait: Wait
) -> None:
    cid = f"wait-{uuid.uuid4().hex[:8]}"
    handle = client.submit(cid, "pay", agent="approver")
    _, pending = wait(cid, handle.turn_id, None, 30)
    pool.stop_all()  # nobody resumes the turn until the wait below has begun
    starter = threading.Thread(target=pool.start, args=(1,))
    try:
        client.approve(handle, pending[0])
        assert handle.status() == "awaiting_approval"  # the record, until a worker takes it
        starter.start()
        # Decided calls wait for a worker, not a person: the wait goes on to the end.
        assert wait(cid, handle.turn_id, None, 60) == ("succeeded", [])
    finally:
        if starter.is_alive():
            starter.join(90)
        if not pool.workers:
            pool.start(1)
