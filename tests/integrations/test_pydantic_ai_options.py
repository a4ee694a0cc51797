"""What a submit asks of a turn reaches a Pydantic AI profile as Pydantic AI's own run
arguments: model settings (the model sees them), metadata (tools see ``ctx.metadata``),
an output schema (the answer comes back as JSON that fits it, a misfit is retried); what
Pydantic AI cannot take fails the turn naming the profile and the option. First the
profile on its own, then on real workers, through the client and the gateway."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from convoq import Client
from convoq.client._base import asked_options
from convoq.engine import Completed
from convoq.errors import ConfigurationError, InvalidModelSettingsError, OutputValidationError
from convoq.integrations.pydantic_ai import durable
from convoq.messages import Message
from convoq.profile import TurnJob
from convoq.turn_state import TurnEvent, TurnState
from tests.support.gateway import GatewayProcess, module_gateway
from tests.support.option_agents import pai_options
from tests.support.workers import module_pool


class Seen(BaseModel):
    tenant: str
    temperature: float


@dataclass
class Recorder:
    """A worker's side of one run, in process: what the profile journals and emits."""

    events: list[TurnEvent] = field(default_factory=list)

    async def checkpoint(self, state: TurnState) -> None:
        pass

    async def emit(self, event: TurnEvent) -> None:
        self.events.append(event)

    async def should_stop(self) -> bool:
        return False

    def job(self, text: str, options: dict[str, Any], metadata: dict[str, Any]) -> TurnJob:
        state = TurnState.start(Message.user(text))
        return TurnJob("c", "t", "pai-options", state, [], self.emit, self.checkpoint,
                       self.should_stop, metadata=metadata, options=options)  # fmt: skip


async def _run(text: str, metadata: dict[str, Any] | None = None, **asked: Any) -> Completed:
    options = asked_options(asked.get("model_settings"), asked.get("output_type"))
    job = Recorder().job(text, options, metadata or {})
    done = await durable(pai_options).run_turn(job)
    assert isinstance(done, Completed)
    return done


async def test_model_settings_and_metadata_reach_the_model_and_the_tools() -> None:
    settings = {
        "temperature": 0.2, "max_tokens": 50, "top_p": 0.9, "seed": 7, "stop": ["END"],
        "parallel_tool_calls": False, "tool_choice": "auto", "extra_body": {"k": 1},
    }  # fmt: skip
    done = await _run("hi", {"tenant": "acme"}, model_settings=settings)
    seen = json.loads(done.text)
    assert seen["metadata"] == {"tenant": "acme"}
    assert seen["settings"] == {
        "temperature": 0.2, "max_tokens": 50, "top_p": 0.9, "seed": 7,
        "stop_sequences": ["END"], "parallel_tool_calls": False, "tool_choice": "auto",
        "extra_body": {"k": 1},
    }  # fmt: skip


async def test_without_options_the_run_is_the_agents_own() -> None:
    seen = json.loads((await _run("hi")).text)
    assert seen == {"settings": {}, "metadata": None}


async def test_the_turns_settings_merge_over_the_agents_extra_body_key_by_key() -> None:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[TextPart(json.dumps(info.model_settings, sort_keys=True))])

    agent = Agent(
        FunctionModel(model), name="merged",
        model_settings={"temperature": 1.0, "max_tokens": 9, "extra_body": {"a": 1, "b": 1}},
    )  # fmt: skip
    options = asked_options({"temperature": 0.1, "extra_body": {"b": 2}}, None)
    job = Recorder().job("hi", options, {})
    done = await durable(agent).run_turn(job)
    assert isinstance(done, Completed)
    assert json.loads(done.text) == {
        "temperature": 0.1,
        "max_tokens": 9,
        "extra_body": {"a": 1, "b": 2},
    }


async def test_an_output_schema_gives_json_that_fits_it() -> None:
    done = await _run("hi", {"tenant": "acme"}, model_settings={"temperature": 0.5},
                      output_type=Seen)  # fmt: skip
    assert done.output is not None
    assert done.output.data == {"tenant": "acme", "temperature": 0.5}
    assert Seen.model_validate(done.output.data) == Seen(tenant="acme", temperature=0.5)


async def test_an_answer_that_misfits_the_schema_is_retried_with_the_errors() -> None:
    done = await _run("misfit", {"tenant": "acme"}, model_settings={"temperature": 0.5},
                      output_type=Seen)  # fmt: skip
    assert done.output is not None and done.output.data["tenant"] == "acme"
    retry = [m for m in done.messages if "does not fit" in m.text]
    assert retry and "tenant" in retry[0].text


