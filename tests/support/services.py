"""What a test does when a service it needs is not on this machine (RabbitMQ, redis-cli,
Chromium, Playwright, openssl): it skips and says how to get it, except under ``CI=true``,
where it fails: CI installs every one of them (.ci/run), so a missing one there is a
broken setup, never a test to pass over."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def missing(what: str) -> NoReturn:
    """Skip for want of ``what`` (what is missing and how to get it), or fail under CI."""
    if in_ci():
        pytest.fail(f"{what} (CI=true: .ci/run installs it, so this must not be missing)")
    pytest.skip(what)


def redis_cli() -> str:
    """The redis-cli binary (joins redis-servers into a cluster)."""
    from tests.support.redis_cluster import redis_cli_binary  # it imports tls, which uses us

    cli = redis_cli_binary()
    if cli is None:
        missing("no redis-cli binary: cannot join redis-servers into a cluster"
                " (apt-get install -y redis-tools)")  # fmt: skip
    return cli


def rabbitmq() -> None:
    """RabbitMQ listening on 127.0.0.1:5672."""
    from tests.support.rabbitmq import amqp_listening  # it imports the workers' helpers

    if not amqp_listening():
        missing("no RabbitMQ listening on 127.0.0.1:5672 (apt-get install -y rabbitmq-server,"
                " then rabbitmq-server -detached)")  # fmt: skip


def chromium() -> str:
    """Debian's chromium (Playwright drives it and downloads no browser)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        missing("no chromium on PATH: install Debian's (apt-get install -y chromium)")
    return found


def openssl() -> str:
    """The openssl command (makes test certificates)."""
    found = shutil.which("openssl")
    if found is None:
        missing("the openssl command is needed to make test certificates"
                " (apt-get install -y openssl)")  # fmt: skip
    return found
