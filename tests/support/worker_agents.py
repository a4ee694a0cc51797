"""Agent profiles for worker tests (CONVOQ_AGENTS=tests.support.worker_agents).

Scripted models only. Those that record what they saw write to the test's Redis under
``{CONVOQ_PREFIX}:test:*`` so the test process can check it; the worker's environment
names that Redis.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time

import redis

from convoq import Agent, Message, ToolCall, tool
from convoq.compaction import CompactionPolicy
from convoq.errors import ModelError
from convoq.messages import MessageRole
from convoq.models import ModelRequest, ScriptedModel
from convoq.usage import Usage
from tests.support.redis_cluster import plain_client

_redis: redis.Redis | None = None


def test_redis() -> redis.Redis:
    global _redis
    if _redis is None:
        _redis = plain_client(os.environ["CONVOQ_REDIS_URL"])
    return _redis


def test_key(*parts: str) -> str:
    return ":".join([os.environ.get("CONVOQ_PREFIX", "convoq"), "test", *parts])


def _user_messages(request: ModelRequest) -> list[Message]:
    return [m for m in request.messages if m.role == MessageRole.USER]


def echo_fn(request: ModelRequest) -> str:
    """Answers with every user text it was sent and a digest of every attachment."""
    users = _user_messages(request)
    seen = " | ".join(m.text for m in users)
    files = [
        f"{p.mime_type}:{getattr(p, 'filename', None)}:{hashlib.sha256(p.data).hexdigest()[:16]}"
        for m in users
        for p in m.attachments
    ]
    return f"seen: {seen}" + (f" files: {', '.join(files)}" if files else "")


def tracker_fn(request: ModelRequest) -> str:
    """Records start/end per conversation; an overlap is recorded as a violation."""
    r, text = test_redis(), _user_messages(request)[-1].text
    cid = text.split(" ", 1)[0]
    if r.incr(test_key("running", cid)) > 1:
        r.sadd(test_key("overlap"), cid)
    r.rpush(test_key("order", cid), text)
    time.sleep(0.01)
    r.decr(test_key("running", cid))
    return f"ok {text}"


def blocker_fn(request: ModelRequest) -> str:
    """Blocks until the test sets ``test:release:<first word>`` (a long model call)."""
    r, text = test_redis(), _user_messages(request)[-1].text
    word = text.split(" ", 1)[0]
    r.rpush(test_key("ran", word), f"{text}@{os.getpid()}")
    deadline = time.monotonic() + 90
    while not r.exists(test_key("release", word)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"released {text}"


def crasher_fn(request: ModelRequest) -> str:
    """Kills its own worker process, every time."""
    test_redis().incr(test_key("crashes"))
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def failer_fn(request: ModelRequest) -> str:
    raise ModelError("the scripted model failed on purpose")


def oversize_fn(request: ModelRequest) -> str:
    """An answer of 100 kB: more than a small CONVOQ_MAX_TURN_BYTES lets a turn store."""
    return "x" * 100_000


@tool(requires_approval=True)
def transfer(amount: int) -> str:
    """Move money (needs a human's approval)."""
    test_redis().rpush(test_key("transfers"), str(amount))
    return f"transferred {amount} in pid {os.getpid()}"


def approver_fn(request: ModelRequest) -> str | Message:
    """Asks for ``transfer`` once per turn, then reports the tool result and its pid."""
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        test_redis().rpush(test_key("resumed_pid"), str(os.getpid()))
        return f"after tool: {last.text}"
    test_redis().rpush(test_key("parked_pid"), str(os.getpid()))
    call = ToolCall(id=f"call-{len(request.messages)}", name="transfer", arguments={"amount": 5})
    return Message(role=MessageRole.ASSISTANT, tool_calls=[call])


def double_approver_fn(request: ModelRequest) -> str | Message:
    """Asks for two transfers at once, then reports both results."""
    if request.messages[-1].role == MessageRole.TOOL:
        return " / ".join(m.text for m in request.messages if m.role == MessageRole.TOOL)
    calls = [
        ToolCall(id=f"call-{name}", name="transfer", arguments={"amount": amount})
        for name, amount in (("a", 1), ("b", 2))
    ]
    return Message(role=MessageRole.ASSISTANT, tool_calls=calls)


TOOL_CALL_USAGE = Usage(requests=1, prompt_tokens=100, completion_tokens=10, total_tokens=110,
                        cached_tokens=64)  # fmt: skip
ANSWER_USAGE = Usage(requests=1, prompt_tokens=130, completion_tokens=20, total_tokens=150,
                     reasoning_tokens=5)  # fmt: skip


@tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


def metered_fn(request: ModelRequest) -> Message:
    """Calls ``lookup`` once, then answers; both calls report usage, as a server would."""
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        return Message.assistant(f"answer from {last.text}", usage=ANSWER_USAGE,
                                 finish_reason="stop")  # fmt: skip
    call = ToolCall(id=f"call-{len(request.messages)}", name="lookup", arguments={"topic": "x"})
    return Message.assistant("", [call], usage=TOOL_CALL_USAGE, finish_reason="tool_calls")


def cut_off_fn(request: ModelRequest) -> Message:
    """An answer cut off at the token limit."""
    return Message.assistant("Once upon a", usage=ANSWER_USAGE, finish_reason="length")


def refuser_fn(request: ModelRequest) -> Message:
    return Message.assistant("", refusal="I can't help with that.", finish_reason="stop")


echo = Agent(ScriptedModel(echo_fn), name="echo", instructions="Repeat what you saw.")
metered = Agent(ScriptedModel(metered_fn), name="metered", tools=[lookup])
cut_off = Agent(ScriptedModel(cut_off_fn), name="cut_off")
strict_cut_off = Agent(ScriptedModel(cut_off_fn), name="strict_cut_off", fail_on_length=True)
refuser = Agent(ScriptedModel(refuser_fn), name="refuser")
tracker = Agent(ScriptedModel(tracker_fn), name="tracker")
blocker = Agent(ScriptedModel(blocker_fn), name="blocker")
crasher = Agent(ScriptedModel(crasher_fn), name="crasher")
failer = Agent(ScriptedModel(failer_fn), name="failer")
oversize = Agent(ScriptedModel(oversize_fn), name="oversize")
approver = Agent(ScriptedModel(approver_fn), name="approver", tools=[transfer])
double_approver = Agent(ScriptedModel(double_approver_fn), name="double_approver",
                        tools=[transfer])  # fmt: skip
short_memory = Agent(ScriptedModel(echo_fn), name="short_memory", keep_last_turns=1)


def summary_fn(request: ModelRequest) -> str:
    """A summariser: names the user lines of the transcript it was given."""
    lines = request.messages[-1].text.splitlines()
    return "users said " + ", ".join(line[6:] for line in lines if line.startswith("user: "))


compacting = Agent(
    ScriptedModel(echo_fn),
    name="compacting",
    compaction=CompactionPolicy(ScriptedModel(summary_fn), max_turns=2, keep_last_turns=1),
)


def _rendezvous(phase: str, text: str) -> None:
    """Wait (bounded) until ``n`` calls of ``group`` reached this phase, recording when this
    one started and ended: all of them overlap only if they ran at once."""
    group, n = text.split(" ")[:2]
    r, key = test_redis(), test_key("meet", group, phase)
    started = time.time()
    r.incr(key)
    deadline = time.monotonic() + 20
    while int(r.get(key) or 0) < int(n) and time.monotonic() < deadline:
        time.sleep(0.05)
    r.rpush(test_key("spans", group, phase), f"{started} {time.time()}")


@tool
def rendezvous_tool(text: str) -> str:
    """A blocking tool that waits for its peers."""
    _rendezvous("tool", text)
    return "met"


def rendezvous_fn(request: ModelRequest) -> str | Message:
    """A blocking model: waits for its peers, asks for ``rendezvous_tool``, then answers."""
    last = request.messages[-1]
    if last.role == MessageRole.TOOL:
        return f"after tool: {last.text}"
    text = _user_messages(request)[-1].text
    _rendezvous("model", text)
    call = ToolCall(id="call-meet", name="rendezvous_tool", arguments={"text": text})
    return Message(role=MessageRole.ASSISTANT, tool_calls=[call])


rendezvous = Agent(ScriptedModel(rendezvous_fn), name="rendezvous", tools=[rendezvous_tool])
