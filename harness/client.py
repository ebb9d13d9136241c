"""A small JSON-over-HTTP client for the servers under test (urllib: what the harness checks is the server,
not a client library), and a reader for their Prometheus /metrics."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _decoded(raw: bytes) -> Any:
    text = raw.decode(errors="replace")
    try:
        return json.loads(text or "{}")
    except ValueError:
        return {"text": text}  # SGLang answers a few endpoints (/start_profile, ...) in plain text


def post(url: str, body: dict, headers: dict | None = None, timeout: float = 600) -> tuple[int, Any]:
    """POST `body` as JSON: the status and the decoded reply, for an error status too (JSON, else
    {"text": ...})."""
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, _decoded(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _decoded(exc.read())


def post_ok(url: str, body: dict, timeout: float = 600) -> Any:
    """The decoded reply of a POST that must succeed; RuntimeError naming the status otherwise."""
    status, reply = post(url, body, timeout=timeout)
    if status != 200:
        raise RuntimeError(f"POST {url}: {status} {str(reply)[:500]}")
    return reply


def get(url: str, timeout: float = 60) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def metrics(url: str, timeout: float = 60) -> dict[str, dict[tuple, float]]:
    """Every sample on the server's /metrics: {sample name: {sorted label items: value}}."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(get(f"{url}/metrics", timeout)):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out
