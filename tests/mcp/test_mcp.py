"""Tools from MCP servers in process: the test server (the SDK's MCPServer) over stdio
and streamable HTTP, and a server package from PyPI (mcp-server-time), through the one
engine path: results with images and errors, approvals, the idempotency key in the
request's _meta, tool-list changes, a dead server restarted, an unreachable one told to
the model, and the address guard."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from convoq import Agent
from convoq.errors import ConfigurationError
from convoq.mcp import IDEMPOTENCY_META_KEY, health, http_server, stdio_server
from convoq.memory import InMemoryConversationMemory
from convoq.messages import ImagePart, Message, MessageRole, ToolCall
from convoq.models import ModelRequest, ScriptedModel
from convoq.observe.metrics import REGISTRY
from tests.support.mcp_server import PIXEL
from tests.support.mcp_servers import HTTPServerProcess, listings, pid_alive, seen, stdio_args
from tests.support.models import call_tool_then_answer


def _calls(*steps: tuple[str, dict[str, Any]]):  # type: ignore[no-untyped-def]
    """A model that asks for each call in turn (one per user message), then answers with
    the tool result; it records the tool names each request offered."""
    offered: list[list[str]] = []
    queue = list(steps)

    def fn(request: ModelRequest) -> str | Message:
        offered.append([t.name for t in request.tools])
        last = request.messages[-1]
        if last.role == MessageRole.TOOL:
            return f"tool said: {last.text}"
        name, arguments = queue.pop(0)
        call = ToolCall(id=f"c{len(queue)}", name=name, arguments=arguments)
        return Message(role=MessageRole.ASSISTANT, tool_calls=[call])

    fn.offered = offered  # type: ignore[attr-defined]
    return fn


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "mcp.log"


def _tool_message(turn: list[Message]) -> Message:
    return next(m for m in turn if m.role == MessageRole.TOOL)


def test_a_stdio_tool_runs_with_the_idempotency_key_in_its_meta(log: Path) -> None:
    server = stdio_server("t", **stdio_args(log))
    script = _calls(("t__add", {"a": 2, "b": 5}))
    agent = Agent(ScriptedModel(script), mcp_servers=[server], tools=[_local])
    response = agent.generate("add them")
    assert response.text == "tool said: 7"
    assert {"t__add", "t__pixel", "_local"} <= set(script.offered[0])
    [call] = seen(log)
    assert call["arguments"] == {"a": 2, "b": 5}
    key = call["meta"][IDEMPOTENCY_META_KEY]
    assert key.startswith("convoq-") and len(key) == len("convoq-") + 64
    assert health([server])["t"]["state"] == "connected"


def _local() -> str:
    """A Python tool beside the MCP ones."""
    return "local"


def test_an_image_becomes_an_attachment_of_the_stored_tool_result(log: Path) -> None:
    memory = InMemoryConversationMemory()
    server = stdio_server("t", **stdio_args(log))
    agent = Agent(
        ScriptedModel(call_tool_then_answer("t__pixel", {})), memory=memory, mcp_servers=[server]
    )
    agent.generate("draw", conversation_id="pic")
    stored = _tool_message(memory.load("pic"))
    assert stored.text.startswith("one pixel\n[image image/png, ")
    [image] = stored.attachments
    assert isinstance(image, ImagePart) and image.data == PIXEL and image.mime_type == "image/png"


def test_an_error_result_reads_error_and_counts_as_one(log: Path) -> None:
    server = stdio_server("t", **stdio_args(log))
    labels = {"tool": "t__fail", "outcome": "error"}
    before = REGISTRY.get_sample_value("convoq_tool_calls_total", labels) or 0.0
    agent = Agent(ScriptedModel(call_tool_then_answer("t__fail", {})), mcp_servers=[server])
    response = agent.generate("fail")
    assert response.status == "completed"
    assert _tool_message(response.turn).text.startswith("Error: ")
    assert "failed on purpose" in response.text
    assert REGISTRY.get_sample_value("convoq_tool_calls_total", labels) == before + 1


@pytest.mark.parametrize(
    "rule",
    [["add"], lambda ctx, args: ctx.tool_name == "t__add" and args["a"] > 1],
    ids=["names", "function"],
)
def test_a_listed_tool_waits_for_approval_and_runs_once_approved(log: Path, rule: Any) -> None:
    server = stdio_server("t", requires_approval=rule, **stdio_args(log))
    agent = Agent(
        ScriptedModel(call_tool_then_answer("t__add", {"a": 2, "b": 3})), mcp_servers=[server]
    )
    paused = agent.generate("add")
    assert paused.status == "awaiting_approval" and seen(log) == []
    [call] = paused.pending_approvals
    done = agent.resume(paused.continuation, {call.id: True}, by="ann")
    assert done.text == "tool said: 5"
    assert [c["tool"] for c in seen(log)] == ["add"]


def test_a_denied_call_never_reaches_the_server(log: Path) -> None:
    server = stdio_server("t", requires_approval=True, **stdio_args(log))
    agent = Agent(
        ScriptedModel(call_tool_then_answer("t__add", {"a": 1, "b": 1})), mcp_servers=[server]
    )
    paused = agent.generate("add")
    [call] = paused.pending_approvals
    done = agent.resume(paused.continuation, {call.id: False})
    assert done.status == "completed" and seen(log) == []


def test_tools_are_listed_once_and_again_after_the_server_announces_a_change(
    log: Path,
) -> None:
    server = stdio_server("t", **stdio_args(log))
    script = _calls(("t__add", {"a": 1, "b": 1}), ("t__grow", {}), ("t__extra", {}))
    agent = Agent(ScriptedModel(script), mcp_servers=[server])
    agent.generate("add")
    agent.generate("grow")
    assert listings(log) == 1  # two turns, one listing: the list is cached
    assert "t__extra" not in script.offered[0]
    assert agent.generate("use it").text == "tool said: extra here"
    assert "t__extra" in script.offered[-1] and listings(log) == 2


def test_a_dead_stdio_server_fails_its_call_and_is_started_again(log: Path) -> None:
    server = stdio_server("t", **stdio_args(log))
    agent = Agent(
        ScriptedModel(_calls(("t__die", {}), ("t__add", {"a": 1, "b": 2}))), mcp_servers=[server]
    )
    died = agent.generate("die")
    assert died.status == "completed"
    assert "closed the connection during the call" in _tool_message(died.turn).text
    assert agent.generate("again").text == "tool said: 3"
    first, second = seen(log)
    assert first["pid"] != second["pid"] and not pid_alive(first["pid"])


def test_an_unreachable_server_is_a_tool_error_the_model_reads(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-server")
    server = stdio_server("gone", missing)
    agent = Agent(ScriptedModel(call_tool_then_answer("gone__anything", {})), mcp_servers=[server])
    response = agent.generate("try")
    assert response.status == "completed"
    text = _tool_message(response.turn).text
    assert "MCP server 'gone' cannot be reached" in text and "did not run" in text
    report = health([server])["gone"]
    assert report["state"] == "unreachable" and report["error"]


@pytest.fixture
def http(log: Path) -> Iterator[HTTPServerProcess]:
    from convoq._sync import run_sync
    from convoq.mcp import close_all

    process = HTTPServerProcess(log).start()
    yield process
    run_sync(close_all(process.used))  # ends the sessions while the server still listens
    process.stop()


def test_an_http_server_gets_its_headers_and_reconnects_after_a_restart(
    http: HTTPServerProcess, log: Path
) -> None:
    server = http_server(
        "h", http.url, headers={"Authorization": "Bearer t0ken"}, allowed_networks="127.0.0.1"
    )
    http.used.append(server)
    agent = Agent(
        ScriptedModel(call_tool_then_answer("h__add", {"a": 4, "b": 4})), mcp_servers=[server]
    )
    assert agent.generate("add").text == "tool said: 8"
    http.stop()
    http.start()  # same port, new process: the old session is unknown there
    assert agent.generate("add").text == "tool said: 8"
    first, second = seen(log)
    assert first["authorization"] == second["authorization"] == "Bearer t0ken"
    assert first["pid"] != second["pid"]


def test_a_loopback_url_is_refused_unless_allowed(
    http: HTTPServerProcess, log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = http_server("g", http.url)
    agent = Agent(
        ScriptedModel(call_tool_then_answer("g__add", {"a": 1, "b": 1})), mcp_servers=[refused]
    )
    text = _tool_message(agent.generate("add").turn).text
    assert "a loopback address" in text and "CONVOQ_MCP_ALLOWED_NETWORKS" in text
    assert seen(log) == []
    monkeypatch.setenv("CONVOQ_MCP_ALLOWED_NETWORKS", "127.0.0.0/8")
    allowed = http_server("g", http.url)
    http.used.append(allowed)
    agent = Agent(
        ScriptedModel(call_tool_then_answer("g__add", {"a": 1, "b": 1})), mcp_servers=[allowed]
    )
    assert agent.generate("add").text == "tool said: 2"


def test_a_server_package_from_pypi_runs_offline() -> None:
    server = stdio_server(
        "time", sys.executable, ["-m", "mcp_server_time", "--local-timezone", "UTC"]
    )
    script = _calls(
        (
            "time__convert_time",
            {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
        )
    )
    response = Agent(ScriptedModel(script), mcp_servers=[server]).generate("convert")
    assert "time__get_current_time" in script.offered[0]
    assert "Asia/Tokyo" in response.text and "21:00" in response.text


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: stdio_server("bad name", "x"), "server name"),
        (lambda: stdio_server("s", ""), "command must be"),
        (lambda: stdio_server("s", "x", requires_approval="add"), "list of tool names"),
        (lambda: http_server("h", "ftp://example.com/mcp"), "http\\(s\\) URL"),
        (lambda: http_server("h", "https://x.example/mcp", allowed_networks="nope"), "IP network"),
        (
            lambda: Agent(ScriptedModel(lambda r: "x"), mcp_servers=["python server.py"]),
            "stdio_server",
        ),
        (
            lambda: Agent(
                ScriptedModel(lambda r: "x"),
                mcp_servers=[stdio_server("s", "a"), stdio_server("s", "b")],
            ),
            "two MCP servers",
        ),
    ],
)
def test_bad_configuration_is_refused_with_what_to_fix(build: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        build()


def test_without_the_sdk_the_error_names_the_extra(tmp_path: Path) -> None:
    import subprocess

    code = (
        "import sys; sys.modules['mcp'] = None\n"
        "import convoq.errors, convoq.mcp\n"
        "try:\n"
        "    convoq.mcp.stdio_server('s', 'x')\n"
        "except convoq.errors.ConfigurationError as e:\n"
        "    print(e)\n"
        "print('mcp' in sys.modules and sys.modules['mcp'] is not None)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "MCP servers need the MCP SDK: pip install 'convoq[mcp]'",
        "False",
    ]


def test_the_core_does_not_import_the_sdk() -> None:
    import subprocess

    code = "import sys, convoq, convoq.agent, convoq.worker.runtime; print('mcp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_close_all_stops_the_servers_of_the_loop_that_used_them(log: Path) -> None:
    from convoq._sync import run_sync
    from convoq.mcp import close_all

    server = stdio_server("t", **stdio_args(log))
    agent = Agent(
        ScriptedModel(call_tool_then_answer("t__add", {"a": 1, "b": 1})), mcp_servers=[server]
    )
    agent.generate("add")  # sync: the session lives on the loop sync APIs share
    [call] = seen(log)
    assert pid_alive(call["pid"])
    run_sync(close_all([server]))
    assert not pid_alive(call["pid"])


def test_a_prefixed_name_the_server_does_not_list_runs_nothing(log: Path) -> None:
    server = stdio_server("t", **stdio_args(log))
    agent = Agent(ScriptedModel(call_tool_then_answer("t__rm_rf", {})), mcp_servers=[server])
    text = _tool_message(agent.generate("try").turn).text
    assert "MCP server 't' lists no tool 'rm_rf'" in text
    assert seen(log) == []


def test_a_stdio_server_starts_where_stderr_is_celerys_logging_proxy(
    log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    from celery.utils.log import LoggingProxy

    # What a Celery worker does to sys.stderr: a proxy without a file descriptor, which a
    # child process cannot inherit.
    monkeypatch.setattr(sys, "stderr", LoggingProxy(logging.getLogger("test.stderr")))
    server = stdio_server("t", **stdio_args(log))
    agent = Agent(
        ScriptedModel(call_tool_then_answer("t__add", {"a": 3, "b": 3})), mcp_servers=[server]
    )
    assert agent.generate("add").text == "tool said: 6"


def test_turns_right_after_a_failed_listing_do_not_wait_for_the_server_again(
    tmp_path: Path,
) -> None:
    starts = tmp_path / "starts"
    code = f"open({str(starts)!r}, 'a').write('x'); raise SystemExit(1)"
    server = stdio_server("flaky", sys.executable, ["-c", code])
    agent = Agent(ScriptedModel(lambda request: "no tools needed"), mcp_servers=[server])
    assert agent.generate("one").text == agent.generate("two").text == "no tools needed"
    assert starts.read_text() == "x"  # the second turn used the (empty) last list
    assert health([server])["flaky"]["state"] == "unreachable"


async def test_an_mcp_call_is_a_span_inside_the_tool_span(log: Path) -> None:
    from convoq.mcp import close_all
    from convoq.observe import tracing
    from tests.support.telemetry import memory_exporter

    spans = memory_exporter()
    server = stdio_server("t", **stdio_args(log))
    agent = Agent(
        ScriptedModel(call_tool_then_answer("t__add", {"a": 1, "b": 2})), mcp_servers=[server]
    )
    try:
        with tracing.span("test.root"):
            assert (await agent.agenerate("add")).text == "tool said: 3"
    finally:
        await close_all([server])
    finished = {s.name: s for s in spans.get_finished_spans()}
    call, tool_span = finished["convoq.mcp.call"], finished["convoq.tool"]
    assert call.parent is not None and call.parent.span_id == tool_span.context.span_id
    assert call.attributes is not None
    assert (call.attributes["convoq.mcp.server"], call.attributes["convoq.mcp.tool"]) == (
        "t",
        "add",
    )


def test_unusable_and_clashing_names_are_left_out_and_python_tools_win(log: Path) -> None:
    def add(a: int, b: int) -> str:
        """The Python tool named like the server's."""
        return "python add"

    server = stdio_server("t", tool_prefix="", **stdio_args(log))
    script = _calls(("add", {"a": 1, "b": 2}))
    agent = Agent(ScriptedModel(script), mcp_servers=[server], tools=[add])
    assert agent.generate("add").text == "tool said: python add"
    assert "pixel" in script.offered[0] and script.offered[0].count("add") == 1
    assert not any("dotted" in name for name in script.offered[0])
    assert seen(log) == []