async def test_an_answer_that_never_fits_fails_naming_the_profile_and_schema() -> None:
    with pytest.raises(OutputValidationError) as caught:
        await _run("always misfit", {"tenant": "acme"}, model_settings={"temperature": 0.5},
                   output_type=Seen)  # fmt: skip
    assert "'pai-options'" in caught.value.message and "'Seen'" in caught.value.message
    assert caught.value.details["output"] == "Seen" and caught.value.errors


@pytest.mark.parametrize("choice", ["required", "peek"])
async def test_a_tool_choice_pydantic_ai_refuses_for_a_run_names_profile_and_option(
    choice: str,
) -> None:
    with pytest.raises(InvalidModelSettingsError) as caught:
        await _run("hi", model_settings={"tool_choice": choice})
    assert "'pai-options'" in caught.value.message and "tool_choice" in caught.value.message
    assert caught.value.details == {"field": "tool_choice", "profile": "pai-options"}


def _validated(output_type: Any, checked: list[str]) -> Agent[None, Any]:
    agent = Agent(TestModel(custom_output_text="hi"), name="validated", output_type=output_type)

    @agent.output_validator
    def check(value: Any) -> Any:
        checked.append(value)
        return value

    return agent


async def test_an_agent_with_output_validators_runs_with_its_own_output_type() -> None:
    checked: list[str] = []
    profile = durable(_validated([str, DeferredToolRequests], checked))
    done = await profile.run_turn(Recorder().job("hi", {}, {}))
    assert isinstance(done, Completed) and done.text == "hi" and checked == ["hi"]


@pytest.mark.parametrize(
    ("output_type", "schema", "option"),
    [(str, None, "output_type"), ([str, DeferredToolRequests], Seen, "output_schema")],
)
async def test_output_validators_pydantic_ai_cannot_run_are_refused_naming_the_profile(
    output_type: Any, schema: Any, option: str
) -> None:
    checked: list[str] = []
    job = Recorder().job("hi", asked_options(None, schema), {})
    with pytest.raises(ConfigurationError) as caught:
        await durable(_validated(output_type, checked)).run_turn(job)
    assert "'validated'" in caught.value.message and option in caught.value.message
    assert caught.value.details == {"profile": "validated", "option": option}
    assert checked == []


# -- on real workers -------------------------------------------------------------------

pool = module_pool(1, agents="tests.support.option_agents")
gateway = module_gateway()


@pytest.mark.slow
def test_a_submit_asks_a_pydantic_ai_profile_on_a_worker(client: Client) -> None:
    cid = f"opt-{uuid.uuid4().hex[:8]}"
    tenant = {"tenant": "acme"}
    plain = client.submit(
        cid, "hi", agent="pai-options", model_settings={"temperature": 0.3}, metadata=tenant
    )
    assert json.loads(plain.wait(30).text) == {"settings": {"temperature": 0.3}, "metadata": tenant}
    typed = client.submit(cid, "misfit", agent="pai-options", output_type=Seen,
                          model_settings={"temperature": 0.4}, metadata=tenant)  # fmt: skip
    assert typed.wait(30, output_type=Seen).output == Seen(tenant="acme", temperature=0.4)
    required = {"tool_choice": "required"}
    refused = client.submit(cid, "hi", agent="pai-options", model_settings=required)
    with pytest.raises(InvalidModelSettingsError) as caught:
        refused.wait(30)
    assert "'pai-options'" in caught.value.message and "tool_choice" in caught.value.message
    assert client.handle(cid, refused.turn_id).status() == "failed"
    # Two turns stored (the typed one with its retry); the refused one stored nothing.
    users = [m for m in client.history(cid) if m.role.value == "user"]
    assert [m.text for m in users] == ["hi", "misfit"]


@pytest.mark.slow
def test_the_gateway_submits_the_same_options(gateway: GatewayProcess) -> None:
    cid = f"opt-{uuid.uuid4().hex[:8]}"
    turns = f"/v1/conversations/{cid}/turns"
    schema = {
        "type": "object",
        "properties": {"tenant": {"type": "string"}, "temperature": {"type": "number"}},
        "required": ["tenant", "temperature"],
    }
    body = {"message": "hi", "agent": "pai-options", "model_settings": {"temperature": 0.6},
            "metadata": {"tenant": "acme"}, "output_schema": schema}  # fmt: skip
    with gateway.client("submitter") as http:
        submitted = http.post(turns, json=body)
        assert submitted.status_code == 202, submitted.text
        tid = submitted.json()["turn_id"]
        done = http.get(f"{turns}/{tid}", params={"wait": 30, "until": "final"}).json()
    assert done["status"] == "succeeded", done
    assert done["output"] == {"tenant": "acme", "temperature": 0.6}
