"""Bearer API keys with scopes, optionally limited to conversation ids with a prefix.

Keys come from ``CONVOQ_GATEWAY_API_KEYS`` (:class:`convoq.settings.GatewayKey`). Scopes:

- ``submit``: queue turns, cancel them;
- ``read``: turn status, results, events and history;
- ``approve``: the approvals inbox, approve/deny tool calls, discard parked turns;
- ``admin``: everything, including deleting conversations;
- ``metrics``: ``/metrics`` only (a key for Prometheus that reaches no conversation).

A request without a known key gets 401, one whose path is not UTF-8 once
percent-decoded 422, one whose key lacks the scope (or whose conversation is outside the
key's prefix) 403; all before anything is read or written: a route declares its scope
with an :class:`Access` dependency, which :class:`~convoq.gateway.bodies.GatewayRoute` runs
before the body is read. Keys are compared in constant time over their SHA-256 digests.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import unquote_to_bytes

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from convoq.gateway.problems import GatewayError
from convoq.settings import GatewayKey, GatewayScope


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key's name, scopes and conversation prefix; ``may_set_by``: it
    may name someone else as the decider of an approval."""

    name: str
    scopes: frozenset[str]
    conversation_prefix: str
    may_set_by: bool = False

    def may(self, scope: GatewayScope) -> bool:
        return scope in self.scopes or "admin" in self.scopes

    def owns(self, conversation_id: str) -> bool:
        return conversation_id.startswith(self.conversation_prefix)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class KeyRing:
    """The configured keys, by digest."""

    def __init__(self, keys: Iterable[GatewayKey]) -> None:
        self._keys: list[tuple[bytes, Principal]] = []
        for index, key in enumerate(keys):
            principal = Principal(
                key.name or f"key{index}",
                frozenset(key.scopes),
                key.conversation_prefix,
                key.may_set_by,
            )
            self._keys.append((_digest(key.key.get_secret_value()), principal))

    def __len__(self) -> int:
        return len(self._keys)

    def authenticate(self, header: str | None) -> Principal:
        """The principal of an ``Authorization: Bearer <key>`` header (401 otherwise)."""
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise GatewayError(401, "Unauthorized", "send Authorization: Bearer <api key>")
        digest = _digest(token.strip())
        found = None
        for known, principal in self._keys:  # every key compared: no early exit to time
            if hmac.compare_digest(known, digest):
                found = principal
        if found is None:
            raise GatewayError(401, "Unauthorized", "unknown API key")
        return found


def check_path_encoding(request: Request) -> None:
    """422 for a path whose percent-encoded bytes are not UTF-8: the server would decode
    each bad byte to U+FFFD, and every such id would name one and the same conversation."""
    raw = request.scope.get("raw_path") or b""
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise GatewayError(
            422,
            "InvalidPathEncoding",
            "a path segment is not UTF-8 once percent-decoded: percent-encode the UTF-8"
            " bytes of the id (e.g. %C3%A9 for é)",
        ) from None


# The document's bearer scheme, declared by every Access dependency. The key itself is read
# by the KeyRing (auto_error off), whose 401 is the gateway's problem+json.
BEARER = HTTPBearer(scheme_name="bearer", auto_error=False)


class Access:
    """A route's dependency on a key with ``scope``: the caller's principal if the key is
    known, holds the scope and (for a route with ``{cid}``) reaches the conversation;
    else 401, 422 (a path that is not UTF-8) or 403. ``scope`` None: any known key (a
    route that tells a key what it may do)."""

    def __init__(self, scope: GatewayScope | None) -> None:
        self.scope = scope

    async def __call__(
        self,
        request: Request,
        _: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
    ) -> Principal:
        return self.check(request)

    def check(self, request: Request) -> Principal:
        ring: KeyRing = request.app.state.keys
        principal = ring.authenticate(request.headers.get("authorization"))
        check_path_encoding(request)
        if self.scope is not None and not principal.may(self.scope):
            raise GatewayError(
                403, "Forbidden", f"this API key lacks the {self.scope!r} scope", scope=self.scope
            )
        cid = request.path_params.get("cid")
        if isinstance(cid, str) and not principal.owns(cid):
            raise GatewayError(403, "Forbidden", "this API key may not reach that conversation id")
        return principal
