"""Double texting on real workers, through the client and the gateway: a message sent
while a turn runs interrupts it (its finished steps stored, the new message answered with
them), rolls it back (nothing of it stored) or merges with the messages waiting behind it
(one answer); with turns already queued, with an approval pending, and on an idle
conversation. The scripted model holds its first call until the test opens a gate, so the
turn is running when the next message comes (no timing race)."""

from __future__ import annotations

import json
import uuid

import pytest
import redis
from typer.testing import CliRunner

from convoq.cli import app
from convoq.client import AsyncClient, Client
from convoq.errors import ConvoqError
from convoq.messages import FilePart, ImagePart, Message, TextPart
from convoq.worker._interrupts import NOT_RUN
from tests.support.gateway import GatewayProcess, module_gateway, turns_path
from tests.support.workers import WorkerPool, module_pool, wait_until, webhook_receiver

AGENTS = "tests.support.texting_agents"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x03" * 64
PDF = b"%PDF-1.4\n" + b"\x04" * 64

pool = module_pool(1, agents=AGENTS, lease_ms=3000)
gateway = module_gateway()


def _cid(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def hold(r: redis.Redis, pool: WorkerPool, text: str) -> None:
    """Wait until the model call of the turn saying ``text`` is running (and held)."""
    key = f"{pool.prefix}:test:held"
    wait_until(lambda: text.encode() in r.lrange(key, 0, -1), 60, what=f"{text!r} held")


def release(r: redis.Redis, pool: WorkerPool, text: str) -> None:
    r.rpush(f"{pool.prefix}:test:gate:{text}", "go")


def users_said(client: Client, cid: str) -> list[str]:
    return [" ".join(p.text for p in m.content if isinstance(p, TextPart))
            for m in client.history(cid) if m.role == "user"]  # fmt: skip


def test_an_interrupt_stores_the_finished_steps_and_answers_with_them(
    pool: WorkerPool, client: Client, r: redis.Redis
) -> None:
    cid, first = _cid("interrupt"), "[hold][tool] book a flight"
    with webhook_receiver() as hooks:
        a = client.submit(cid, first, agent="texter", callback_url=f"{hooks.url}/a")
        hold(r, pool, first)
        b = client.submit(cid, "make it a train", agent="texter", if_busy="interrupt")
        release(r, pool, first)
        stopped = a.wait(60, raise_on_error=False)
        answered = b.wait(60)
        posts = wait_until(lambda: hooks.posts("/a"), 60, what="the webhook")
    assert stopped.status == "interrupted" and stopped.stopped_by == b.turn_id, stopped
    # The model call that was running finished; the tool it asked for never ran.
    assert [m.role.value for m in stopped.turn] == ["user", "assistant", "tool"]
    assert stopped.turn[2].text == NOT_RUN.format(by=b.turn_id)
    assert r.lrange(f"{pool.prefix}:test:lookups", 0, -1) == []
    assert answered.text == f"re: make it a train | seen: {first} / make it a train"
    assert users_said(client, cid) == [first, "make it a train"]
    requested = [e.data for e in a.events(timeout=10) if e.type == "stop_requested"]
    assert requested == [{"mode": "interrupt", "by": b.turn_id}]
    payload = json.loads(posts[0][3])
    assert payload["status"] == "interrupted" and payload["turn_id"] == a.turn_id
    assert payload["stopped_by"] == b.turn_id


def test_a_rollback_stores_nothing_of_the_running_turn(
    pool: WorkerPool, client: Client, r: redis.Redis
) -> None:
    cid, first = _cid("rollback"), "[hold] long question"
    with webhook_receiver() as hooks:
        a = client.submit(cid, first, agent="texter", callback_url=f"{hooks.url}/r")
        hold(r, pool, first)
        b = client.submit(cid, "short one", agent="texter", if_busy="rollback")
        try:
            stopped = a.wait(60, raise_on_error=False)  # within a lease period: not held on
        finally:
            release(r, pool, first)
        posts = wait_until(lambda: hooks.posts("/r"), 60, what="the webhook")
    payload = json.loads(posts[0][3])
    assert (payload["status"], payload["stopped_by"]) == ("cancelled", b.turn_id)
    assert "rolled back" in payload["error"]["message"] and b.turn_id in payload["error"]["message"]
    assert stopped.status == "cancelled" and stopped.stopped_by == b.turn_id
    assert stopped.error is not None
    assert stopped.error.details == {"reason": "rolled_back", "by": b.turn_id}
    assert b.wait(60).text == "re: short one | seen: short one"
    assert users_said(client, cid) == ["short one"]


def test_merged_messages_get_one_answer_with_their_attachments_in_order(
    pool: WorkerPool, client: Client, r: redis.Redis
) -> None:
    cid, first = _cid("merge"), "[hold] first"
    a = client.submit(cid, first, agent="texter")
    hold(r, pool, first)
    with webhook_receiver() as hooks:
        url = f"{hooks.url}/m"  # an option like any: the merged messages share it
        b = client.submit(cid, "second", agent="texter", if_busy="merge", callback_url=url)
        image = ImagePart(data=PNG, mime_type="image/png")
        c = client.submit(cid, Message(content=[TextPart(text="third"), image]), agent="texter",
                          if_busy="merge", callback_url=url)  # fmt: skip
        pdf = FilePart(data=PDF, mime_type="application/pdf", filename="plan.pdf")
        fourth = Message(content=[pdf, TextPart(text="fourth")])
        d = client.submit(cid, fourth, agent="texter", if_busy="merge", callback_url=url,
                          idempotency_key="d-1")  # fmt: skip
        # Resent after a lost reply: the same answer, nothing merged twice.
        again = client.submit(cid, fourth, agent="texter", if_busy="merge", callback_url=url,
                              idempotency_key="d-1")  # fmt: skip
        assert again.repeated and (again.turn_id, again.merged_from) == (b.turn_id, d.merged_from)
        release(r, pool, first)
        assert b.merged_from is None and c.turn_id == d.turn_id == b.turn_id
        assert c.merged_from is not None and d.merged_from is not None
        assert a.wait(60).ok
        result = c.wait(60)
        posts = wait_until(lambda: hooks.posts("/m"), 60, what="the webhook")
    assert result.text == (
        "re: second third fourth | seen: [hold] first / second third fourth"
        " | files: image/png:None, application/pdf:plan.pdf"
    )
    assert result.merged == (c.merged_from, d.merged_from)
    assert json.loads(posts[0][3])["merged"] == [c.merged_from, d.merged_from]
    assert len(posts) == 1  # one answer, one callback
    own = client.handle(cid, c.merged_from).wait(10, raise_on_error=False)
    assert (own.status, own.merged_into) == ("merged", b.turn_id)
    stored = [m for m in client.history(cid) if m.role == "user"][-1]
    assert [type(p).__name__ for p in stored.content] == [
        "TextPart",
        "TextPart",
        "ImagePart",
        "FilePart",
        "TextPart",
    ]
    assert (stored.content[2].data, stored.content[3].data) == (PNG, PDF)  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["interrupt", "rollback"])
