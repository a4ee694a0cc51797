"""Every ```python block of every docs page (docs/**/*.md) runs as written, as the
README's do (the rules: tests/docs/test_readme.py): ``python example.py`` offline, on the
test Redis, beside the page's own file blocks, with a worker when it submits turns."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.examples import (
    Block,
    OfflineModelServer,
    assert_runs,
    docs_pages,
    page_blocks,
    prepare,
    python_blocks,
)
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.slow

PAGES = {block.page: blocks for blocks in map(page_blocks, docs_pages()) for block in blocks}
BLOCKS = [block for blocks in PAGES.values() for block in blocks]


def test_the_pages_have_examples_to_run() -> None:
    assert len([b for b in BLOCKS if b.skip is None]) >= 5
    assert all(b.page.startswith("docs/") for b in BLOCKS)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_a_docs_block_runs_as_written(
    block: Block, tmp_path: Path, redis_server: RedisServer, model_server: OfflineModelServer
) -> None:
    assert_runs(block, PAGES[block.page], tmp_path, redis_server.url, model_server.url)


AGENTS = """\
```python
# myapp/agents.py: this page's profiles
from convoq import Agent
from convoq.models import ModelRequest, ScriptedModel


def shout(request: ModelRequest) -> str:
    return request.messages[-1].text.upper()


loud = Agent(ScriptedModel(shout), name="loud")
```
"""
SUBMIT = """\
```python
from convoq import Client

with Client() as client:
    handle = client.submit("page-test", "hello", agent="loud")
    assert handle.wait(timeout=60).text == "HELLO"
```
"""


def test_a_page_s_file_blocks_serve_its_blocks_and_its_worker(
    tmp_path: Path, redis_server: RedisServer, model_server: OfflineModelServer
) -> None:
    page = python_blocks(f"# A page\n\n{AGENTS}\nThen:\n\n{SUBMIT}", "docs/page.md")
    other = python_blocks("# Another\n\n```python\n# myapp/other.py\nx = 1\n```\n", "docs/o.md")
    agents, submit = page
    assert submit.needs_worker and not agents.needs_worker
    assert_runs(submit, page, tmp_path / "run", redis_server.url, model_server.url)

    prepare(tmp_path / "alone", other)  # one page's files, and no other page's
    assert (tmp_path / "alone/myapp/other.py").exists()
    assert not (tmp_path / "alone/myapp/agents.py").exists()
