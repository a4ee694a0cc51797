"""What a submitted turn asks of a Pydantic AI run: its options as Pydantic AI's own.

A turn carries ``model_settings``, an output schema and ``metadata`` (see
:class:`convoq.profile.TurnJob`). Each becomes an argument of ``Agent.run``: the settings
its ``model_settings`` (merged over the agent's own as Pydantic AI merges them,
``extra_body`` key by key as convoq does), the schema a :func:`~pydantic_ai.StructuredDict`
output type whose answers are checked against the schema (a misfit is a retry the model
reads, as with convoq agents), the metadata (``TurnJob.metadata``) its ``metadata``
(``ctx.metadata`` in tools). What Pydantic AI cannot take fails the turn with an error
naming the profile and the option; nothing is dropped.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic_ai import ModelRetry, StructuredDict
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.output import OutputContext
from pydantic_ai.settings import ModelSettings as PaiSettings
from pydantic_ai.tools import RunContext

from convoq.errors import InvalidModelSettingsError, OutputValidationError
from convoq.model_settings import ModelSettings, coerce_settings
from convoq.output import MAX_ANSWER_CHARS, OutputShape, spec_from_data

# Fields both kinds of settings share under one name.
_SAME = ("temperature", "max_tokens", "top_p", "seed", "parallel_tool_calls")
# tool_choice values a run takes as they are; the others force a tool call on every step,
# which Pydantic AI refuses for a whole run (the agent could never give its answer).
_CHOICES = ("auto", "none")


@dataclass(frozen=True)
class Asked:
    """A turn's options as arguments of ``Agent.run`` (None: the agent's own)."""

    model_settings: PaiSettings | None = None
    output: OutputCheck | None = None


def asked_of(profile: str, agent_settings: object, options: dict[str, Any]) -> Asked:
    """The run arguments for a turn's ``options`` (JSON from its record, checked again).

    Raises:
        InvalidModelSettingsError: a setting is invalid, or one Pydantic AI refuses for a
            whole run (named, with the profile); the turn fails with it.
        InvalidOutputTypeError: the output schema is unusable; the turn fails with it.
    """
    settings = coerce_settings(options.get("model_settings"))
    output = options.get("output")
    return Asked(
        model_settings=run_settings(profile, agent_settings, settings),
        output=None if output is None else OutputCheck(spec_from_data(output)),
    )


def run_settings(
    profile: str, agent_settings: object, settings: ModelSettings | None
) -> PaiSettings | None:
    """convoq's settings as Pydantic AI's (``stop`` is its ``stop_sequences``)."""
    if settings is None:
        return None
    mapped: dict[str, Any] = {k: getattr(settings, k) for k in _SAME}
    mapped = {k: v for k, v in mapped.items() if v is not None}
    if settings.stop is not None:
        mapped["stop_sequences"] = list(settings.stop)
    if settings.tool_choice is not None:
        if settings.tool_choice not in _CHOICES:
            raise InvalidModelSettingsError(
                f"model_settings.tool_choice={settings.tool_choice!r} cannot be asked of"
                f" the Pydantic AI profile {profile!r}: Pydantic AI refuses a tool choice"
                " that forces a tool call on every step of a run; submit 'auto' or"
                " 'none', or give the agent its own model_settings (ToolOrOutput)",
                field="tool_choice",
                profile=profile,
            )
        mapped["tool_choice"] = settings.tool_choice
    if settings.extra_body is not None:
        own = agent_settings.get("extra_body") if isinstance(agent_settings, dict) else None
        base = own if isinstance(own, dict) else {}
        mapped["extra_body"] = {**base, **settings.extra_body}
    return cast(PaiSettings, mapped)


@dataclass
class OutputCheck(AbstractCapability[Any]):
    """The turn's output schema as the run's output type, with each answer checked
    against the schema (a misfit raises ModelRetry with the errors, so the model answers
    again within the agent's output retries)."""

    shape: OutputShape
    errors: list[str] = field(default_factory=list)
    answer: str = ""

    def output_type(self) -> Any:
        spec = self.shape.spec
        # StructuredDict writes the name into the schema it is given: a copy.
        return StructuredDict(copy.deepcopy(spec.json_schema), name=spec.name)

    async def after_output_validate(
        self, ctx: RunContext[Any], *, output_context: OutputContext, output: Any
    ) -> Any:
        if not isinstance(output, dict):
            return output  # a parked run's DeferredToolRequests
        answer = json.dumps(output, ensure_ascii=False)
        try:
            self.shape.parse(answer)
        except OutputValidationError as exc:
            self.errors, self.answer = exc.errors, answer
            raise ModelRetry(
                f"Your answer does not fit the required output schema"
                f" {self.shape.spec.name!r}: {'; '.join(exc.errors[:20])}"
            ) from None
        self.errors = []
        return output

    def exhausted(self, profile: str) -> OutputValidationError | None:
        """The error of a run that ended on answers that did not fit (None: it did not)."""
        if not self.errors:
            return None
        return OutputValidationError(
            f"the answer of the Pydantic AI profile {profile!r} does not fit the output"
            f" schema {self.shape.spec.name!r} after its output retries:"
            f" {'; '.join(self.errors[:3])}; raise the agent's output_retries or loosen"
            " the schema",
            answer=self.answer[:MAX_ANSWER_CHARS],
            errors=self.errors,
            output=self.shape.spec.name,
            profile=profile,
        )
