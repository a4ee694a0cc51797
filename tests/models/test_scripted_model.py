"""ScriptedModel remembers the last few requests it was given, never all of them: a
worker serving it (the demo agents) does not grow with every turn."""

from __future__ import annotations

import pytest

from convoq import Agent
from convoq.errors import ConfigurationError
from convoq.models import ModelRequest, ScriptedModel
from convoq.models.scripted import KEEP_CALLS


def _echo(request: ModelRequest) -> str:
    return f"seen {request.messages[-1].text}"


def test_a_long_lived_model_keeps_only_its_newest_requests() -> None:
    model = ScriptedModel(_echo)
    agent = Agent(model)  # no memory: one turn per call, never growing the request itself
    for n in range(KEEP_CALLS * 4):
        assert agent.generate(f"m{n}").text == f"seen m{n}"
    assert model.call_count == KEEP_CALLS * 4
    assert len(model.calls) == KEEP_CALLS
    first_kept = KEEP_CALLS * 3
    assert [c.messages[-1].text for c in model.calls] == [
        f"m{n}" for n in range(first_kept, KEEP_CALLS * 4)
    ]
    assert model.calls[-1].messages[-1].text == f"m{KEEP_CALLS * 4 - 1}"


@pytest.mark.parametrize("keep", [0, 3])
def test_how_many_requests_are_kept_is_the_callers_choice(keep: int) -> None:
    model = ScriptedModel.from_replies(["a", "b", "c", "d", "e"], keep_calls=keep)
    agent = Agent(model)
    for text in ("1", "2", "3", "4", "5"):
        agent.generate(text)
    assert model.call_count == 5
    assert [c.messages[-1].text for c in model.calls] == ["3", "4", "5"][3 - keep :]


def test_a_negative_number_of_requests_to_keep_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="keep_calls must be >= 0"):
        ScriptedModel(_echo, keep_calls=-1)
