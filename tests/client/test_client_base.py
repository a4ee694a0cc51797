"""Pure parts of the client and workers: routing, partitions, signatures, request checks."""

from __future__ import annotations

import json
import time
import zlib

import pytest

from convoq import Message
from convoq.client._base import build_submission
from convoq.errors import (
    AttachmentError,
    ConfigurationError,
    ConvoqError,
    InvalidConversationIdError,
    InvalidMessageError,
    UnknownAgentError,
)
from convoq.limits import Limits
from convoq.messages import FilePart, ImagePart, MessageRole, TextPart
from convoq.queue import routing
from convoq.queue.signing import build_payload, sign, verify_signature
from convoq.worker.webhooks import backoff_s


def test_route_is_crc32_of_the_conversation_id() -> None:
    for cid in ["user-42", "a", "x" * 256, "tenant/7:bob", "user 42", "o'brien ü"]:
        expected = f"convoq.p{zlib.crc32(cid.encode()) % 16}"
        assert routing.route(cid) == expected
    assert routing.route("user-42", prefix="acme", partitions=4) == (
        f"acme.p{zlib.crc32(b'user-42') % 4}"
    )


def test_route_refuses_invalid_conversation_ids() -> None:
    with pytest.raises(InvalidConversationIdError):
        routing.route("no\x00controls")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, list(range(8))),
        ("all", list(range(8))),
        ("0-3", [0, 1, 2, 3]),
        ("1,3,5", [1, 3, 5]),
        ("0-1,6-7,3", [0, 1, 3, 6, 7]),
        (" 2 , 2-3 ", [2, 3]),
    ],
)
def test_parse_partitions(spec: str | None, expected: list[int]) -> None:
    assert routing.parse_partitions(spec, 8) == expected


@pytest.mark.parametrize("spec", ["8", "0-8", "a-b", "3-1", "1,,x", "-1"])
def test_parse_partitions_refuses_bad_specs(spec: str) -> None:
    with pytest.raises(ConfigurationError):
        routing.parse_partitions(spec, 8)


def test_signature_round_trip_and_tampering() -> None:
    body = build_payload(
        conversation_id="c",
        turn_id="t",
        status="succeeded",
        agent="echo",
        text="hi",
        error=None,
        finished_ms=1,
    )
    header = sign("s3cret", body)
    assert verify_signature("s3cret", header, body)
    assert verify_signature("s3cret", header, body.decode())
    assert not verify_signature("other", header, body)
    assert not verify_signature("s3cret", header, body + b" ")
    assert not verify_signature("s3cret", "v1=abc", body)
    assert not verify_signature("s3cret", "garbage", body)


def test_signature_refuses_old_timestamps() -> None:
    old = int(time.time()) - 3600
    header = sign("k", b"{}", timestamp=old)
    assert not verify_signature("k", header, b"{}")
    assert verify_signature("k", header, b"{}", tolerance_s=7200)


def test_signature_accepts_any_of_several_v1_during_rotation() -> None:
    header = sign("new", b"x")
    rotated = header + ",v1=" + sign("old", b"x").split("v1=")[1]
    assert verify_signature("new", rotated, b"x")


def test_payload_is_bounded() -> None:
    body = build_payload(
        conversation_id="c",
        turn_id="t",
        status="failed",
        agent="a",
        text="x" * 1_000_000,
        error={"type": "ModelError", "message": "m" * 10_000, "details": {"big": "y" * 10_000}},
        finished_ms=None,
    )
    assert len(body) < 80_000
    assert b'"text_truncated":true' in body


def test_payload_carries_usage_and_finish_reason() -> None:
    usage = {"requests": 2, "prompt_tokens": 230, "completion_tokens": 30, "total_tokens": 260}
    body = build_payload(conversation_id="c", turn_id="t", status="succeeded", agent="a",
                         text="hi", error=None, finished_ms=1, usage=usage,
                         finish_reason="length")  # fmt: skip
    payload = json.loads(body)
    assert (payload["usage"], payload["finish_reason"]) == (usage, "length")


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_s(n, 1.0) for n in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_s(30, 1.0) == 600.0


def _build(message: object, **kwargs: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {
        "agent": "echo",
        "known_agents": {"echo"},
        "limits": Limits(100, 150),
    }
    args.update(kwargs)
    return build_submission("c1", message, **args)  # type: ignore[arg-type]


def test_build_submission_accepts_text_and_user_messages() -> None:
    sub = _build("hello", keep_last_turns=2, callback_url="https://example.test/hook")
    assert sub.message.text == "hello"
    assert sub.options == {"keep_last_turns": 2, "callback_url": "https://example.test/hook"}
    image = ImagePart(data=b"\x89PNG" + b"0" * 10, mime_type="image/png")
    sub = _build(Message(content=[TextPart(text="look"), image]))
    assert sub.message.attachments == [image]


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ("", InvalidMessageError),
        (Message(role=MessageRole.ASSISTANT, content=[TextPart(text="x")]), InvalidMessageError),
        (Message(content=[]), InvalidMessageError),
        (42, InvalidMessageError),
        (Message(content=[ImagePart(data=b"x" * 101, mime_type="image/png")]), AttachmentError),
        (Message(content=[FilePart(data=b"", mime_type="application/pdf")]), AttachmentError),
        (
            Message(
                content=[
                    FilePart(data=b"x" * 80, mime_type="application/pdf"),
                    FilePart(data=b"x" * 80, mime_type="application/pdf"),
                ]
            ),
            InvalidMessageError,  # over max_turn_bytes: the same error the store raises
        ),
    ],
)
def test_build_submission_refuses_bad_messages(message: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        _build(message)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"agent": "nobody"}, UnknownAgentError),
        ({"agent": ""}, UnknownAgentError),
        ({"keep_last_turns": -1}, ConvoqError),
        ({"callback_url": "ftp://x/y"}, ConvoqError),
        ({"callback_url": "/relative"}, ConvoqError),
        ({"if_busy": "maybe"}, ConvoqError),
        ({"idempotency_key": ""}, ConvoqError),
    ],
)
def test_build_submission_refuses_bad_arguments(
    kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        _build("hi", **kwargs)


def test_build_submission_refuses_bad_conversation_ids() -> None:
    with pytest.raises(InvalidConversationIdError):
        build_submission("bad\rid", "hi", agent="a", known_agents=None, limits=Limits())
