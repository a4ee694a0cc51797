"""The floor versions pyproject.toml declares are true: convoq installed with every
dependency at its floor, all at once, runs a turn through a worker. The libraries whose
internals the fast paths lean on (redis-py, kombu, Celery) are bounded below their next
major release.

The install test is slow (a fresh venv and an install; pip's cache serves the wheels on a
rerun) and bounded by its timeout.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.support.fresh_install import (
    ROOT,
    declared_floors,
    install,
    installed_versions,
    run_a_turn,
)


def test_the_fast_path_libraries_are_bounded_below_the_next_major_of_what_is_tested() -> None:
    lines = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {Requirement(line).name: Requirement(line).specifier for line in lines}
    for name in ("redis", "kombu", "celery"):
        (bound,) = [s.version for s in declared[name] if s.operator == "<"]
        # The release this suite runs against is inside the bound, and the bound is the
        # next major release: one nobody has run these fast paths on.
        tested = Version(metadata.version(name))
        assert Version(bound) == Version(f"{tested.major + 1}"), (name, tested, bound)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_declared_floor_versions_run_a_turn_through_a_worker(
    redis_url: str, tmp_path: Path
) -> None:
    floors = declared_floors()
    python = install(tmp_path, *floors)
    held = installed_versions(python)
    for pin in floors:  # the venv holds each floor itself, not something newer
        name, version = pin.split("==")
        assert Version(held[name]) == Version(version), (pin, held[name])
    answer = run_a_turn(python, redis_url, tmp_path)
    assert "Ada" in answer and "image intact" in answer
