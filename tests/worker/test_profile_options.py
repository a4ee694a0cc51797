"""Every option of ``Agent(...)`` is honoured by workers or refused when a worker starts:
a table decides each one (the test named where it is honoured, the error where it is
refused), and a parameter the table does not know fails here. On real workers: a
profile's own ``approval_ttl_s`` governs its parked turns (convoq and Pydantic AI
profiles; the worker's ``CONVOQ_APPROVAL_TTL_S`` only for a profile without one),
``max_steps``, ``token_counter`` and ``deps``; a worker refuses to start with a profile
that sets an option it cannot honour."""

from __future__ import annotations

import inspect
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from convoq import Agent, Client
from convoq.errors import ConfigurationError, ConvoqError, MaxStepsExceededError
from convoq.memory import InMemoryConversationMemory
from convoq.models import ScriptedModel
from convoq.redis.keys import KeySchema
from convoq.worker.profiles import Profiles
from tests.support.redis_server import RedisServer
from tests.support.workers import ROOT, WorkerPool, module_pool, running_pool, worker_env

HERE = "tests/worker/test_profile_options.py"
E2E = "tests/worker/test_worker_e2e.py"
CONTEXT = "tests/test_run_context_workers.py"
OUTPUT = "tests/test_output_workers.py"
GUARDRAILS = "tests/test_guardrails_workers.py"
TRIPPED = "test_a_tripped_guardrail_blocks_the_queued_turn_and_stores_nothing"


@dataclass(frozen=True)
class Honoured:
    """Workers honour the option; the test ``name`` in ``path`` shows it on workers."""

    path: str
    name: str


@dataclass(frozen=True)
class Refused:
    """A worker refuses to start with a profile that sets it (``value`` sets it)."""

    value: Callable[[], Any]


OPTIONS: dict[str, Honoured | Refused] = {
    "model": Honoured(E2E, "test_end_to_end_memory_attachments_and_failures"),
    "instructions": Honoured(
        CONTEXT, "test_a_tool_sees_its_turn_metadata_and_deps_and_instructions_read_them"
    ),
    "memory": Refused(InMemoryConversationMemory),
    "conversation_id": Refused(lambda: "user-42"),
    "tools": Honoured(E2E, "test_approval_from_another_process_resumes_on_another_worker"),
    "keep_last_turns": Honoured(E2E, "test_keep_last_turns_limits_what_the_model_sees"),
    "max_history_tokens": Honoured(E2E, "test_token_budget_and_awkward_ids_through_the_workers"),
    "token_counter": Honoured(HERE, "test_a_profiles_token_counter_chooses_its_window_on_workers"),
    "name": Honoured(E2E, "test_end_to_end_memory_attachments_and_failures"),
    "max_steps": Honoured(HERE, "test_a_profiles_max_steps_bounds_its_turns_on_workers"),
    "fail_on_length": Honoured(
        "tests/test_usage.py", "test_cut_off_answers_are_reported_or_failed_as_the_profile_says"
    ),
    "if_busy": Refused(lambda: "wait"),
    "busy_timeout_s": Refused(lambda: 5.0),
    "approval_ttl_s": Honoured(HERE, "test_a_profiles_approval_ttl_governs_its_parked_turns"),
    "compaction": Honoured(E2E, "test_a_compact_task_summarises_behind_the_turns"),
    "output_type": Honoured(
        OUTPUT, "test_a_profiles_output_type_and_the_turns_settings_reach_the_model"
    ),
    "output_retries": Honoured(
        OUTPUT, "test_a_turn_whose_answer_never_fits_fails_with_the_last_answer"
    ),
    "model_settings": Honoured(
        OUTPUT, "test_a_profiles_output_type_and_the_turns_settings_reach_the_model"
    ),
    "deps": Honoured(HERE, "test_a_profiles_deps_reach_its_tools_on_workers"),
    "deps_factory": Honoured(
        CONTEXT, "test_a_tool_sees_its_turn_metadata_and_deps_and_instructions_read_them"
    ),
    "approval_policy": Honoured(
        CONTEXT, "test_an_agent_policy_decides_on_workers_from_the_metadata"
    ),
    "mcp_servers": Honoured(
        "tests/mcp/test_mcp_workers.py",
        "test_a_worker_keeps_its_session_and_reports_the_server_healthy",
    ),
    "input_guardrails": Honoured(GUARDRAILS, TRIPPED),
    "output_guardrails": Honoured(GUARDRAILS, TRIPPED),
    "subagents": Honoured(
        "tests/test_subagents_workers.py",
        "test_three_calls_fan_out_on_two_pools_and_the_parent_resumes_once",
    ),
    "handoffs": Honoured(
        "tests/test_handoffs_workers.py",
        "test_a_turn_handed_to_another_pool_finishes_there_and_the_next_turns_follow",
    ),
}
REFUSED = sorted(name for name, decided in OPTIONS.items() if isinstance(decided, Refused))


