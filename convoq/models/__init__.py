"""Models: the protocol, the OpenAI Chat Completions client and the offline scripted model."""

from convoq.models.base import Model, ModelRequest, ModelSettings, OutputSpec, ToolSpec
from convoq.models.openai import OpenAIChatModel, openai
from convoq.models.scripted import ScriptedModel

__all__ = [
    "Model",
    "ModelRequest",
    "ModelSettings",
    "OpenAIChatModel",
    "OutputSpec",
    "ScriptedModel",
    "ToolSpec",
    "openai",
]
