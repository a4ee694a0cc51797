"""``submit(output_type=)`` names the answer's shape as an Agent does; ``output_schema=``
is its deprecated name: still taken, with a DeprecationWarning at the caller's line."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from pydantic import BaseModel

from convoq.client import AsyncClient, Client
from convoq.errors import ConvoqError


class City(BaseModel):
    name: str
    population: int


@pytest.fixture
def client(redis_url: str, key_prefix: str) -> Iterator[Client]:
    with Client(redis_url, prefix=key_prefix, partitions=4, agents=["echo"]) as c:
        yield c


def _cid() -> str:
    return f"out-{uuid.uuid4().hex[:8]}"


def test_output_schema_is_output_type_with_a_warning_at_the_callers_line(client: Client) -> None:
    typed = client.submit(_cid(), "Which city?", agent="echo", output_type=City)
    with pytest.warns(
        DeprecationWarning, match=r"output_schema= is deprecated; pass output_type="
    ) as seen:
        old = client.submit(_cid(), "Which city?", agent="echo", output_schema=City)
    assert [w.filename for w in seen] == [__file__]  # the caller's line, not convoq's
    asked = typed.record().options["output"]
    assert asked["json_schema"]["required"] == ["name", "population"]
    assert old.record().options["output"] == asked


async def test_the_async_client_takes_the_old_name_too(redis_url: str, key_prefix: str) -> None:
    async with AsyncClient(redis_url, prefix=key_prefix, partitions=4, agents=["echo"]) as c:
        with pytest.warns(DeprecationWarning, match="pass output_type=") as seen:
            handle = await c.submit(_cid(), "Which city?", agent="echo", output_schema=City)
        assert [w.filename for w in seen] == [__file__]
        assert (await handle.record()).options["output"]["name"] == "City"


def test_both_names_at_once_are_refused_and_nothing_is_queued(
    client: Client, redis_client: redis.Redis, key_prefix: str
) -> None:
    with pytest.raises(ConvoqError, match="pass output_type= only"):
        client.submit(_cid(), "hi", agent="echo", output_type=City, output_schema=City)
    assert redis_client.keys(f"{key_prefix}:*") == []
