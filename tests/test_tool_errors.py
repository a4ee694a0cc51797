"""A tool that fails: what the model reads (by default, a ToolFailure's words, a tool's
``error_text``), and what operators get: a warning of the convoq.tools logger with the
conversation, turn, tool and call ids (in its message and as record attributes) and
``convoq_tool_errors_total{agent,tool}``. In process (caplog, this process's registry),
for MCP tools, and on a real worker process (its log file and its /metrics)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from convoq import Agent, RunContext, Tool, ToolFailure, tool
from convoq.client import Client
from convoq.errors import ToolError
from convoq.memory import InMemoryConversationMemory
from convoq.models import ScriptedModel
from tests.support.mcp_servers import stdio_args
from tests.support.models import call_tool_then_answer
from tests.support.redis_server import RedisServer
from tests.support.telemetry import scrape, value
from tests.support.workers import WorkerPool, running_pool, wait_until

IDS = ("conversation_id", "turn_id", "tool_name", "tool_call_id")


def _errors(agent: str, tool_name: str) -> float:
    labels = {"agent": agent, "tool": tool_name}
    return REGISTRY.get_sample_value("convoq_tool_errors_total", labels) or 0.0


def _run(t: Tool, arguments: dict[str, Any] | None = None, name: str = "ops") -> str:
    """The text the model answered with after calling ``t`` once (it repeats the result)."""
    model = ScriptedModel(call_tool_then_answer(t.name, arguments or {}))
    agent = Agent(model, tools=[t], name=name, memory=InMemoryConversationMemory())
    text = agent.generate("go", conversation_id=f"c-{name}").text
    assert text.startswith("tool said: ")
    return text.removeprefix("tool said: ")


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "convoq.tools"]


def test_a_raising_tool_is_logged_with_its_ids_and_traceback_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: dict[str, Any] = {}

    @tool
    def explode(ctx: RunContext[None]) -> str:
        seen.update(turn=ctx.turn_id, call=ctx.tool_call_id)
        raise RuntimeError("disk on fire")

    before = _errors("ops", "explode")
    with caplog.at_level(logging.WARNING, logger="convoq.tools"):
        assert _run(explode) == "Error: RuntimeError: disk on fire"  # today's text, kept
    [record] = _records(caplog)
    assert record.levelno == logging.WARNING
    got = {name: getattr(record, name) for name in (*IDS, "agent")}
    assert got == {
        "conversation_id": "c-ops",
        "turn_id": seen["turn"],
        "tool_name": "explode",
        "tool_call_id": seen["call"],
        "agent": "ops",
    }
    message = record.getMessage()
    for part in ("c-ops", seen["turn"], "explode", seen["call"], "RuntimeError: disk on fire"):
        assert part in message
    assert record.exc_info is not None and str(record.exc_info[1]) == "disk on fire"
    assert "Traceback" in caplog.text
    assert _errors("ops", "explode") == before + 1


def test_a_tool_failure_reaches_the_model_word_for_word(caplog: pytest.LogCaptureFixture) -> None:
    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        raise ToolFailure(f"no weather for {city}; ask for a city nearby")

    before = _errors("ops", "weather")
    with caplog.at_level(logging.WARNING, logger="convoq.tools"):
        assert (
            _run(weather, {"city": "Atlantis"}) == "no weather for Atlantis; ask for a city nearby"
        )
    [record] = _records(caplog)
    # The tool said what went wrong: logged and counted, without a traceback.
    assert record.exc_info is None and "ToolFailure: no weather for Atlantis" in record.getMessage()
    assert _errors("ops", "weather") == before + 1


def _say(ctx: RunContext[Any], exc: Exception) -> str:
    return f"{ctx.tool_name} is down ({type(exc).__name__}), try later"


async def _say_async(ctx: RunContext[Any], exc: Exception) -> str:
    return _say(ctx, exc)


@pytest.mark.parametrize(
    ("error_text", "expected"),
    [
        ("the lookup failed; try later", "the lookup failed; try later"),
        (_say, "lookup is down (KeyError), try later"),
        (_say_async, "lookup is down (KeyError), try later"),
    ],
    ids=["text", "function", "async-function"],
)
def test_error_text_chooses_what_the_model_reads(error_text: Any, expected: str) -> None:
    @tool(error_text=error_text)
    def lookup() -> str:
        raise KeyError("secret internal detail")

    assert _run(lookup) == expected


def test_an_error_text_function_that_fails_gives_the_default_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(ctx: RunContext[Any], exc: Exception) -> str:
        raise ValueError("bug in the hook")

    @tool(error_text=broken)
    def lookup() -> str:
        raise KeyError("gone")

    @tool(error_text=lambda ctx, exc: 42)  # type: ignore[arg-type,return-value]
    def other() -> str:
        raise KeyError("gone")

    with caplog.at_level(logging.WARNING, logger="convoq.tools"):
        assert _run(lookup) == "Error: KeyError: 'gone'"
        assert _run(other) == "Error: KeyError: 'gone'"
    assert any("error_text of tool 'lookup' raised" in r.getMessage() for r in _records(caplog))


def test_error_text_leaves_invalid_arguments_and_tool_failures_as_they_are() -> None:
    @tool(error_text="hidden")
    def pick(n: int) -> str:
        raise ToolFailure(f"{n} is not on the list")

    assert _run(pick, {"n": 3}) == "3 is not on the list"
    # convoq's own words about the call: the model can fix its arguments.
    text = _run(pick, {"n": "three"})
    assert (
        text.startswith("Error: ToolError: invalid arguments for tool 'pick'")
        and "hidden" not in text
    )


def test_error_text_must_be_a_text_or_a_function() -> None:
    with pytest.raises(ToolError, match="error_text must be a str or a function"):
        tool(error_text=42)(lambda: "x")  # type: ignore[call-overload]


def test_an_unknown_tool_is_logged_and_counted_under_one_label(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @tool
    def real() -> str:
        return "ok"

    model = ScriptedModel(call_tool_then_answer("made_up", {}))
    agent = Agent(model, tools=[real], name="ops")
    before = _errors("ops", "(unknown)")
    with caplog.at_level(logging.WARNING, logger="convoq.tools"):
        assert (
            agent.generate("go").text
            == "tool said: Error: ToolError: the model called unknown tool 'made_up'"
        )
    [record] = _records(caplog)
    assert record.tool_name == "made_up" and record.exc_info is None  # type: ignore[attr-defined]
    assert _errors("ops", "(unknown)") == before + 1


def test_an_mcp_error_result_is_logged_and_counted_like_a_raise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from convoq.mcp import stdio_server

    server = stdio_server("t", **stdio_args(tmp_path / "mcp.log"))
    agent = Agent(ScriptedModel(call_tool_then_answer("t__fail", {})), mcp_servers=[server])
    before = _errors("", "t__fail")
    with caplog.at_level(logging.WARNING, logger="convoq.tools"):
        response = agent.generate("fail")
    # The server's words, after "Error: " (an isError result carries no exception type).
    assert response.text.startswith("tool said: Error: ") and "failed on purpose" in response.text
    [record] = _records(caplog)
    assert (record.tool_name, record.exc_info) == ("t__fail", None)  # type: ignore[attr-defined]
    assert "reported an error" in record.getMessage() and "failed on purpose" in record.getMessage()
    assert _errors("", "t__fail") == before + 1


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerPool]:
    logs = tmp_path_factory.mktemp("tool-error-workers")
    settings = {"agents": "tests.support.tool_error_agents", "metrics_port": 0}
    with running_pool(redis_server.url, logs, 1, **settings) as started:
        yield started


@pytest.mark.slow
def test_a_worker_logs_a_raising_tool_with_its_ids_and_counts_it(
    pool: WorkerPool, client: Client
) -> None:
    [worker] = pool.workers
    [info] = client.workers().values()
    port = int(info["metrics_port"])
    before = value(scrape(port), "convoq_tool_errors_total", agent="tool_raiser", tool="explode")
    cid = f"tool-err-{uuid.uuid4().hex[:8]}"
    handle = client.submit(cid, "go", agent="tool_raiser")
    result = handle.wait(30)
    assert result.text == f"tool said: Error: RuntimeError: disk on fire in {handle.turn_id}"
    line = f"tool 'explode' raised RuntimeError: disk on fire in {handle.turn_id}"
    log = wait_until(
        lambda: next((x for x in worker.log_tail(400).splitlines() if line in x), None),
        30,
        what="the worker's warning",
    )
    assert f"conversation '{cid}', turn {handle.turn_id}, call call-1" in log
    assert "WARNING" in log and "Traceback" in worker.log_tail(400)
    after = value(scrape(port), "convoq_tool_errors_total", agent="tool_raiser", tool="explode")
    assert after == before + 1
    # A ToolFailure's words reach the model on a worker too.
    refused = client.submit(cid, "weather", agent="tool_refuser").wait(30)
    assert refused.text == "tool said: no weather for Atlantis; ask for a city nearby"