def test_turns_already_queued_run_in_order_before_the_new_one(
    pool: WorkerPool, client: Client, r: redis.Redis, mode: str
) -> None:
    cid, first = _cid(f"queued-{mode}"), f"[hold][tool] first {mode}"
    a = client.submit(cid, first, agent="texter")
    hold(r, pool, first)
    queued = client.submit(cid, "queued", agent="texter")
    new = client.submit(cid, "newest", agent="texter", if_busy=mode)
    release(r, pool, first)
    ended = a.wait(60, raise_on_error=False)
    assert queued.wait(60).ok and new.wait(60).ok
    if mode == "interrupt":
        assert ended.status == "interrupted"
        assert users_said(client, cid) == [first, "queued", "newest"]
    else:
        assert ended.status == "cancelled"
        assert users_said(client, cid) == ["queued", "newest"]
    assert ended.stopped_by == new.turn_id


@pytest.mark.parametrize("mode", ["interrupt", "rollback"])
def test_a_parked_head_ends_cancelled_and_its_approval_is_void(
    pool: WorkerPool, client: Client, r: redis.Redis, mode: str
) -> None:
    cid = _cid(f"parked-{mode}")
    with webhook_receiver() as hooks:
        a = client.submit(cid, "[approve] refund it", agent="texter", callback_url=f"{hooks.url}/p")
        wait_until(lambda: a.status() == "awaiting_approval", 60, what="the approval")
        b = client.submit(cid, "never mind", agent="texter", if_busy=mode)
        ended = a.wait(10, raise_on_error=False)  # ended by the submit itself
        assert b.wait(60).text == "re: never mind | seen: never mind"
        assert hooks.posts("/p") == []  # ended by a submit, as by cancel: no callback
    reason = "rolled_back" if mode == "rollback" else "interrupted"
    assert ended.status == "cancelled" and ended.error is not None
    assert ended.error.details == {"reason": reason, "by": b.turn_id}
    with pytest.raises(ConvoqError):
        client.approve(a, "call-2")
    assert r.lrange(f"{pool.prefix}:test:refunds", 0, -1) == []


