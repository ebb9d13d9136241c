"""HTTP server for the reference engine, speaking the surface a JetSpec SGLang server offers.

    POST /generate             SGLang's request/response subset (serving/generate_api.py)
    GET  /metrics              Prometheus text: the telemetry contract (observability/metrics.py)
    GET  /health               200 while the engine thread runs
    POST /set_internal_state   push a budget table as flat numeric keys (admin key), as to SGLang:
                               policies/control_api.py
    GET  /server_info          SGLang's readback: internal_states[0].jetspec_policy is the table in force

Routing lives in `JetspecServer.handle` (method, path, headers, body) -> Reply, independent of
the socket layer; the standard library's threading HTTP server only moves bytes. One engine thread
(serving/engine_worker.py) owns the engine; handler threads wait on futures.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Tracer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from policies.control_api import handle_server_info, handle_set_internal_state
from policies.controlled_plans import ControlledPlans
from policies.head import HeadCapacity
from policies.runtime import ActivePolicy
from policies.schema import Policy

from ..observability.metrics import JetspecMetrics
from ..observability.tracing import WORKER_TRACER, finish_request_span, request_span_attributes
from ..reference.engine import ReferenceEngine
from .engine_worker import EngineWorker, ServerClosing
from .generate_api import BadRequest, generate_response, parse_generate_request

log = logging.getLogger(__name__)

JSON = "application/json"


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = JSON


def _json(status: int, payload: Any) -> Reply:
    return Reply(status, json.dumps(payload).encode())


def _error(status: int, message: str) -> Reply:
    return _json(status, {"error": {"message": message}})  # SGLang's /generate error shape


def check_budgets_runnable(policy: Policy, has_drafter: bool) -> None:
    """Budgets above 1 draft a tree: refuse a policy that lists them when no head is loaded."""
    if has_drafter:
        return
    for i, cohort in enumerate(policy.cohorts):
        for budget in cohort.budgets:
            if budget > 1:
                raise ValueError(
                    f"policy cohorts[{i}] '{cohort.name}' lists budget {budget}, which needs a draft "
                    "head, but the server has none -- load a head or list only budgets 0 and 1"
                )


def _shadow_tee(spool: str | Path | None, policy: Policy, registry: CollectorRegistry, model: str, head: str):
    """The tee of shadow verification (shadow/README.md): policy shadow.sample_rate of finished requests."""
    if spool is None:
        return None
    from ..spool.tee import ShadowTee
    from ..spool.writer import SpoolWriter
    from .shadow_hook import EngineTee

    return EngineTee(ShadowTee(SpoolWriter(spool), policy.shadow.sample_rate, registry).start(), model, head)


class JetspecServer:
    def __init__(
        self,
        engine: ReferenceEngine,
        policy: Policy,
        admin_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.time,
        tracer: Tracer | None = None,
        shadow_spool: str | Path | None = None,
        head: str = "",
        head_capacity: HeadCapacity | None = None,
    ):
        check_budgets_runnable(policy, engine.drafter is not None)
        self.registry = CollectorRegistry()
        self.metrics = JetspecMetrics(self.registry)
        self.active = ActivePolicy(policy, head_capacity)  # pushed tables stay within the head's tree width
        self._engine = engine
        self._admin_key = admin_key
        self._clock = clock
        # Default: the process's global tracer provider (a no-op one unless `--enable-trace` set it).
        self._tracer = tracer if tracer is not None else trace.get_tracer(WORKER_TRACER)
        self._model = engine.target.path.name  # gen_ai.request.model
        self._shadow = _shadow_tee(shadow_spool, policy, self.registry, str(engine.target.path), head)
        # the table's plans, run native where the server's own same-allocation control measures no gain
        self.plans = ControlledPlans(self.active, self.metrics.show_same_allocation)
        self._worker = EngineWorker(engine, self.plans, self.metrics, clock, tracer=self._tracer, shadow=self._shadow)
        self._request_ids = itertools.count()
        self._routes: dict[tuple[str, str], Callable[[Mapping[str, str], bytes], Reply]] = {
            ("POST", "/generate"): self._generate,
            ("GET", "/metrics"): self._metrics_page,
            ("GET", "/health"): self._health,
            ("POST", "/set_internal_state"): self._set_internal_state,
            ("GET", "/server_info"): self._server_info,
        }
        self._httpd = _HTTPServer((host, port), self)
        self._serving = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="jetspec-http", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> JetspecServer:
        self.metrics.show_policy(self.active.state(self._clock()))
        self._worker.start()
        self._serving.start()
        return self

    def stop(self, drain_timeout_s: float = 30.0) -> None:
        """Graceful: refuse new generations (503), let running ones finish for up to
        `drain_timeout_s` (then fail them with 503), then close the listening socket."""
        self._worker.stop(drain_timeout_s)
        if self._shadow is not None:
            self._shadow.tee.close()
        self._httpd.shutdown()
        self._httpd.server_close()  # waits for handler threads still writing their replies

    def __enter__(self) -> JetspecServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> Reply:
        path = urlsplit(target).path
        route = self._routes.get((method, path))
        if route is not None:
            return route(headers, body)
        if any(p == path for _, p in self._routes):
            return _error(405, f"{method} {path}: method not allowed")
        return _error(404, f"{path}: no such endpoint -- see sglang_jetspec/server.py for the endpoints")

    def _generate(self, headers: Mapping[str, str], body: bytes) -> Reply:
        # The request span continues the caller's trace when it sent a W3C traceparent header.
        with self._tracer.start_as_current_span(
            f"generate {self._model}", context=propagate.extract(headers), kind=SpanKind.SERVER, record_exception=False
        ) as span:
            reply, error_type = self._generate_traced(span, body)
            if error_type is not None:
                span.set_attribute("error.type", error_type)
                span.set_status(trace.StatusCode.ERROR)
            return reply

    def _generate_traced(self, span: trace.Span, body: bytes) -> tuple[Reply, str | None]:
        """The reply, and the error type for the span (None on success)."""
        target = self._engine.target
        try:
            request = parse_generate_request(
                body,
                target.tokenizer,
                target.info.vocab_size,
                target.info.max_position_embeddings,
                str(next(self._request_ids)),
            )
            span.set_attributes(request_span_attributes(self._model, request.params, len(request.prompt_ids)))
            output = self._worker.submit(request).result()
        except BadRequest as exc:
            return _error(400, str(exc)), "400"
        except ServerClosing as exc:
            return _error(503, str(exc)), "503"
        except Exception as exc:  # the engine failed this request; the server keeps serving
            return _error(500, f"generation failed: {type(exc).__name__}: {exc}"), type(exc).__qualname__
        finish_request_span(span, self._model, output)
        return _json(200, generate_response(output, request.params, target.tokenizer)), None

    def _metrics_page(self, headers: Mapping[str, str], body: bytes) -> Reply:
        # Read the policy state now, so an expired push shows as the YAML default even while idle.
        self.metrics.show_policy(self.active.state(self._clock()))
        return Reply(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)

    def _health(self, headers: Mapping[str, str], body: bytes) -> Reply:
        if self._worker.alive:
            return _json(200, {"status": "ok"})
        return _json(503, {"status": "engine thread stopped"})

    def _set_internal_state(self, headers: Mapping[str, str], body: bytes) -> Reply:
        now = self._clock()
        status, payload = handle_set_internal_state(
            self.active, body, headers.get("Authorization"), self._admin_key, now
        )
        if status == 200:
            self.metrics.show_policy(self.active.state(now))
        return _json(status, payload)

    def _server_info(self, headers: Mapping[str, str], body: bytes) -> Reply:
        return _json(200, handle_server_info(self.active, self._clock(), self.plans.state()))


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    timeout = 60  # a client that stalls mid-request frees its thread

    def _serve(self, method: str) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            reply = _error(400, "Content-Length: not an integer")
        else:
            body = self.rfile.read(length) if length > 0 else b""
            reply = self.server.app.handle(method, self.path, self.headers, body)
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        self.wfile.write(reply.body)

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's signature)
        log.debug("%s %s", self.address_string(), format % args)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = False  # server_close() then waits for handlers to finish writing their replies

    def __init__(self, address: tuple[str, int], app: JetspecServer):
        self.app = app
        super().__init__(address, _Handler)
