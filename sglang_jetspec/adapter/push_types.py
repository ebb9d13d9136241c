"""Policy pushes take only their documented JSON types, refused with the reasons before SGLang reads them.

SGLang's /set_internal_state parses its body into `SetInternalStateReq` (`Dict[str, int | float]`, lax):
"16" becomes 16 and true becomes 1 before any plugin code runs, so the scheduler-side check
(policies.control_api.table_from_flat_args) never sees the types the caller sent. This ASGI middleware,
added to SGLang's app when a JETSPEC server starts its HTTP side, reads the raw body of a push first:
a `jetspec_policy.*` key of the wrong type gets 400 with every problem (SGLang's ErrorResponse plus
`problems`), and nothing reaches the scheduler. Any other body goes on to SGLang unchanged (a body that
is not JSON, or has no `server_args` object, gets SGLang's own answer).

It is added before SGLang adds its API-key middleware, which therefore runs first: an unauthorised push
is refused for its key, never for its types. Multi-tokenizer mode (--tokenizer-worker-num > 1) builds
its app elsewhere and keeps SGLang's lax parsing (the scheduler-side checks still apply).
"""

from __future__ import annotations

import json

from policies.control_api import SERVER_ARGS_KEY, flat_type_problems

TARGET = "sglang.srt.entrypoints.http_server._setup_and_run_http_server"
PUSH_PATH = "/set_internal_state"


def push_type_problems(body: bytes) -> list[str]:
    """The type problems of a push body's policy keys; [] for a body SGLang answers itself."""
    try:
        payload = json.loads(body or b"null")
    except (ValueError, RecursionError):
        return []
    server_args = payload.get(SERVER_ARGS_KEY) if isinstance(payload, dict) else None
    if not isinstance(server_args, dict):
        return []
    return [str(problem) for problem in flat_type_problems(server_args)]


class StrictPolicyPushes:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] != PUSH_PATH or scope["method"] not in ("POST", "PUT"):
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left: nothing to answer
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        problems = push_type_problems(body)
        if problems:
            from starlette.responses import JSONResponse

            message = f"invalid push, nothing changed: {len(problems)} value(s) of the wrong JSON type"
            error = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
            await JSONResponse({**error, "problems": problems}, status_code=400)(scope, receive, send)
            return
        replayed = False

        async def replay():  # the body read above, then whatever the connection says next
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def before_setup_and_run_http_server(*args, **kwargs):
    """SGLang's HTTP set-up of a JETSPEC server (its first argument: the server args): its app gets the
    strict push check (once)."""
    from sglang_jetspec.adapter.spec_algo import NAME

    server_args = kwargs["server_args"] if "server_args" in kwargs else args[0]
    if str(server_args.speculative_algorithm or "").upper() != NAME:
        return None
    from sglang.srt.entrypoints.http_server import app

    if not any(m.cls is StrictPolicyPushes for m in app.user_middleware):
        app.add_middleware(StrictPolicyPushes)
    return None
