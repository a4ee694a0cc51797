"""Models: the protocol, the OpenAI Chat Completions, OpenAI Responses and Anthropic
Messages clients, and the offline scripted model."""

from convoq.models.anthropic import AnthropicModel, anthropic
from convoq.models.base import Model, ModelRequest, ModelSettings, OutputSpec, ToolSpec
from convoq.models.openai import OpenAIChatModel, openai
from convoq.models.responses import OpenAIResponsesModel, responses
from convoq.models.scripted import ScriptedModel

__all__ = [
    "AnthropicModel",
    "Model",
    "ModelRequest",
    "ModelSettings",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "OutputSpec",
    "ScriptedModel",
    "ToolSpec",
    "anthropic",
    "openai",
    "responses",
]
