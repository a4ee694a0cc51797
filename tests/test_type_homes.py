"""A type has one home module, named for it; other names for it are that same object."""

from __future__ import annotations

import importlib

import pytest

import convoq
import convoq.agent_response
import convoq.model_settings
import convoq.models
import convoq.models.base


def test_model_settings_live_with_their_checks_and_the_models_name_them() -> None:
    settings = convoq.model_settings.ModelSettings
    assert settings.__module__ == "convoq.model_settings"
    assert convoq.models.ModelSettings is settings
    assert convoq.models.base.ModelSettings is settings
    assert convoq.models.base.ToolChoice is convoq.model_settings.ToolChoice


def test_the_agents_response_is_not_the_responses_api_model() -> None:
    assert convoq.Response is convoq.agent_response.Response
    assert convoq.Response.__module__ == "convoq.agent_response"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("convoq.responses")
