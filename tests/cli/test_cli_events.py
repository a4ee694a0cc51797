"""`convoq watch` prints every kind of event a turn's stream can carry: none is dropped."""

from __future__ import annotations

from typing import get_args

import pytest

from convoq.cli import _render
from convoq.turn_state import EventType, TurnEvent

SAMPLES = {
    "status": {"status": "running"},
    "text_delta": {"text": "Hel"},
    "text_retracted": {"reason": "model_retry", "retry": 1},
    "assistant": {"text": "Hello"},
    "tool_call": {"id": "c1", "name": "refund", "arguments": {"amount": 5}},
    "tool_result": {"name": "refund", "result": "refunded 5"},
    "approval_required": {"id": "c1", "name": "refund", "arguments": {"amount": 5}},
    "decision": {"call_id": "c1", "approved": True},
    "resumed": {"reason": "worker_lost", "attempt": 2},
    "retried": {"retry": 1},
    "subagent_call": {
        "id": "c2",
        "agent": "researcher",
        "conversation_id": "u~sub~1",
        "turn_id": "t1",
    },
    "guardrail_tripped": {"guardrail": "no_secrets", "kind": "input", "reason": "a password"},
    "handoff": {"call_id": "h1", "from": "triage", "to": "billing"},
    "stop_requested": {"mode": "interrupt", "by": "t2"},
    "merged": {"turn_id": "t3"},
    "deferred": {
        "call_id": "d1",
        "name": "pay",
        "on": "signal",
        "signal": "paid",
        "timeout_s": 60,
        "metadata": {},
    },
    "result_supplied": {"call_id": "d2", "approved": True, "by": "billing", "result": "{}"},
    "signal_delivered": {"call_id": "d1", "signal": "paid", "id": "s1", "by": "stripe"},
    "done": {"status": "succeeded"},
}
# Its text is shown by the text deltas before it and the result after it.
SILENT = {"assistant"}


def test_the_samples_cover_every_event_type() -> None:
    assert set(SAMPLES) == set(get_args(EventType))


@pytest.mark.parametrize("kind", sorted(set(SAMPLES) - SILENT))
def test_watch_prints_each_kind_of_event(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    _render.print_event(TurnEvent(type=kind, data=SAMPLES[kind]))  # type: ignore[arg-type]
    printed = capsys.readouterr().out
    assert printed.strip(), f"a {kind} event printed nothing"


def test_a_guardrail_tripped_event_names_the_guardrail_and_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _render.print_event(TurnEvent(type="guardrail_tripped", data=SAMPLES["guardrail_tripped"]))
    assert "guardrail_tripped input no_secrets: a password" in capsys.readouterr().out


def test_a_handoff_event_names_both_agents(capsys: pytest.CaptureFixture[str]) -> None:
    _render.print_event(TurnEvent(type="handoff", data=SAMPLES["handoff"]))
    assert "handoff triage -> billing" in capsys.readouterr().out


def test_a_subagent_call_event_names_the_child_turn(capsys: pytest.CaptureFixture[str]) -> None:
    _render.print_event(TurnEvent(type="subagent_call", data=SAMPLES["subagent_call"]))
    assert "subagent_call c2 researcher -> u~sub~1 t1" in capsys.readouterr().out


def test_a_resumed_event_says_why_and_which_attempt(capsys: pytest.CaptureFixture[str]) -> None:
    _render.print_event(TurnEvent(type="resumed", data=SAMPLES["resumed"]))
    assert "resumed worker_lost (attempt 2)" in capsys.readouterr().out


def test_a_retried_event_says_which_retry(capsys: pytest.CaptureFixture[str]) -> None:
    _render.print_event(TurnEvent(type="retried", data=SAMPLES["retried"]))
    assert "retried (retry 1)" in capsys.readouterr().out


def test_double_texting_events_say_what_was_asked(capsys: pytest.CaptureFixture[str]) -> None:
    _render.print_event(TurnEvent(type="stop_requested", data=SAMPLES["stop_requested"]))
    _render.print_event(TurnEvent(type="merged", data=SAMPLES["merged"]))
    out = capsys.readouterr().out
    assert "stop_requested mode=interrupt by=t2" in out and "merged turn_id=t3" in out


def test_waits_for_the_world_say_what_a_call_waits_for_and_what_ended_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for kind in ("deferred", "result_supplied", "signal_delivered"):
        _render.print_event(TurnEvent(type=kind, data=SAMPLES[kind]))  # type: ignore[arg-type]
    printed = capsys.readouterr().out
    assert "deferred d1 pay waits for signal paid" in printed
    assert "result_supplied d2 by billing" in printed
    assert "signal_delivered d1: signal paid from stripe" in printed
