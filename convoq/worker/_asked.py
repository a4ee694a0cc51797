"""What a queued turn asks of the model: its profile's settings and output type, with the
turn's own (given at submit, kept in its record as JSON) over them."""

from __future__ import annotations

from typing import Any

from convoq.agent import Agent
from convoq.model_settings import check_tool_choice, coerce_settings, merge_settings
from convoq.models.base import ModelSettings
from convoq.output import OutputShape, shape_for, spec_from_data


def asked_of(
    profile: Agent, options: dict[str, Any]
) -> tuple[ModelSettings | None, OutputShape | None]:
    """The settings (the profile's, the turn's merged over them) and the output shape
    (the turn's, else the profile's) of a turn. The record is checked again: it is data
    from outside this process.

    Raises:
        InvalidModelSettingsError, InvalidOutputTypeError: the turn fails with it.
    """
    settings = merge_settings(
        profile.model_settings, coerce_settings(options.get("model_settings"))
    )
    check_tool_choice(settings, [spec.name for spec in profile.tools.specs()])
    data = options.get("output")
    if data is None:
        return settings, profile.output
    # The profile's own type when the spec is its own: validated by its class.
    return settings, shape_for(spec_from_data(data).spec, profile.output)
