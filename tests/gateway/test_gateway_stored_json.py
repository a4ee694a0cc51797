"""The gateway's messages route sends the stored JSON through (no message decoded but
those with attachments and those a page boundary cuts): every page, window and offset
answers exactly what the typed history says, attachments as base64; ``convoq export``
writes the typed document byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from convoq.memory.redis import RedisConversationMemory
from convoq.memory.transfer import export_conversation
from convoq.messages import ImagePart, Message, TextPart, ToolCall, messages_to_json
from tests.support.gateway import GatewayProcess, module_gateway
from tests.support.workers import WorkerPool, module_pool

pytestmark = pytest.mark.slow

pool = module_pool(1)
gateway = module_gateway()
CID = "forwarded"


def turns() -> list[list[Message]]:
    call = ToolCall(id="c1", name="look", arguments={"q": "x"})
    picture = ImagePart(data=bytes(range(256)), mime_type="image/png")
    return [
        [Message.system("be brief"), Message.user("one"), Message.assistant("first")],
        [Message(content=[TextPart(text="see"), picture]), Message.assistant("a picture")],
        [Message.user("two"), Message.assistant("", [call]), Message.tool_result(call, "ok")],
        [Message.user("three"), Message.assistant("last")],
    ]


@pytest.fixture(scope="module")
def memory(pool: WorkerPool) -> RedisConversationMemory:
    made = RedisConversationMemory(pool.env["CONVOQ_REDIS_URL"], prefix=pool.prefix)
    for turn in turns():
        made.append(CID, turn)
    return made


def test_every_page_is_the_typed_history_as_json(
    gateway: GatewayProcess, memory: RedisConversationMemory
) -> None:
    with gateway.client("admin") as http:
        for last_turns in (None, 1, 2, 3):
            typed = memory.load(CID, last_turns=last_turns)
            for offset in range(len(typed) + 1):
                for limit in (1, 2, 5, 100):
                    params: dict[str, int] = {"offset": offset, "limit": limit}
                    if last_turns is not None:
                        params["last_turns"] = last_turns
                    response = http.get(f"/v1/conversations/{CID}/messages", params=params)
                    assert response.status_code == 200, response.text
                    assert response.headers["content-type"] == "application/json"
                    assert response.json() == {
                        "conversation_id": CID,
                        "messages": json.loads(messages_to_json(typed[offset : offset + limit])),
                        "offset": offset,
                        "total": len(typed),
                    }


def test_convoq_export_writes_the_typed_document(
    pool: WorkerPool, memory: RedisConversationMemory, tmp_path: Path
) -> None:
    out = tmp_path / "export.json"
    done = subprocess.run(
        [sys.executable, "-m", "convoq.cli", "export", CID, "--out", str(out)],
        env=pool.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert out.read_text() == export_conversation(memory, CID).to_json()
