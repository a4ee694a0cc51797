"""Running the ```python blocks of README.md and of every docs page (docs/**/*.md) as
written, one harness for all of them; the rules a block follows are in the docstring of
tests/docs/test_readme.py. Per page: its file blocks (``# myapp/agents.py ...``) are
written beside each of its blocks and serve that page's blocks and workers only.
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
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from convoq.cli.demo import tiny_pdf, tiny_png
from tests.support.openai_server import OpenAIServer, RecordedRequest, _Reply

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
WORKER_AGENTS = "myapp.agents"
SKIP = re.compile(r"<!--\s*skip-example:\s*(.+?)\s*-->")
CONVOQ_CLIENT = re.compile(r"(?<![\w.])(?:Async)?Client\(")
FILE_HEADER = re.compile(r"#\s*([\w./-]+\.py)\b")


@dataclass(frozen=True)
class Block:
    """One ```python block: the page it is on, where it starts, and its code."""

    page: str
    line: int
    code: str
    skip: str | None

    @property
    def file(self) -> str | None:
        """The path its first line names (``# myapp/agents.py ...``), if any."""
        found = FILE_HEADER.match(self.code.lstrip())
        return found.group(1) if found else None

    @property
    def id(self) -> str:
        """``page:line``, the test id."""
        return f"{self.page}:{self.line}"

    @property
    def needs_worker(self) -> bool:
        """It makes a convoq client (``Client(`` or ``AsyncClient(``, not ``httpx.Client(``):
        it submits turns, so a worker runs beside it."""
        return CONVOQ_CLIENT.search(self.code) is not None


def python_blocks(text: str, page: str = "<text>") -> list[Block]:
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
        blocks.append(Block(page, index + 1, code, skip.group(1) if skip else None))
        index = end + 1
    return blocks


def page_blocks(path: Path) -> list[Block]:
    """The blocks of one page (README.md or a page under docs/), named from the repo root."""
    return python_blocks(path.read_text("utf-8"), path.relative_to(ROOT).as_posix())


def docs_pages() -> list[Path]:
    """Every markdown page of the site, in name order."""
    return sorted(DOCS.rglob("*.md"))


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


# -- running a block -------------------------------------------------------------------------
def block_env(redis_url: str, model_url: str) -> dict[str, str]:
    """The environment a block runs in: the test Redis under a fresh prefix, the offline
    model, and nothing of the caller's ``CONVOQ_*``/``OPENAI_*``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONVOQ_", "OPENAI_"))}
    env.pop("PYTHONPATH", None)  # the block's directory and convoq as installed, nothing else
    env.update(
        CONVOQ_REDIS_URL=redis_url,
        CONVOQ_PREFIX=f"docs{uuid.uuid4().hex[:8]}",
        OPENAI_BASE_URL=model_url,
        OPENAI_API_KEY="sk-offline-docs-test",
        PYTHONUNBUFFERED="1",
        COLUMNS="200",
    )
    return env


def prepare(directory: Path, blocks: list[Block]) -> None:
    """The sample files and every file the page's ``blocks`` name, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "chart.png").write_bytes(tiny_png())
    (directory / "report.pdf").write_bytes(tiny_pdf())
    for block in blocks:
        if block.file is not None:
            path = directory / block.file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code, "utf-8")


@contextmanager
def worker(directory: Path, env: dict[str, str]) -> Iterator[None]:
    """``convoq worker`` started in ``directory`` as the docs say, until the block ends.
    The block starts at once, not once the worker is ready: its turns wait queued until
    the worker consumes them, as a user's would, and the example's own start-up overlaps
    the worker's (a 14-block run: 42 s waiting for readiness, 25 s without). A worker
    that exits before the block ends fails it with the worker's log."""
    name = f"docs-{uuid.uuid4().hex[:6]}@localhost"
    log_path = directory / "worker.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("convoq")), "worker", f"--hostname={name}"],
            env={**env, "CONVOQ_AGENTS": WORKER_AGENTS}, cwd=directory,
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield
        assert process.poll() is None, log_path.read_text(errors="replace")[-3000:]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def run_block(
    block: Block, page: list[Block], directory: Path, redis_url: str, model_url: str
) -> subprocess.CompletedProcess[str]:
    """Run ``block`` as ``python example.py`` in ``directory``, beside the file blocks of
    its ``page`` and, when it submits turns, a worker."""
    prepare(directory, page)
    (directory / "example.py").write_text(block.code, "utf-8")
    env = block_env(redis_url, model_url)
    with worker(directory, env) if block.needs_worker else nullcontext():
        return subprocess.run(
            [sys.executable, "example.py"], env=env, cwd=directory,
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip


def failure(block: Block, done: subprocess.CompletedProcess[str]) -> str:
    """What a failed block printed, for the assertion message."""
    return f"{block.id} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def assert_runs(
    block: Block, page: list[Block], directory: Path, redis_url: str, model_url: str
) -> None:
    """Run ``block`` (:func:`run_block`; skipped when marked skip-example) and fail with
    what it printed unless it exits 0."""
    if block.skip is not None:
        pytest.skip(block.skip)
    done = run_block(block, page, directory, redis_url, model_url)
    assert done.returncode == 0, failure(block, done)
