"""Every ```python block of the documentation pages (docs/**/*.md) runs as written, on its
own (its own imports, a fresh namespace), offline (the scripted model). A block that
cannot run here has ``<!-- skip-example: the reason -->`` on the line before it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
_SKIP = re.compile(r"<!-- skip-example: .+ -->\n$")


def examples() -> list[tuple[str, str]]:
    """``(page:line, source)`` of every block that runs."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text("utf-8")
        for match in _BLOCK.finditer(text):
            if _SKIP.search(text, 0, match.start()):
                continue
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(DOCS)}:{line}", match.group(1)))
    return found


EXAMPLES = examples()


def test_the_pages_have_examples_to_run() -> None:
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("source", [s for _, s in EXAMPLES], ids=[w for w, _ in EXAMPLES])
def test_a_docs_example_runs(source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # whatever an example writes stays in the test's directory
    exec(compile(source, "<docs example>", "exec"), {"__name__": "__docs_example__"})