def test_an_interrupt_while_a_step_runs_ends_a_turn_that_was_to_park(
    pool: WorkerPool, client: Client, r: redis.Redis
) -> None:
    cid, first = _cid("topark"), "[holdtool] refund and look"
    a = client.submit(cid, first, agent="texter")
    hold(r, pool, first)  # its lookup runs; the refund beside it needs an approval
    b = client.submit(cid, "stop that", agent="texter", if_busy="interrupt")
    release(r, pool, first)
    stopped = a.wait(60, raise_on_error=False)
    assert stopped.status == "interrupted" and stopped.stopped_by == b.turn_id, stopped
    results = {m.tool_call_id: m.text for m in stopped.turn if m.role == "tool"}
    assert results == {"call-1": f"found {first}", "call-2": NOT_RUN.format(by=b.turn_id)}
    assert r.lrange(f"{pool.prefix}:test:refunds", 0, -1) == []
    assert b.wait(60).text == f"re: stop that | seen: {first} / stop that"


async def test_the_async_client_merges_and_rolls_back(pool: WorkerPool, r: redis.Redis) -> None:
    cid, first = _cid("async"), "[hold] async first"
    async with AsyncClient(
        pool.redis_url, broker_url=pool.env.get("CONVOQ_BROKER_URL"), prefix=pool.prefix,
        partitions=pool.partitions,
    ) as client:  # fmt: skip
        a = await client.submit(cid, first, agent="texter")
        hold(r, pool, first)
        b = await client.submit(cid, "b", agent="texter", if_busy="merge")
        c = await client.submit(cid, "c", agent="texter", if_busy="merge")
        d = await client.submit(cid, "d", agent="texter", if_busy="rollback")
        release(r, pool, first)
        assert c.turn_id == b.turn_id and c.merged_from is not None
        assert (await a.wait(60, raise_on_error=False)).stopped_by == d.turn_id
        assert (await b.wait(60)).text == "re: b c | seen: b c"  # the head rolled back
        assert (await d.wait(60)).text == "re: d | seen: b c / d"


async def test_an_interrupted_head_no_worker_started_keeps_its_message_alone(
    pool: WorkerPool,
) -> None:
    cid = _cid("unstarted")
    async with AsyncClient(
        pool.redis_url, broker_url=pool.env.get("CONVOQ_BROKER_URL"), prefix=pool.prefix,
        partitions=pool.partitions,
    ) as client:  # fmt: skip
        # Queued with no kick: no worker knows of it until the sweeper finds it.
        await client.protocol.submit(
            cid, "head-1", agent="texter", message=Message.user("first"), options={}
        )
        b = await client.submit(cid, "second", agent="texter", if_busy="interrupt")
        head = await client.handle(cid, "head-1").wait(60, raise_on_error=False)
        assert (head.status, head.stopped_by) == ("interrupted", b.turn_id)
        assert [m.role for m in head.turn] == ["user"]  # it never got to its first step
        assert (await b.wait(60)).text == "re: second | seen: first / second"


def test_an_interrupt_on_a_pydantic_ai_profile(
    pool: WorkerPool, client: Client, r: redis.Redis
) -> None:
    cid, first = _cid("pai"), "[hold][tool] pai first"
    a = client.submit(cid, first, agent="pai-texter")
    hold(r, pool, first)
    b = client.submit(cid, "pai second", agent="pai-texter", if_busy="interrupt")
    release(r, pool, first)
    stopped = a.wait(60, raise_on_error=False)
    assert stopped.status == "interrupted" and stopped.stopped_by == b.turn_id, stopped
    assert [m.role for m in stopped.turn] == ["user", "assistant", "tool"]
    assert stopped.turn[2].text == NOT_RUN.format(by=b.turn_id)
    assert b.wait(60).text == f"re: pai second | seen: {first} / pai second"


def test_on_an_idle_conversation_each_mode_just_queues_and_runs(client: Client) -> None:
    for mode in ("interrupt", "rollback", "merge"):
        cid = _cid(f"idle-{mode}")
        handle = client.submit(cid, f"hello {mode}", agent="texter", if_busy=mode)
        assert handle.merged_from is None
        assert handle.wait(60).text == f"re: hello {mode} | seen: hello {mode}"


