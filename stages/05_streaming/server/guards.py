"""What a request must pass before its body is parsed: its origin, its API key, its content type, its size.

A web page can make the browser POST to a server on localhost. A `text/plain` POST needs
no CORS preflight, so refusing to answer it (CORS) is not enough: the generation would
already run. Requests that carry an `Origin` header not explicitly allowed are refused,
and bodies must be `application/json`, which a page cannot send cross-origin unasked.
"""
from __future__ import annotations

import hmac

from fastapi import Request
from starlette.requests import ClientDisconnect

from .errors import APIError

DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: a full 8,192-token context as text or token ids is far below it


class Guards:
    def __init__(self, api_key: str | None = None, allowed_origins: tuple[str, ...] = (),
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.api_key = api_key or None
        self.allowed_origins = set(allowed_origins)
        self.max_body_bytes = max_body_bytes

    async def check_origin(self, request: Request) -> None:
        origin = request.headers.get("origin")
        if origin is not None and origin not in self.allowed_origins and "*" not in self.allowed_origins:
            raise APIError(403, "requests from a web page are refused unless the server was started with "
                                "--allowed-origins naming that page's origin", code="origin_not_allowed")

    async def check_api_key(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise APIError(401, "a valid API key is required: send the header 'Authorization: Bearer <key>'",
                           code="invalid_api_key")

    async def read_body(self, request: Request) -> bytes:
        media_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        if media_type != "application/json":
            raise APIError(415, "send the request body as JSON, with the header 'Content-Type: application/json'",
                           code="unsupported_media_type")
        declared = request.headers.get("content-length", "")
        too_large = APIError(413, f"the request body is larger than this server's limit of {self.max_body_bytes:,} "
                                  f"bytes", code="request_too_large")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise too_large
        chunks, size = [], 0
        try:
            async for chunk in request.stream():  # counted as it arrives: a body without Content-Length too
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise too_large
                chunks.append(chunk)
        except ClientDisconnect:
            raise APIError(400, "the client disconnected while sending the body") from None
        return b"".join(chunks)
