"""The public surface is the contract: pinned here so a rename is a visible decision."""

from __future__ import annotations

import types
from collections.abc import Iterable

import pytest

import convoq
import convoq.client
import convoq.errors
import convoq.memory
import convoq.models
import convoq.queue
import convoq.worker


def public_names(module: types.ModuleType, lazy: Iterable[str] = ()) -> set[str]:
    """Names a user can reach on ``module`` that are not private and not submodules (the
    package's own modules are reached by path, not through ``__all__``)."""
    names = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name not in {"annotations", "TYPE_CHECKING", "Any"}
    }
    return names | set(lazy)


def isort_order(name: str) -> tuple[int, str]:
    """CONSTANTS, then Classes, then functions: the order ruff keeps ``__all__`` in."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


@pytest.mark.parametrize(
    "module",
    [convoq, convoq.memory, convoq.models, convoq.client, convoq.queue, convoq.worker],
    ids=lambda m: m.__name__,
)
def test_all_is_sorted_and_exactly_the_public_names(module: types.ModuleType) -> None:
    # As httpx pins its surface: anything public and not listed (or listed and missing)
    # fails here, so adding to the API is always a visible decision.
    exported = module.__all__
    assert exported == sorted(exported, key=isort_order)
    lazy = getattr(module, "_LAZY", {})
    if module is convoq.worker:
        lazy = {"ConvoqCelery": None, "create_app": None}
    if module is convoq.memory:
        lazy = {"RedisConversationMemory": None}
    assert set(exported) == public_names(module, lazy) - {"__version__"}
    for name in exported:
        assert getattr(module, name) is not None, name


def test_contract_names() -> None:
    expected = {
        "Agent", "Message", "MessageRole", "TextPart", "ImagePart", "FilePart", "ToolCall",
        "GenerationRequest", "Response", "tool", "load_image", "load_pdf", "Client",
        "AsyncClient", "TurnHandle", "Usage", "set_blocking_threads",
    }  # fmt: skip
    assert expected <= set(convoq.__all__)
    assert {"ConversationMemory", "InMemoryConversationMemory", "FileConversationMemory",
            "RedisConversationMemory"} <= set(convoq.memory.__all__)  # fmt: skip
    assert {"ScriptedModel", "OpenAIChatModel", "OpenAIResponsesModel", "AnthropicModel",
            "openai", "responses", "anthropic"} <= set(convoq.models.__all__)  # fmt: skip


def test_every_error_is_a_convoq_error_and_documented_in_the_tree() -> None:
    doc = convoq.errors.__doc__ or ""
    for name in dir(convoq.errors):
        obj = getattr(convoq.errors, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, convoq.errors.ConvoqError), name
            assert name in doc, f"{name} missing from the tree in the errors docstring"
            assert obj.__doc__, name


def test_errors_travel_as_data() -> None:
    err = convoq.errors.MaxStepsExceededError("too many", max_steps=3)
    back = convoq.errors.error_from_data(err.to_data())
    assert type(back) is convoq.errors.MaxStepsExceededError
    assert back.message == "too many" and back.details == {"max_steps": 3}
    unknown = convoq.errors.error_from_data({"type": "ValueError", "message": "bad"})
    assert isinstance(unknown, convoq.errors.TurnFailedError)
    assert unknown.remote_type == "ValueError"


def test_errors_with_extra_fields_travel_as_data() -> None:
    err = convoq.errors.CorruptDataError("bad file", path="/x")
    back = convoq.errors.error_from_data(err.to_data())
    assert type(back) is convoq.errors.CorruptDataError
    assert back.response is None and back.details == {"path": "/x"}
    # A stored "message" detail must not clash with the message argument.
    odd = convoq.errors.error_from_data(
        {"type": "ToolError", "message": "m", "details": {"message": "d"}}
    )
    assert type(odd) is convoq.errors.ToolError and odd.details == {"message": "d"}
