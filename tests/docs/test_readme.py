"""Every ```python block of README.md, run as written: a README that drifts from the code
fails here.

How a block runs (the rules for anyone adding one):

- Standalone: a block has its own imports and uses no name from another block. It runs
  as ``python example.py`` in a fresh temporary directory, offline, with
  ``OPENAI_BASE_URL`` set to a loopback server speaking the Chat Completions wire format
  (any ``openai("...")`` model reaches it), a dummy ``OPENAI_API_KEY``, ``CONVOQ_REDIS_URL``
  set to the test session's redis-server and ``CONVOQ_PREFIX`` to a fresh prefix.
- Sample files: ``chart.png`` and ``report.pdf`` (small and valid) are in that directory.
- Files: a block whose first line is a comment naming a Python file
  (``# myapp/agents.py — ...``) is also written to that path in every block's directory,
  so other blocks and workers import it.
- Workers: a block that contains ``Client(`` runs beside a real ``convoq worker`` started
  in its directory with ``CONVOQ_AGENTS=myapp.agents`` (the README's profiles module).
- The model answers every request offline (:func:`offline_answer`): offered tools and the
  user speaking last, it calls the first tool with arguments made from its JSON schema;
  asked for a JSON schema, it answers an instance of it; otherwise it answers with text.
- A block that truly cannot run has ``<!-- skip-example: the reason -->`` on the line
  before it. Keep these rare.
- ```bash and other blocks are not run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from convoq.cli.demo import tiny_pdf, tiny_png
from convoq.redis.keys import KeySchema
from tests.support.openai_server import OpenAIServer, RecordedRequest, _Reply
from tests.support.redis_server import RedisServer
from tests.support.workers import wait_until

pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"
WORKER_AGENTS = "myapp.agents"
SKIP = re.compile(r"<!--\s*skip-example:\s*(.+?)\s*-->")
FILE_HEADER = re.compile(r"#\s*([\w./-]+\.py)\b")


@dataclass(frozen=True)
class Block:
    """One ```python block: where it starts in the README, and its code."""

    line: int
    code: str
    skip: str | None

    @property
    def file(self) -> str | None:
        """The path its first line names (``# myapp/agents.py ...``), if any."""
        found = FILE_HEADER.match(self.code.lstrip())
        return found.group(1) if found else None


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of ``text``, each with the skip reason written before it."""
    blocks: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        fence = lines[index]
        indent = len(fence) - len(fence.lstrip())
        if fence.strip() != "```python":
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        code = "\n".join(line[indent:] for line in lines[index + 1 : end]) + "\n"
        before = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        skip = SKIP.search(before)
        blocks.append(Block(index + 1, code, skip.group(1) if skip else None))
        index = end + 1
    return blocks


BLOCKS = python_blocks(README.read_text("utf-8"))


# -- the offline model ---------------------------------------------------------------------
def example_value(schema: dict[str, Any]) -> Any:
    """A value that fits a (simple) JSON schema: what the offline model fills in."""
    if "enum" in schema:
        return schema["enum"][0]
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return example_value(schema[union][0])
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties", {})
        return {name: example_value(spec) for name, spec in properties.items()}
    simple = {"string": "Paris", "integer": 5, "number": 1.5, "boolean": True, "null": None}
    if kind == "array":
        return [example_value(schema.get("items", {"type": "string"}))]
    return simple.get(kind, "Paris")


