"""The OpenAPI document is the truth: schemathesis, with every check on, against the real
gateway (uvicorn) over a real worker and Redis, must report no failure.

Schemathesis reads ``/openapi.json`` and sends what it describes and what it refuses:
examples at the boundaries of every limit, values outside them, missing and bad keys,
methods a path does not serve, then chains of calls that follow the turns it created.
Every answer is checked against the document (status, media type, headers, schema) and
against HTTP (no 5xx, refused input refused, valid input accepted, a key needed). The
stateful phase follows the document's links: a submit to its turn (long-polled until
settled), its events (until settled) and its cancel; a turn to the decision on its first
pending call (a real call id, when its submit named the agent that parks for approval), to
its discard, and to its retry (when it failed). Those two links need a turn the random
submits may not have made; test_gateway.py follows them every time.
Bounded: a few examples per operation, a few steps per scenario, one seed, a few minutes at
most on a loaded machine.

The deployment lets callbacks reach every network (the document cannot know which
networks a deployment allows) and its workers try each callback once, briefly. Content
over a size limit is refused with 413 (Content Too Large), which the check of refused
input is told to count as the refusal it is.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from convoq.gateway.routes_turns import MAX_WAIT_S
from tests.support.gateway import GatewayProcess, key_of, running_gateway
from tests.support.workers import WorkerPool, module_pool

pytestmark = pytest.mark.slow

MAX_TURN_BYTES = 64 * 1024
EXAMPLES_PER_OPERATION = 8
STATEFUL_STEPS = 12
# convoq.gateway routes_turns: submit -> turn, events, cancel; turn -> decide, discard, retry.
DECLARED_LINKS = 6
SEED = 20261201
NEEDS_A_TURN_OF_ITS_OWN = {
    "/v1/conversations/{cid}/turns/{tid}/approvals/{call_id}",
    "/v1/conversations/{cid}/turns/{tid}/retry",
}
# What valid input may be answered with on the submit route: schemathesis' default, and
# 422 for the one cross-field rule the document cannot state as a schema (see the config).
ACCEPTED = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]
# Schemathesis' own list of refusals (its default), plus 413.
REFUSALS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429",
            "5xx"]  # fmt: skip

pool = module_pool(
    1,
    agents="tests.support.fuzz_agents",
    max_turn_bytes=MAX_TURN_BYTES,
    webhook_max_retries=0,
    webhook_timeout_s=1,
)


@pytest.fixture(scope="module")
def gateway(pool: WorkerPool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    logs = tmp_path_factory.mktemp("gateway")
    with running_gateway(
        pool, logs, callback_allowed_networks="0.0.0.0/0,::/0", max_turn_bytes=str(MAX_TURN_BYTES)
    ) as started:
        yield started


@pytest.mark.timeout(600)
def test_schemathesis_finds_no_failure(gateway: GatewayProcess, tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        # A long poll (?wait=N, at most 60 s) of a turn that is not final in time, such
        # as one scheduled for later, answers after its N seconds, as documented.
        f"[checks]\nmax_response_time = {MAX_WAIT_S + 10}\n"
        f"[checks.negative_data_rejection]\nexpected-statuses = {REFUSALS!r}\n"
        f"[generation]\nmax-examples = {EXAMPLES_PER_OPERATION}\n"
        f"[phases.stateful]\nmax-steps = {STATEFUL_STEPS}\n"
        # Only the document's own links: those schemathesis infers (a turn id in any
        # answer into every route that takes one) long-poll scheduled turns until final,
        # a minute each, and add no route the declared links and the other phases miss.
        "[phases.stateful.inference]\nalgorithms = []\n"
        # A submit's body has one rule across its fields the document states in words
        # only: a double-texting if_busy cannot be scheduled (422, InvalidScheduleError;
        # test_gateway_scheduled.py). Written as if/then, schemathesis fails on the
        # multipart form's binary parts; so for this operation alone, valid data may be
        # answered 422.
        '[[operations]]\ninclude-path = "/v1/conversations/{cid}/turns"\n'
        'include-method = "POST"\n'
        f"[operations.checks.positive_data_acceptance]\nexpected-statuses = {ACCEPTED!r}\n"
    )
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(config),
        "run", f"{gateway.url}/openapi.json",
        "--header", f"Authorization: Bearer {key_of('admin')}",
        "--checks", "all",
        "--seed", str(SEED),
        "--workers", "1",
        "--generation-database", "none",
        "--no-shrink",  # a failure is reported as found: shrinking could replay long polls
        # The links bound what the stateful phase waits for: a long poll and an event
        # stream each end once the turn is final or parked for approval.
        "--phases", "examples,coverage,fuzzing,stateful",
        "--request-timeout", "70",
        "--report-dir", str(tmp_path / "report"),
    ]  # fmt: skip
    log = tmp_path / "schemathesis.log"
    with log.open("w") as out:
        run = subprocess.run(command, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                             timeout=480, check=False)  # fmt: skip
    output = log.read_text()
    assert "Operations:       25 selected / 25 total" in output, output[-8000:]
    # The stateful phase ran and followed the document's links. Two need a turn its random
    # submits may not have made: a decision needs one parked (agent approver) and a retry
    # one failed (agent failer); those two links are followed every time by test_gateway.py
    # (test_the_links_of_a_parked_and_of_a_failed_turn_lead_to_calls_that_go_through).
    assert "✅  Stateful" in output, output[-8000:]
    links = re.search(r"API Links:\s+(\d+) covered / (\d+) selected", output)
    assert links and int(links[2]) >= DECLARED_LINKS, output[-8000:]
    unusable = set(
        re.findall(
            r"^\s+- POST (\S+)$", output.partition("not usable")[2].partition("💡")[0], re.MULTILINE
        )
    )
    assert unusable <= NEEDS_A_TURN_OF_ITS_OWN, output[-8000:]
    # Links into a deferred call's result (inferred from every tool call a response shows,
    # where inference is on) need a turn waiting for that call, which the random submits
    # never make; test_gateway_waits.py posts results (and signals) every time.
    waiting = _links_into(gateway, "calls_call_id_result")
    assert int(links[1]) >= int(links[2]) - len(unusable) - len(waiting), output[-8000:]
    failures = output[output.find("=== FAILURES") :] if "=== FAILURES" in output else output
    assert run.returncode == 0, f"{failures[:20000]}\n--- gateway log ---\n{gateway.log_tail(20)}"


def _links_into(gateway: GatewayProcess, operation: str) -> list[str]:
    """The links (declared or inferred) of the gateway's document into ``operation``
    (its name as schemathesis spells it in its state machine's rules)."""
    import schemathesis

    schema = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")
    machine = schema.as_state_machine()
    return [name for name in dir(machine) if "__" in name and name.endswith(operation)]