def test_each_mode_through_the_gateway(
    pool: WorkerPool, gateway: GatewayProcess, r: redis.Redis
) -> None:
    with gateway.client() as http:

        def post(cid: str, text: str, mode: str = "queue") -> dict:
            body = {"message": text, "agent": "texter", "if_busy": mode}
            sent = http.post(turns_path(cid), json=body)
            assert sent.status_code == 202, sent.text
            return dict(sent.json())

        def view(cid: str, tid: str) -> dict:
            got = http.get(f"{turns_path(cid)}/{tid}", params={"wait": 60, "until": "final"})
            return dict(got.json())

        for mode in ("interrupt", "rollback", "merge"):
            cid, first = _cid(f"gw-{mode}"), f"[hold][tool] gateway {mode}"
            head = post(cid, first)
            hold(r, pool, first)
            queued = post(cid, "next", "merge")
            sent = post(cid, "last", mode)
            release(r, pool, first)
            stopped = view(cid, head["turn_id"])
            answer = view(cid, sent["turn_id"])
            if mode == "merge":
                assert sent["turn_id"] == queued["turn_id"] and sent["merged_from"]
                assert stopped["status"] == "succeeded"
                assert answer["text"] == f"re: next last | seen: {first} / next last"
                assert answer["merged"] == [sent["merged_from"]]
                own = view(cid, sent["merged_from"])
                assert (own["status"], own["merged_into"]) == ("merged", sent["turn_id"])
                continue
            assert stopped["stopped_by"] == sent["turn_id"] and sent["merged_from"] is None
            if mode == "interrupt":
                assert stopped["status"] == "interrupted"
                assert [m["role"] for m in stopped["messages"]] == ["assistant", "tool"]
                assert answer["text"] == f"re: last | seen: {first} / next / last"
            else:
                assert stopped["status"] == "cancelled"
                assert answer["text"] == "re: last | seen: next / last"
        bad = http.post(turns_path(_cid("gw-bad")), json={"message": "x", "agent": "texter",
                                                          "if_busy": "later"})  # fmt: skip
        assert bad.status_code == 422
        assert bad.headers["content-type"].startswith("application/problem+json")


def test_the_command_line_sends_each_mode(pool: WorkerPool, client: Client, r: redis.Redis) -> None:
    cid, first = _cid("cli"), "[hold] from the shell"
    a = client.submit(cid, first, agent="texter")
    hold(r, pool, first)

    def submit(text: str, mode: str) -> str:
        done = CliRunner().invoke(
            app, ["submit", cid, text, "--agent", "texter", "--if-busy", mode], env=pool.env
        )
        assert done.exit_code == 0, done.output
        return done.stdout.strip().splitlines()[0]

    joined = submit("one", "merge")
    assert submit("two", "merge") == joined  # the id printed is the turn that answers it
    stopper = submit("three", "interrupt")
    release(r, pool, first)
    ended = a.wait(60)  # its first step was its answer: nothing to stop
    assert ended.ok and ended.stopped_by == stopper  # yet it names the turn that asked
    assert client.handle(cid, joined).wait(60).text.startswith("re: one two")
    assert client.handle(cid, stopper).wait(60).ok


@pytest.mark.parametrize("mode", ["interrupt", "rollback"])
def test_a_parked_head_through_the_gateway(gateway: GatewayProcess, mode: str) -> None:
    cid = _cid(f"gw-parked-{mode}")
    with gateway.client() as http:
        body = {"message": "[approve] refund", "agent": "texter"}
        head = http.post(turns_path(cid), json=body).json()["turn_id"]
        parked = http.get(f"{turns_path(cid)}/{head}", params={"wait": 60}).json()
        assert parked["status"] == "awaiting_approval", parked
        body = {"message": "forget it", "agent": "texter", "if_busy": mode}
        sent = http.post(turns_path(cid), json=body).json()["turn_id"]
        ended = http.get(f"{turns_path(cid)}/{head}").json()
        assert (ended["status"], ended["stopped_by"]) == ("cancelled", sent)
        approve = http.post(
            f"{turns_path(cid)}/{head}/approvals/call-2", json={"decision": "approve"}
        )
        assert approve.status_code == 409, approve.text  # finished: nothing to decide
        answer = http.get(f"{turns_path(cid)}/{sent}", params={"wait": 60}).json()
        assert answer["text"] == "re: forget it | seen: forget it"
