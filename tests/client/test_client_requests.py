"""What a submit refuses about the request as a whole, against a real Redis: an
idempotency key reused for another request, and a callback the deployment cannot sign."""

from __future__ import annotations

import pytest
import redis

from convoq.client import AsyncClient
from convoq.errors import IdempotencyKeyReusedError, InvalidCallbackUrlError
from convoq.messages import ImagePart, Message, TextPart

HOOK = "https://hooks.example.test/done"


def _client(redis_url: str, key_prefix: str, **kwargs: object) -> AsyncClient:
    return AsyncClient(redis_url, prefix=key_prefix, partitions=4, agents=["echo", "other"],
                       **kwargs)  # type: ignore[arg-type]  # fmt: skip


async def test_a_repeat_is_the_first_turn_and_another_request_under_its_key_is_refused(
    redis_url: str, key_prefix: str, redis_client: redis.Redis
) -> None:
    image = ImagePart(data=b"\x89PNG-bytes", mime_type="image/png")
    message = Message(content=[TextPart(text="look"), image])
    async with _client(redis_url, key_prefix) as client:
        first = await client.submit("c1", message, agent="echo", idempotency_key="k")
        assert not first.repeated
        again = await client.submit(
            "c1", message.model_copy(deep=True), agent="echo", idempotency_key="k"
        )
        assert again.turn_id == first.turn_id and again.repeated
        keys = sorted(redis_client.keys(f"{key_prefix}:*"))
        changed = [
            ({"message": "look"}, ["message"]),
            ({"agent": "other"}, ["agent"]),
            ({"keep_last_turns": 2}, ["keep_last_turns"]),
            ({"callback_url": HOOK, "message": "x"}, ["message", "callback_url"]),
        ]
        async with _client(redis_url, key_prefix, webhook_secret="s") as signing:
            for change, differs in changed:
                args = {"message": message, "agent": "echo", **change}
                with pytest.raises(
                    IdempotencyKeyReusedError, match="idempotency key 'k'"
                ) as raised:
                    await signing.submit("c1", idempotency_key="k", **args)  # type: ignore[arg-type]
                assert raised.value.details["mismatch"] == differs
                assert raised.value.details["turn_id"] == first.turn_id
        assert sorted(redis_client.keys(f"{key_prefix}:*")) == keys  # nothing queued


async def test_a_callback_needs_the_webhook_secret_where_the_turn_is_submitted(
    redis_url: str, key_prefix: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CONVOQ_WEBHOOK_SECRET", raising=False)
    async with _client(redis_url, key_prefix) as client:
        with pytest.raises(InvalidCallbackUrlError, match="CONVOQ_WEBHOOK_SECRET") as raised:
            await client.submit("c2", "hi", agent="echo", callback_url=HOOK)
        assert raised.value.details["setting"] == "CONVOQ_WEBHOOK_SECRET"
    assert redis_client.keys(f"{key_prefix}:*") == []
    # Resolved like every setting (as the workers resolve it): the environment will do.
    monkeypatch.setenv("CONVOQ_WEBHOOK_SECRET", "the-workers-secret")
    async with _client(redis_url, key_prefix) as client:
        handle = await client.submit("c2", "hi", agent="echo", callback_url=HOOK)
        assert (await handle.record()).options["callback_url"] == HOOK
