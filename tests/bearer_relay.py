"""Test helper: an HTTP relay on 127.0.0.1 that adds ``Authorization: Bearer <token>``.

The official MCP conformance suite cannot send headers of its own, while the desk and the
gateway refuse every HTTP request without a Bearer token. This relay sits between them:
every request is passed on as it came (method, path, query, headers including ``Host``,
body), with the token added, and the answer is streamed back as it comes (SSE included).

``python -m tests.bearer_relay TARGET_URL TOKEN`` prints ``relay: http://127.0.0.1:PORT``
and serves until stopped; :func:`bearer_relay` does the same inside a test.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx2 as httpx
import uvicorn

_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
        "content-length", "authorization"}


def relay_app(target: str, token: str) -> Any:
    """An ASGI app passing every request on to ``target``'s origin with the token added."""
    parts = urlsplit(target)
    origin = f"{parts.scheme}://{parts.netloc}"
    client = httpx.AsyncClient(timeout=httpx.Timeout(60.0, read=None))

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await client.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
                   if k.decode("latin-1").lower() not in _HOP]
        headers.append(("authorization", f"Bearer {token}"))
        url = origin + scope["path"] + (f"?{scope['query_string'].decode()}"
                                        if scope["query_string"] else "")
        request = client.build_request(scope["method"], url, headers=headers, content=body)
        answer = await client.send(request, stream=True)
        try:
            await send({"type": "http.response.start", "status": answer.status_code,
                        "headers": [(k.encode("latin-1"), v.encode("latin-1"))
                                    for k, v in answer.headers.multi_items()
                                    if k.lower() not in _HOP]})
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (httpx.HTTPError, OSError):
            pass
        finally:
            await answer.aclose()

    return app


@asynccontextmanager
async def bearer_relay(target: str, token: str) -> AsyncIterator[str]:
    """Serve the relay to ``target`` for the block; yields the URL to use instead."""
    config = uvicorn.Config(relay_app(target, token), host="127.0.0.1", port=0,
                            log_config=None, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        while not server.started:
            await anyio.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}{urlsplit(target).path}"
        finally:
            server.should_exit = True


async def _main(target: str, token: str) -> None:
    async with bearer_relay(target, token) as url:
        print(f"relay: {url}", flush=True)
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(_main, sys.argv[1], sys.argv[2])
