"""Popping a conversation's newest message (``ConversationMemory.apop_message``): one body
per behaviour on every backend; then the Redis script's replay and its cost, which must
not grow with the history."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from convoq._sync import drive
from convoq.errors import (
    ConversationBusyError,
    ConvoqError,
    InvalidConversationIdError,
    InvalidMessageError,
)
from convoq.integrations.openai_agents import ConvoqSession
from convoq.limits import Limits
from convoq.memory import ConversationMemory, RedisConversationMemory, as_memory
from convoq.messages import ImagePart, Message, MessageRole, TextPart, ToolCall
from convoq.redis._popping import AGAIN, pop_steps
from convoq.redis._sync_client import BlockingScripts
from convoq.redis.keys import KeySchema
from convoq.redis.scripts import ScriptCall
from convoq.summary import Summary
from convoq.window import split_turns

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
CALLS = [
    ToolCall(id="c1", name="lookup", arguments={}),
    ToolCall(id="c2", name="ask", arguments={}),
]


def with_image(text: str) -> Message:
    return Message(
        role=MessageRole.USER,
        content=[TextPart(text=text), ImagePart(data=PNG, mime_type="image/png")],
    )


async def turns_counted(memory: ConversationMemory, cid: str) -> int:
    """The turns the backend counts (on Redis its meta counter) against those it loads."""
    assert isinstance(memory, ConversationMemory)
    counted = await memory.aunsummarised_turns(cid)  # type: ignore[attr-defined]
    assert counted == len(split_turns(await memory.aload(cid))[1])
    return int(counted)


async def test_the_newest_message_goes_and_a_turn_goes_with_its_only_message(
    memory: ConversationMemory,
) -> None:
    system, q1, a1, q2 = (
        Message.system("be brief"),
        Message.user("q1"),
        Message.assistant("a1"),
        Message.user("q2"),
    )
    memory.append("c", [system, q1, a1])
    memory.append("c", [q2])
    assert await turns_counted(memory, "c") == 2
    # q2 is its turn's only message: the turn goes with it.
    assert await memory.apop_message("c") == q2
    assert await memory.aload("c") == [system, q1, a1]
    assert await turns_counted(memory, "c") == 1
    # a1 shares its turn with q1: the turn stays, shorter.
    assert await memory.apop_message("c") == a1
    assert await memory.aload("c") == [system, q1]
    assert await turns_counted(memory, "c") == 1
    assert memory.pop_message("c") == q1  # the blocking flavour
    assert await turns_counted(memory, "c") == 0
    # Leading system/developer messages go last.
    assert await memory.apop_message("c") == system
    assert await memory.apop_message("c") is None
    assert await memory.aload("c") == []
    memory.append("c", [Message.user("again")])
    assert await memory.aload("c") == [Message.user("again")]


async def test_a_message_appended_on_its_own_continues_its_turn(
    memory: ConversationMemory,
) -> None:
    memory.append("c", [Message.user("q")])
    memory.append("c", [Message.assistant("a")])  # stored on its own, continuing the turn
    assert await memory.apop_message("c") == Message.assistant("a")
    assert await turns_counted(memory, "c") == 1
    assert await memory.apop_message("c") == Message.user("q")
    assert await turns_counted(memory, "c") == 0


async def test_keep_stores_what_it_returns_in_place_of_the_newest(
    memory: ConversationMemory,
) -> None:
    asked = Message.assistant("let me look", CALLS)
    memory.append("c", [Message.user("q"), asked])

    def less_a_call(message: Message) -> list[Message]:
        return [message.model_copy(update={"tool_calls": message.tool_calls[:-1]})]

    assert await memory.apop_message("c", keep=less_a_call) == asked
    assert await memory.aload("c") == [
        Message.user("q"),
        Message.assistant("let me look", CALLS[:1]),
    ]
    assert await turns_counted(memory, "c") == 1


async def test_keep_may_store_an_attachment_the_element_had_not(
    memory: ConversationMemory,
) -> None:
    memory.append("c", [Message.user("q"), Message.assistant("a")])
    assert await memory.apop_message("c", keep=lambda m: [with_image("instead")]) == (
        Message.assistant("a")
    )
    assert await memory.aload("c") == [Message.user("q"), with_image("instead")]


async def test_a_history_that_opens_without_a_user_message(memory: ConversationMemory) -> None:
    memory.append("c", [Message.assistant("hello"), Message.assistant("how can I help?")])
    assert await turns_counted(memory, "c") == 1  # an opening of its own
    assert await memory.apop_message("c") == Message.assistant("how can I help?")
    assert await turns_counted(memory, "c") == 1
    assert await memory.apop_message("c") == Message.assistant("hello")
    assert await turns_counted(memory, "c") == 0


async def test_bad_arguments_are_refused_and_nothing_changes(memory: ConversationMemory) -> None:
    memory.append("c", [Message.user("q"), Message.assistant("a")])
    with pytest.raises(ConvoqError, match="wait_s"):
        await memory.apop_message("c", wait_s=-1)
    with pytest.raises(ConvoqError, match="keep"):
        await memory.apop_message("c", keep="not a function")  # type: ignore[arg-type]
    with pytest.raises(InvalidConversationIdError):
        await memory.apop_message("")
    with pytest.raises(InvalidMessageError, match="keep must return a list of Message"):
        await memory.apop_message("c", keep=lambda m: m)  # type: ignore[arg-type,return-value]
    assert await memory.aload("c") == [Message.user("q"), Message.assistant("a")]


async def test_a_summary_goes_only_when_it_told_of_the_popped_message(
    memory: ConversationMemory,
) -> None:
    for n in range(3):
        memory.append("c", [Message.user(f"q{n}"), Message.assistant(f"a{n}")])
    _, _, basis = await memory.asummary_state("c")  # type: ignore[attr-defined]
    earlier = Summary.of("q0 and q1", watermark=2, version=1)
    await memory.acommit_summary("c", earlier, basis)  # type: ignore[attr-defined]
    await memory.apop_message("c")  # a2: of the third turn, which the summary leaves out
    assert await memory.asummary("c") == earlier  # type: ignore[attr-defined]
    await memory.apop_message("c")  # q2: the third turn goes
    await memory.apop_message("c")  # a1: of the second turn, which the summary told of
    assert await memory.asummary("c") is None  # type: ignore[attr-defined]


async def test_an_attachment_another_message_refers_to_stays(memory: ConversationMemory) -> None:
    memory.append("c", [with_image("first"), Message.assistant("seen")])
    memory.append("c", [with_image("second")])
    assert await memory.apop_message("c") == with_image("second")  # bytes and all
    assert await memory.aload("c") == [with_image("first"), Message.assistant("seen")]


async def test_a_memory_of_the_guides_three_methods_pops_by_rewriting() -> None:
    class Plain:
        def __init__(self) -> None:
            self.stored: dict[str, list[Message]] = {}

        def load(self, conversation_id: str) -> list[Message]:
            return list(self.stored.get(conversation_id, []))

        def append(self, conversation_id: str, messages: list[Message]) -> None:
            self.stored.setdefault(conversation_id, []).extend(messages)

        def clear(self, conversation_id: str) -> None:
            self.stored.pop(conversation_id, None)

    memory = as_memory(Plain())
    await memory.aappend("c", [Message.system("s"), Message.user("q1"), Message.assistant("a1")])
    await memory.aappend("c", [Message.user("q2")])
    assert await memory.apop_message("c") == Message.user("q2")
    assert await memory.aload("c") == [
        Message.system("s"),
        Message.user("q1"),
        Message.assistant("a1"),
    ]
    session = ConvoqSession("c", memory)
    assert await session.pop_item() == {"role": "assistant", "content": "a1"}
    # It holds the conversation like a turn: a turn holding it makes it wait, then refuse.
    await memory.areserve("c", "a-running-turn")
    with pytest.raises(ConversationBusyError):
        await memory.apop_message("c", wait_s=0.1)
    assert await memory.aload("c") == [Message.system("s"), Message.user("q1")]


# -- Redis: what the script leaves, its replay, and its cost -------------------------------


@pytest.fixture
def redis_memory(redis_url: str, key_prefix: str) -> Iterator[RedisConversationMemory]:
    memory = RedisConversationMemory(redis_url, prefix=key_prefix)
    yield memory
    memory.close()


async def test_redis_keeps_a_popped_attachment_until_prune_and_drops_all_when_emptied(
    redis_memory: RedisConversationMemory, redis_client: redis.Redis, key_prefix: str
) -> None:
    blobs = KeySchema(key_prefix).blobs("c")
    redis_memory.append("c", [Message.user("q"), Message.assistant("a")])
    redis_memory.append("c", [with_image("look")])
    await redis_memory.apop_message("c")
    # Another element might refer to it (telling would read every element): it stays...
    assert redis_client.hlen(blobs) == 1
    # ...until prune, which reads every element anyway, finds none does.
    await redis_memory.aprune("c", keep_last_turns=1)
    assert redis_client.exists(blobs) == 0
    redis_memory.append("c", [with_image("again")])
    assert redis_client.hlen(blobs) == 1
    while await redis_memory.apop_message("c") is not None:
        pass
    # Nothing is left to refer to an attachment: they go with the last message.
    assert redis_client.exists(blobs) == 0
    assert redis_client.hget(KeySchema(key_prefix).meta("c"), "bytes") == b"0"


def test_a_resent_pop_script_pops_nothing_more(
    redis_memory: RedisConversationMemory, redis_client: redis.Redis, key_prefix: str
) -> None:
    redis_memory.append("c", [Message.user("q"), Message.assistant("a")])
    scripts = BlockingScripts(redis_client)
    sent: list[ScriptCall] = []

    def perform(request: Any) -> Any:
        if isinstance(request, ScriptCall):
            sent.append(request)
        return scripts.perform(request)

    steps = pop_steps(KeySchema(key_prefix), "c", Limits(), None, pop_id=secrets.token_hex(8))
    assert drive(steps, perform) == Message.assistant("a")
    # redis-py sends the same call again when its reply was lost.
    assert scripts.perform(sent[-1])[0] == "APPLIED"
    assert redis_memory.load("c") == [Message.user("q")]


def test_a_write_between_the_read_and_the_script_is_never_lost(
    redis_memory: RedisConversationMemory, redis_client: redis.Redis, key_prefix: str
) -> None:
    redis_memory.append("c", [Message.user("q")])
    scripts = BlockingScripts(redis_client)
    steps = pop_steps(KeySchema(key_prefix), "c", Limits(), None, pop_id=secrets.token_hex(8))
    read = next(steps)
    script = steps.send(scripts.perform(read))
    assert isinstance(script, ScriptCall)
    redis_memory.append("c", [Message.assistant("written meanwhile")])  # a plain append
    with pytest.raises(StopIteration) as ended:
        steps.send(scripts.perform(script))
    assert ended.value.value is AGAIN  # nothing popped: the pop reads again
    assert redis_memory.pop_message("c") == Message.assistant("written meanwhile")
    assert redis_memory.load("c") == [Message.user("q")]


def test_an_element_of_no_message_is_passed_over(
    redis_memory: RedisConversationMemory, redis_client: redis.Redis, key_prefix: str
) -> None:
    redis_memory.append("c", [Message.user("q"), Message.assistant("a")])
    redis_client.rpush(KeySchema(key_prefix).turns("c"), b"C\n[]")
    assert redis_memory.pop_message("c") == Message.assistant("a")
    assert redis_client.llen(KeySchema(key_prefix).turns("c")) == 1


def commands_of_one_pop(
    memory: RedisConversationMemory, client: redis.Redis, cid: str
) -> dict[str, int]:
    """The commands Redis ran for one pop (script body included), by name and count."""
    memory.pop_message(cid)  # the script is loaded, the pools are open
    client.config_resetstat()
    memory.pop_message(cid)
    stats = client.info("commandstats")
    mine = ("cmdstat_info", "cmdstat_config")  # this test's own
    return {name: int(s["calls"]) for name, s in stats.items() if not name.startswith(mine)}


def test_the_pop_script_does_as_much_work_on_10_as_on_10000_turns(
    redis_memory: RedisConversationMemory, redis_client: redis.Redis
) -> None:
    for cid, turns in (("short", 10), ("long", 10_000)):
        for first in range(0, turns, 1000):
            batch = [Message.user(f"q{n}") for n in range(first, min(first + 1000, turns))]
            redis_memory.append(cid, batch)
            redis_memory.append(cid, [Message.assistant("a"), Message.assistant("b")])
    short = commands_of_one_pop(redis_memory, redis_client, "short")
    long = commands_of_one_pop(redis_memory, redis_client, "long")
    assert short == long
    # Read and written: the last element, counters and flags; never a range of the history.
    assert {"cmdstat_evalsha", "cmdstat_lindex", "cmdstat_rpop"} <= set(long)
    assert not {"cmdstat_lrange", "cmdstat_hgetall", "cmdstat_hkeys"} & set(long)
    assert redis_memory.load("long", last_turns=1) == [Message.user("q9999")]
