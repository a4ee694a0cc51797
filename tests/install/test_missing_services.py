"""A service a test needs but the machine lacks (RabbitMQ, redis-cli, Chromium, Playwright,
openssl) skips the test with how to get it, and fails it under ``CI=true``, where .ci/run
installs every one: a broken CI setup must not pass as a green run of fewer tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import services

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("ci", ["true", "1"])
def test_under_ci_a_missing_service_fails_the_test(
    ci: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    with pytest.raises(pytest.fail.Exception, match=r"no chromium on PATH.*CI=true"):
        services.chromium()
    with pytest.raises(pytest.fail.Exception, match="openssl"):
        services.openssl()


@pytest.mark.parametrize("ci", [None, "", "false"])
def test_elsewhere_a_missing_service_skips_and_says_how_to_get_it(
    ci: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.skip.Exception, match=r"apt-get install -y chromium"):
        services.chromium()


def test_a_present_service_is_handed_over_under_ci(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CI", "true")
    browser = tmp_path / "chromium"
    browser.write_text("#!/bin/sh\n")
    browser.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert services.chromium() == str(browser)


_SERVICE = re.compile(r"rabbitmq|amqp|redis-cli|chromium|playwright|openssl", re.IGNORECASE)


def test_every_test_needing_a_service_goes_through_the_one_policy() -> None:
    own = TESTS / "support" / "services.py"
    offending = []
    for path in TESTS.rglob("*.py"):
        if path == own:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            skipping = "pytest.skip(" in line or "importorskip(" in line
            if skipping and _SERVICE.search(line):
                offending.append(f"{path.relative_to(TESTS)}:{number}")
    assert offending == []
