"""`python -m controller` (console script `jetspec-controller`): run the control loop or a simulation.

    python -m controller --policy FILE --server URL [--server URL ...] [--prometheus URL]
                         [--admin-key-env VAR] [--api-key-env VAR] [--dry-run] [--metrics-port PORT]
                         [--shadow-alarm URL|FILE]
    python -m controller --simulate SCENARIO [--json OUT.json] [--plot OUT.png]

Decisions are logged as one JSON line each on stdout; everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from controller.http import urllib_transport
from controller.loop import Controller
from controller.observability import Observer, decision_log, make_tracer
from controller.server_client import ServerClient
from controller.shadow_alarm import ShadowAlarmSource
from controller.sim.scenarios import SCENARIOS
from controller.telemetry import PrometheusApiSource, ScrapeSource, TelemetrySource
from policies.loader import load_policy
from policies.problems import PolicyError
from sglang_jetspec.observability.process import add_telemetry_options, serve_metrics, stop_on_signals

DEFAULT_ADMIN_KEY_ENV = "JETSPEC_ADMIN_KEY"
DEFAULT_API_KEY_ENV = "JETSPEC_API_KEY"
DEFAULT_METRICS_PORT = 9109


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jetspec-controller", description=__doc__.splitlines()[0])
    parser.add_argument("--policy", help="policy YAML file (the one the servers run)")
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="URL",
        help="server base URL, e.g. http://10.0.0.5:30000; repeat for each replica",
    )
    parser.add_argument(
        "--prometheus",
        metavar="URL",
        help="read telemetry from this Prometheus server instead of scraping each /metrics",
    )
    parser.add_argument(
        "--admin-key-env",
        default=DEFAULT_ADMIN_KEY_ENV,
        metavar="VAR",
        help=f"environment variable with the servers' admin API key (default {DEFAULT_ADMIN_KEY_ENV}), "
        "sent with pushes (SGLang --admin-api-key)",
    )
    parser.add_argument(
        "--api-key-env",
        default=DEFAULT_API_KEY_ENV,
        metavar="VAR",
        help=f"environment variable with the servers' ordinary API key (default {DEFAULT_API_KEY_ENV}), "
        "sent with readbacks of /server_info; unset or empty for servers without SGLang --api-key",
    )
    parser.add_argument("--dry-run", action="store_true", help="decide and log, never push")
    add_telemetry_options(parser, "controller", "decision", DEFAULT_METRICS_PORT)
    parser.add_argument(
        "--shadow-alarm",
        metavar="URL|FILE",
        help="the shadow checker's /metrics URL or its shadow.prom file: with the policy's "
        "shadow.gate_on_alarm, speculation is gated off everywhere while jetspec_shadow_alarm is 1",
    )
    parser.add_argument("--max-intervals", type=int, help="stop after this many intervals (default: run forever)")
    parser.add_argument("--log-level", default="INFO", help="stderr log level (default INFO)")
    parser.add_argument(
        "--simulate",
        choices=sorted(SCENARIOS),
        metavar="SCENARIO",
        help=f"run a simulated scenario instead: {', '.join(sorted(SCENARIOS))}",
    )
    parser.add_argument("--json", metavar="OUT", help="with --simulate: write per-interval results as JSON")
    parser.add_argument("--plot", metavar="OUT.png", help="with --simulate: plot budget and gain per cohort")
    return parser


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    decision_log.handlers = [handler]  # one JSON line per decision on stdout, also when re-entered
    decision_log.setLevel(logging.INFO)
    decision_log.propagate = False


def _simulate(args: argparse.Namespace) -> int:
    from controller.sim.goals import format_scores, score_run
    from controller.sim.output import plot_run, write_json
    from controller.sim.simulator import run_scenario

    # Thousands of simulated decisions and pushes would flood the terminal: report only the outcome.
    logging.getLogger("controller").setLevel(logging.ERROR)
    decision_log.setLevel(logging.WARNING)
    result = run_scenario(SCENARIOS[args.simulate])
    score = score_run(result)
    if args.json:
        write_json(result, score, args.json)
    if args.plot:
        plot_run(result, args.plot)
    print(format_scores([score]))
    return 0 if score.passed else 1


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if not args.policy or not args.server:
        parser.error("--policy and at least one --server are required (or use --simulate)")
    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        exc.report()
        return 2
    admin_key = os.environ.get(args.admin_key_env)
    if not admin_key and not args.dry_run:
        parser.error(f"${args.admin_key_env} is not set -- export the servers' admin API key or use --dry-run")
    # Optional: servers without --api-key need none. A variable named explicitly must exist, though.
    api_key = os.environ.get(args.api_key_env) or None
    if args.api_key_env != DEFAULT_API_KEY_ENV and args.api_key_env not in os.environ:
        parser.error(
            f"--api-key-env {args.api_key_env}: ${args.api_key_env} is not set -- export the servers' "
            f"API key (SGLang --api-key), or leave --api-key-env out for servers without one"
        )
    interval = policy.controller.interval_s
    telemetry: TelemetrySource = (
        PrometheusApiSource(args.prometheus, interval, urllib_transport)
        if args.prometheus
        else ScrapeSource(args.server, urllib_transport)
    )
    observer = Observer(make_tracer(args.otlp_endpoint, args.trace_console), started_at=time.time())
    serve_metrics(args, observer.registry)
    clients = [ServerClient(url, policy, admin_key, api_key=api_key) for url in args.server]
    shadow_alarm = ShadowAlarmSource(args.shadow_alarm, urllib_transport) if args.shadow_alarm else None
    if shadow_alarm is not None and not policy.shadow.gate_on_alarm:
        logging.getLogger("controller").warning(
            "--shadow-alarm given but the policy's shadow.gate_on_alarm is false: the alarm will not gate speculation"
        )
    controller = Controller(
        policy, telemetry, clients, time.time, observer, dry_run=args.dry_run, shadow_alarm=shadow_alarm
    )
    controller.resume()
    stop = stop_on_signals()
    done = 0
    while not stop.is_set() and (args.max_intervals is None or done < args.max_intervals):
        started = time.monotonic()
        controller.step()
        done += 1
        stop.wait(max(0.0, interval - (time.monotonic() - started)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.log_level)
    if args.simulate:
        return _simulate(args)
    return _run(args, parser)