def _model() -> ScriptedModel:
    return ScriptedModel(lambda request: "ok")


def test_every_agent_option_is_decided_for_workers() -> None:
    parameters = set(inspect.signature(Agent.__init__).parameters) - {"self"}
    undecided = sorted(parameters - set(OPTIONS))
    assert not undecided, (
        f"Agent options {undecided} are neither honoured on workers (name the test) nor"
        " refused in Agent.worker_refusals: decide each in OPTIONS"
    )
    assert not set(OPTIONS) - parameters, "OPTIONS names options Agent no longer has"


@pytest.mark.parametrize("option", sorted(n for n, d in OPTIONS.items() if isinstance(d, Honoured)))
def test_each_honoured_option_names_a_test_that_exists(option: str) -> None:
    decided = OPTIONS[option]
    assert isinstance(decided, Honoured)
    test = f"def {decided.name}("
    assert test in (ROOT / decided.path).read_text(), f"{decided.path} has no {decided.name}"


def test_a_profile_that_sets_no_refused_option_is_served() -> None:
    assert Agent(_model(), name="plain").worker_refusals() == {}
    assert list(Profiles([Agent(_model(), name="plain")])) == ["plain"]


@pytest.mark.parametrize("option", REFUSED)
def test_a_refused_option_stops_the_profile_naming_it(option: str) -> None:
    decided = OPTIONS[option]
    assert isinstance(decided, Refused)
    agent = Agent(_model(), name="keeper", **{option: decided.value()})
    with pytest.raises(ConfigurationError) as caught:
        Profiles([agent])
    assert "'keeper'" in caught.value.message and option in caught.value.message
    assert caught.value.details == {"profile": "keeper", "options": [option]}


