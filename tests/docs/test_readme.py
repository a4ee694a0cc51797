"""Every ```python block of README.md, run as written: a README that drifts from the code
fails here. The blocks of the docs pages (docs/**/*.md) run the same way
(tests/docs/test_docs_examples.py); the harness is tests/docs/examples.py.

How a block runs (the rules for anyone adding one, to the README or to a docs page):

- Standalone: a block has its own imports and uses no name from another block. It runs
  as ``python example.py`` in a fresh temporary directory, offline, with
  ``OPENAI_BASE_URL`` set to a loopback server speaking the Chat Completions wire format
  (any ``openai("...")`` model reaches it), a dummy ``OPENAI_API_KEY``, ``CONVOQ_REDIS_URL``
  set to the test session's redis-server and ``CONVOQ_PREFIX`` to a fresh prefix.
- Sample files: ``chart.png`` and ``report.pdf`` (small and valid) are in that directory.
- Files: a block whose first line is a comment naming a Python file
  (``# myapp/agents.py — ...``) is also written to that path in the directory of every
  block of the same page (README.md, or one docs page), so the page's other blocks and
  workers import it. Pages do not share files: a page that needs ``myapp/agents.py`` has
  its own.
- Workers: a block that makes a convoq client (``Client(`` or ``AsyncClient(``) runs
  beside a real ``convoq worker`` started in its directory with
  ``CONVOQ_AGENTS=myapp.agents`` (the page's profiles module).
- The model answers every request offline (:func:`offline_answer`): offered tools and the
  user speaking last, it calls the first tool with arguments made from its JSON schema;
  asked for a JSON schema, it answers an instance of it; otherwise it answers with text.
- A block that truly cannot run has ``<!-- skip-example: the reason -->`` on the line
  before it. Keep these rare.
- ```bash and other blocks are not run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.docs.examples import (
    README,
    Block,
    OfflineModelServer,
    assert_runs,
    offline_answer,
    page_blocks,
    python_blocks,
)
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.slow

BLOCKS = page_blocks(README)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_block_runs_as_written(
    block: Block, tmp_path: Path, redis_server: RedisServer, model_server: OfflineModelServer
) -> None:
    assert_runs(block, BLOCKS, tmp_path, redis_server.url, model_server.url)


def test_blocks_are_found_and_the_convention_reads_them() -> None:
    text = (
        "intro\n```python\nprint(1)\n```\n<!-- skip-example: needs a GPU -->\n\n"
        "```python\n# myapp/tools.py — a module\nx = 1\n```\n```bash\nls\n```\n"
    )
    first, second = python_blocks(text, "page.md")
    assert (first.line, first.code, first.skip, first.file) == (2, "print(1)\n", None, None)
    assert (second.line, second.skip, second.file) == (7, "needs a GPU", "myapp/tools.py")
    assert second.id == "page.md:7"
    # The README's two examples: in process; a profiles module and a client beside its worker.
    assert len(BLOCKS) >= 3 and any(b.file == "myapp/agents.py" for b in BLOCKS)


def test_the_offline_model_calls_tools_from_their_schema_and_answers_text() -> None:
    tool = {"type": "function", "function": {"name": "transfer", "parameters": {
        "type": "object", "properties": {"amount": {"type": "integer"}, "to": {"type": "string"}},
    }}}  # fmt: skip
    asked = offline_answer({"messages": [{"role": "user", "content": "pay"}], "tools": [tool]})
    (call,) = asked["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"amount": 5, "to": "Paris"}
    after = [{"role": "user", "content": "pay"}, {"role": "tool", "content": "sent"}]
    assert offline_answer({"messages": after, "tools": [tool]})["content"].startswith("(offline")
