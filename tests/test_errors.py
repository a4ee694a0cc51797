"""Every error class survives the trips errors take between processes: pickling
(multiprocessing, a result backend) and the turn record's ``{type, message, details}``."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from convoq import errors
from convoq.errors import ConvoqError, error_from_data

# Classes whose constructor needs fields beyond a message and details.
FIELDS: dict[str, dict[str, Any]] = {
    "ModelHTTPError": {"status_code": 503, "body": "overloaded"},
    "TurnFailedError": {"remote_type": "ValueError", "where": "tool"},
    "ConversationMemoryError": {"response": {"text": "kept"}, "conversation_id": "c1"},
}


def all_classes() -> list[type[ConvoqError]]:
    found = [
        obj
        for obj in vars(errors).values()
        if isinstance(obj, type) and issubclass(obj, ConvoqError)
    ]
    return sorted(found, key=lambda cls: cls.__name__)


def build(cls: type[ConvoqError]) -> ConvoqError:
    return cls(f"{cls.__name__} happened", **FIELDS.get(cls.__name__, {"where": "here"}))


@pytest.mark.parametrize("cls", all_classes(), ids=lambda c: c.__name__)
def test_pickle_round_trip_keeps_class_message_and_fields(cls: type[ConvoqError]) -> None:
    err = build(cls)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == str(err) and back.message == err.message
    assert back.details == err.details
    assert vars(back) == vars(err)  # status_code, body, response, remote_type ...


@pytest.mark.parametrize("cls", all_classes(), ids=lambda c: c.__name__)
def test_data_round_trip_keeps_the_type_or_says_what_it_was(cls: type[ConvoqError]) -> None:
    err = build(cls)
    back = error_from_data(err.to_data())
    assert back.message == err.message
    if cls.__name__ not in FIELDS:
        assert type(back) is cls
        assert back.details == err.details
    else:
        # Classes whose fields cannot be rebuilt from data arrive as TurnFailedError that
        # names them, with their details kept.
        assert isinstance(back, errors.TurnFailedError)
        assert back.remote_type == cls.__name__
        assert back.details["remote_details"] == err.details


def test_field_errors_pickle_with_their_fields() -> None:
    err = errors.ModelHTTPError("boom", status_code=429, body="slow down")
    back = pickle.loads(pickle.dumps(err))
    assert (back.status_code, back.body) == (429, "slow down")


def test_lease_lost_is_a_protocol_error_in_the_tree() -> None:
    assert issubclass(errors.LeaseLostError, errors.ProtocolError)


def test_the_tree_in_the_module_docstring_draws_every_class() -> None:
    tree = errors.__doc__ or ""
    assert [c.__name__ for c in all_classes() if c.__name__ not in tree.split()] == []


def test_an_unreachable_redis_is_a_convoq_error_that_names_it() -> None:
    err = errors.RedisUnavailableError("Redis does not answer", redis="redis://h:6379/0")
    assert isinstance(err, ConvoqError) and not isinstance(err, errors.ConfigurationError)
    assert error_from_data(err.to_data()).details["redis"] == "redis://h:6379/0"
