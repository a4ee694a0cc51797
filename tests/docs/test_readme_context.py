"""The README's example of tool context, idempotency keys and approval policies runs as
written: standalone, offline, its asserts holding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADING = "### Tool context, side effects exactly once, approval policies"


def test_the_readme_example_of_the_run_context_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme.split(HEADING, 1)[1].split("\n### ", 1)[0]
    [block] = [part.split("\n```", 1)[0] for part in section.split("```python\n")[1:]]
    script = tmp_path / "example.py"
    script.write_text(block, "utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