def test_a_worker_refuses_to_start_with_a_profile_it_cannot_honour(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    (tmp_path / "kept_agents.py").write_text(
        "from convoq import Agent\n"
        "from convoq.memory import InMemoryConversationMemory\n"
        "from convoq.models import ScriptedModel\n"
        "keeper = Agent(ScriptedModel(lambda r: 'ok'), name='keeper',\n"
        "               memory=InMemoryConversationMemory(), if_busy='wait')\n"
    )
    env = worker_env(redis_server.url, f"w{uuid.uuid4().hex[:8]}", agents="kept_agents")
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    command = [sys.executable, "-m", "convoq.cli", "worker"]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: agent profile 'keeper' sets ['if_busy', 'memory']")
    assert "Traceback" not in done.stderr


# -- on real workers -------------------------------------------------------------------

pool = module_pool(1, agents="tests.support.option_agents", approval_ttl_s=3600,
                   sweep_interval_s=0.5)  # fmt: skip


def _parked(client: Client, agent: str) -> tuple[Any, str]:
    handle = client.submit(f"ttl-{uuid.uuid4().hex[:8]}", "refund me", agent=agent)
    parked = handle.wait(30)
    assert parked.status == "awaiting_approval"
    [call] = parked.pending_approvals
    return handle, call.id


def _parked_for_ms(r: redis.Redis, pool: WorkerPool, handle: Any) -> int:
    """How long the parked turn's approval may wait: its lease's expiry minus the park."""
    keys = KeySchema(pool.prefix)
    expires = int(r.hget(keys.lease(handle.conversation_id), "expires_ms") or 0)
    parked = int(r.hget(keys.turn(handle.conversation_id, handle.turn_id), "parked_ms") or 0)
    assert expires and parked
    return expires - parked


@pytest.mark.slow
@pytest.mark.parametrize(("agent", "ttl_ms"), [("refunds", 20_000), ("refunds_default", 3_600_000)])
def test_a_profiles_approval_ttl_governs_its_parked_turns(
    client: Client, r: redis.Redis, pool: WorkerPool, agent: str, ttl_ms: int
) -> None:
    handle, call_id = _parked(client, agent)
    # The profile's own ttl (refunds: 20 s), else the worker's CONVOQ_APPROVAL_TTL_S.
    assert _parked_for_ms(r, pool, handle) == ttl_ms
    lease = KeySchema(pool.prefix).lease(handle.conversation_id)
    assert 0 < r.pttl(lease) <= ttl_ms
    # The lease lives as long as the approval may wait: its end is the expiry (ended here
    # by the test, not raced). An approval after it is refused and the refund never runs.
    assert r.delete(lease) == 1
    assert handle.wait(30, raise_on_error=False, until="final").status == "expired"
    with pytest.raises(ConvoqError):
        client.approve(handle, call_id)
    assert r.lrange(f"{pool.prefix}:test:refunds", 0, -1) == []


@pytest.mark.slow
def test_a_short_profile_ttl_expires_the_turn_by_itself(
    client: Client, r: redis.Redis, pool: WorkerPool
) -> None:
    handle, _ = _parked(client, "refunds_quick")  # approval_ttl_s=2; the worker's is 3600
    done = handle.wait(30, raise_on_error=False, until="final")
    assert done.status == "expired"
    record = r.hmget(KeySchema(pool.prefix).turn(handle.conversation_id, handle.turn_id),
                     "parked_ms", "finished_ms")  # fmt: skip
    parked_ms, finished_ms = (int(v) for v in record)
    assert 2_000 <= finished_ms - parked_ms < 30_000  # expired by its 2 s, not earlier


@pytest.mark.slow
def test_a_pydantic_ai_profiles_approval_ttl_governs_its_parked_turns(
    redis_server: RedisServer, tmp_path: Path, r: redis.Redis
) -> None:
    agents = "tests.support.pai_ttl_agents"
    with (
        running_pool(redis_server.url, tmp_path, 1, agents=agents, approval_ttl_s=3600) as pai,
        pai.client() as client,
    ):
        handle, call_id = _parked(client, "pai-refunds")
        assert _parked_for_ms(r, pai, handle) == 20_000  # durable(..., approval_ttl_s=20)
        assert r.delete(KeySchema(pai.prefix).lease(handle.conversation_id)) == 1
        done = handle.wait(30, raise_on_error=False, until="final")
        assert done.decisions[call_id].expired and not done.decisions[call_id].approved
    assert r.lrange(f"{pai.prefix}:test:refunds", 0, -1) == []


@pytest.mark.slow
def test_a_profiles_max_steps_bounds_its_turns_on_workers(client: Client) -> None:
    handle = client.submit(f"steps-{uuid.uuid4().hex[:8]}", "loop", agent="looper")
    with pytest.raises(MaxStepsExceededError):
        handle.wait(30)
    assert client.history(handle.conversation_id) == []


@pytest.mark.slow
def test_a_profiles_token_counter_chooses_its_window_on_workers(client: Client) -> None:
    cid = f"count-{uuid.uuid4().hex[:8]}"
    for text in ("light-1", "heavy-2", "light-3"):
        assert client.submit(cid, text, agent="counted").wait(30).ok
    # The counter prices "heavy" at 1000 tokens: over the budget of 100, so the window
    # stops before it (an estimate would have sent every turn).
    assert client.submit(cid, "last", agent="counted").wait(30).text == "light-3 | last"


@pytest.mark.slow
def test_a_profiles_deps_reach_its_tools_on_workers(client: Client) -> None:
    result = client.submit(f"deps-{uuid.uuid4().hex[:8]}", "whose?", agent="with_deps").wait(30)
    assert result.text == "deps: the-deps"
