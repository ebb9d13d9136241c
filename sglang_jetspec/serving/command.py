"""`jetspec serve`: load the policy (checked before the model), the target and the drafter, then run the
reference server (serving/server.py) until SIGINT/SIGTERM, which drain running requests.

Prints the server's URL on stdout once it accepts requests; everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

SERVICE_NAME = "jetspec-worker"  # OTel service.name unless OTEL_SERVICE_NAME says otherwise


def _load_policy(args: argparse.Namespace, target_dir: Path):
    """The policy file, its budgets checked against what the chosen drafter can use, and that capacity
    (None when unknown), which bounds pushed tables too."""
    from policies import load_policy, read_head_capacity
    from policies.head import HeadCapacity

    from ..reference.loading import resolve_head_dir

    if args.drafter == "hybrid":
        raise ValueError(
            "--drafter hybrid: a server picks its drafter per cohort from the policy; keep --drafter head "
            "and set `drafter: hybrid` on the cohorts that should merge prompt lookup"
        )
    if args.drafter == "lookup":  # one chain of up to --lookup-depth tokens: a larger budget buys nothing
        capacity = HeadCapacity(
            f"prompt lookup (--lookup-depth {args.lookup_depth})", args.lookup_depth + 1, tree_width=1
        )
    else:
        head_dir = resolve_head_dir(target_dir, args.head)
        capacity = read_head_capacity(head_dir) if head_dir else None
    return load_policy(args.policy, capacity), capacity


def _install_tracing(args: argparse.Namespace):
    """The global tracer provider for --enable-trace (None without it: spans cost nothing)."""
    if not args.enable_trace:
        return None
    from opentelemetry import trace

    from ..observability.tracing import build_provider, exporters_from_env

    provider = build_provider(SERVICE_NAME, exporters_from_env(args.otlp_traces_endpoint))
    trace.set_tracer_provider(provider)
    return provider


def run(args: argparse.Namespace) -> int:
    from policies import PolicyError

    from ..observability.tracing import TracingConfigError
    from ..reference.engine import EngineConfig, ReferenceEngine
    from ..reference.loading import DTYPES, check_drafter_options, load_engine_drafter, resolve_target_dir
    from ..reference.target import TargetModel
    from .server import JetspecServer

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.max_batch_size < 1:
        print(f"jetspec serve: --max-batch-size {args.max_batch_size}: use 1 or more", file=sys.stderr)
        return 2
    target_dir = resolve_target_dir(args.target)
    try:  # before the model loads: a policy or flag mistake should fail in a second, not after the load
        check_drafter_options(args)
        policy, capacity = _load_policy(args, target_dir)
    except PolicyError as exc:
        exc.report()
        return 2
    except ValueError as exc:  # unreadable head config, or drafter flags that do not go together (DrafterOptionError)
        print(f"jetspec serve: {exc}", file=sys.stderr)
        return 2
    try:
        provider = _install_tracing(args)
    except TracingConfigError as exc:
        print(f"jetspec serve: {exc}", file=sys.stderr)
        return 2
    target = TargetModel(target_dir, dtype=DTYPES[args.dtype], device=args.device, attention=args.attention)
    chosen = load_engine_drafter(target, args)
    config = EngineConfig(
        tree_width=chosen.tree_width,
        fanout=args.fanout,
        acceptance=args.acceptance,
        max_batch_size=args.max_batch_size,
        tree_sizing=args.tree_sizing,
    )
    engine = ReferenceEngine(target, chosen.drafter, config)
    admin_key = os.environ.get(args.admin_api_key_env) or None
    if admin_key is None:
        print(
            f"jetspec serve: ${args.admin_api_key_env} is not set: policy pushes will be refused (403)", file=sys.stderr
        )
    try:
        server = JetspecServer(
            engine,
            policy,
            admin_key,
            args.host,
            args.port,
            shadow_spool=args.shadow_spool,
            head=chosen.label,
            head_capacity=capacity,
        )
    except OSError as exc:
        print(
            f"jetspec serve: cannot listen on {args.host}:{args.port} ({exc.strerror}) -- pick another --port",
            file=sys.stderr,
        )
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    print(
        f"jetspec serve: {target.path} with {chosen.label}, policy {args.policy}, batch <= {args.max_batch_size}",
        file=sys.stderr,
    )
    print(server.url, flush=True)
    stop.wait()
    print("jetspec serve: stopping (finishing running requests)", file=sys.stderr)
    server.stop()
    if provider is not None:
        provider.shutdown()  # flush the spans still batched
    return 0
