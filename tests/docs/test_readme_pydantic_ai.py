"""The README's example of a Pydantic AI agent on a worker runs as written: standalone,
offline (Pydantic AI's FunctionModel), on the embedded Redis and a real worker process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADING = "### Pydantic AI agents on workers"

pytestmark = pytest.mark.slow


def test_the_readme_example_of_a_pydantic_ai_agent_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme.split(HEADING, 1)[1].split("\n## ", 1)[0]
    [block] = [part.split("\n```", 1)[0] for part in section.split("```python\n")[1:]]
    script = tmp_path / "bank_agents.py"
    script.write_text(block, "utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVOQ_")}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "You said 'hello' after 0 answers.",
        "You said 'hello again' after 1 answers.",
        "Done: paid 7 EUR from the treasury account",
    ]
