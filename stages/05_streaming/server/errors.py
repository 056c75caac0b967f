"""Every error the server sends is OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``.

`APIError` carries one; `install_error_handlers` makes everything else one too: unknown
routes and methods (Starlette's 404 and 405), and unexpected exceptions (500). A route
answers its own unexpected exception (`AnswerErrorsRoute`): left to Starlette's error
middleware, the 500 is sent but uvicorn then drops the connection.
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from common.validate import clip

log = logging.getLogger("stepwise.server")


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self, headers: dict | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def internal_error(e: Exception) -> APIError:
    return APIError(500, f"internal server error ({type(e).__name__}); the request was not completed",
                    kind="server_error")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_, e: APIError):
        return e.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException):
        what = {404: "no such route", 405: "method not allowed"}.get(e.status_code, str(e.detail))
        return APIError(e.status_code, f"{what}: {request.method} {clip(request.url.path, 60)}").response(e.headers)

    @app.exception_handler(Exception)
    async def unexpected(_, e: Exception):  # outside a route: answered, then uvicorn drops the connection
        return internal_error(e).response()


class AnswerErrorsRoute(APIRoute):
    """A route that answers its own unexpected exception with a 500 error object; the connection stays usable."""

    def get_route_handler(self):
        handle = super().get_route_handler()

        async def answer_errors(request: Request) -> Response:
            try:
                return await handle(request)
            except (APIError, HTTPException):
                raise
            except Exception as e:  # noqa: BLE001 - a bug: log it, answer it, keep serving
                log.exception("request failed")
                return internal_error(e).response()
        return answer_errors