def offline_answer(request: dict[str, Any]) -> dict[str, Any]:
    """The assistant message the offline model answers ``request`` with."""
    messages = request.get("messages") or [{}]
    last = messages[-1]
    tools = request.get("tools") or []
    if tools and last.get("role") == "user":
        function = tools[0]["function"]
        arguments = example_value(function.get("parameters") or {})
        wire = {"name": function["name"], "arguments": json.dumps(arguments)}
        call = {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function", "function": wire}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    wanted = (request.get("response_format") or {}).get("json_schema")
    if wanted:
        return {"role": "assistant", "content": json.dumps(example_value(wanted["schema"]))}
    content = last.get("content")
    if isinstance(content, list):
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return {"role": "assistant", "content": f"(offline answer to: {str(content or '')[:80]})"}


class OfflineModelServer(OpenAIServer):
    """The test suite's Chat Completions server, answering by :func:`offline_answer`
    instead of from a script."""

    def _record(self, request: RecordedRequest) -> _Reply:
        finish = "stop"
        try:
            message = offline_answer(request.json or {})
        except (KeyError, TypeError, ValueError) as exc:
            body = json.dumps({"error": {"message": f"offline model: {exc!r}"}}).encode()
            return _Reply(status=400, body=body)
        if message.get("tool_calls"):
            finish = "tool_calls"
        return _Reply(message=message, finish_reason=finish)


@pytest.fixture(scope="module")
def model_server() -> Iterator[OfflineModelServer]:
    with OfflineModelServer() as server:
        yield server


# -- running a block -------------------------------------------------------------------------
def _block_env(redis_url: str, model_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONVOQ_", "OPENAI_"))}
    env.pop("PYTHONPATH", None)  # the block's directory and convoq as installed, nothing else
    env.update(
        CONVOQ_REDIS_URL=redis_url,
        CONVOQ_PREFIX=f"readme{uuid.uuid4().hex[:8]}",
        OPENAI_BASE_URL=model_url,
        OPENAI_API_KEY="sk-offline-readme-test",
        PYTHONUNBUFFERED="1",
        COLUMNS="200",
    )
    return env


def _prepare(directory: Path) -> None:
    """The sample files and every file a block names, in a block's directory."""
    (directory / "chart.png").write_bytes(tiny_png())
    (directory / "report.pdf").write_bytes(tiny_pdf())
    for block in BLOCKS:
        if block.file is not None:
            path = directory / block.file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code, "utf-8")


@contextmanager
def _worker(directory: Path, env: dict[str, str]) -> Iterator[None]:
    """``convoq worker`` started in ``directory`` as the README says, until the block ends."""
    name = f"readme-{uuid.uuid4().hex[:6]}@localhost"
    log_path = directory / "worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("convoq")), "worker", f"--hostname={name}"],
            env={**env, "CONVOQ_AGENTS": WORKER_AGENTS}, cwd=directory,
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    store = redis.Redis.from_url(env["CONVOQ_REDIS_URL"])
    try:
        workers = KeySchema(env["CONVOQ_PREFIX"]).workers()
        wait_until(lambda: store.hexists(workers, name) or process.poll() is not None, 60)
        assert process.poll() is None, log_path.read_text(errors="replace")[-3000:]
        yield
    finally:
        store.close()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("block", BLOCKS, ids=[f"README.md:{b.line}" for b in BLOCKS])
def test_readme_block_runs_as_written(
    block: Block, tmp_path: Path, redis_server: RedisServer, model_server: OfflineModelServer
) -> None:
    if block.skip is not None:
        pytest.skip(block.skip)
    _prepare(tmp_path)
    (tmp_path / "example.py").write_text(block.code, "utf-8")
    env = _block_env(redis_server.url, model_server.url)
    with _worker(tmp_path, env) if "Client(" in block.code else _nothing():
        done = subprocess.run(
            [sys.executable, "example.py"], env=env, cwd=tmp_path,
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    assert done.returncode == 0, (
        f"README.md line {block.line} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def test_blocks_are_found_and_the_convention_reads_them() -> None:
    text = (
        "intro\n```python\nprint(1)\n```\n<!-- skip-example: needs a GPU -->\n\n"
        "```python\n# myapp/tools.py — a module\nx = 1\n```\n```bash\nls\n```\n"
    )
    first, second = python_blocks(text)
    assert (first.line, first.code, first.skip, first.file) == (2, "print(1)\n", None, None)
    assert (second.line, second.skip, second.file) == (7, "needs a GPU", "myapp/tools.py")
    assert len(BLOCKS) >= 6 and any(b.file == "myapp/agents.py" for b in BLOCKS)


def test_the_offline_model_calls_tools_from_their_schema_and_answers_text() -> None:
    tool = {"type": "function", "function": {"name": "transfer", "parameters": {
        "type": "object", "properties": {"amount": {"type": "integer"}, "to": {"type": "string"}},
    }}}  # fmt: skip
    asked = offline_answer({"messages": [{"role": "user", "content": "pay"}], "tools": [tool]})
    (call,) = asked["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"amount": 5, "to": "Paris"}
    after = [{"role": "user", "content": "pay"}, {"role": "tool", "content": "sent"}]
    assert offline_answer({"messages": after, "tools": [tool]})["content"].startswith("(offline")
