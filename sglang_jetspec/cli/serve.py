"""`jetspec serve`: its flags. The run is sglang_jetspec/serving/command.py: the reference engine behind HTTP,
driven by a policy file.

    jetspec serve --policy policies/default.yaml [--target smollm2] [--head DIR | --drafter lookup] [--port 30000]
                  [--admin-api-key-env JETSPEC_ADMIN_KEY] [--max-batch-size 8] [--shadow-spool DIR]
                  [--enable-trace [--otlp-traces-endpoint http://HOST:4317]]

Prints the server's URL on stdout once it accepts requests; everything else goes to stderr.
SIGINT/SIGTERM stop it gracefully: new requests get 503, running ones may finish (JetspecServer.stop).
"""

from __future__ import annotations

from ..serving.command import run
from .args import add_drafter_arguments, add_sizing_argument, add_target_arguments, add_tree_arguments

DEFAULT_PORT = 30000  # SGLang's default
DEFAULT_ADMIN_KEY_ENV = "JETSPEC_ADMIN_KEY"  # the controller's default too


def register(sub) -> None:
    p = sub.add_parser(
        "serve", help="serve the reference engine over HTTP (SGLang's /generate subset, /metrics, policy push/readback)"
    )
    add_target_arguments(p)
    add_tree_arguments(p, rounds=None)  # draft rounds come per step from the policy table, like budgets
    add_drafter_arguments(p)
    add_sizing_argument(p)
    p.add_argument("--policy", required=True, metavar="FILE", help="policy YAML file (see policies/README.md)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free port)")
    p.add_argument(
        "--admin-api-key-env",
        default=DEFAULT_ADMIN_KEY_ENV,
        metavar="VAR",
        help=f"environment variable holding the admin key for policy pushes (default {DEFAULT_ADMIN_KEY_ENV}; "
        "unset = pushes refused with 403)",
    )
    p.add_argument("--max-batch-size", type=int, default=8, help="most requests decoding together (default 8)")
    p.add_argument(
        "--shadow-spool",
        metavar="DIR",
        help="spool the policy's shadow.sample_rate of finished requests "
        "here for `jetspec shadow run` (default: no shadow records)",
    )
    # Named as SGLang's flags; everything else (sampler, protocol, headers, service name) is OTEL_* env.
    p.add_argument(
        "--enable-trace",
        action="store_true",
        help="export OpenTelemetry spans (request, step and phases) as the OTEL_* variables say "
        "(OTLP over gRPC to localhost:4317 by default)",
    )
    p.add_argument(
        "--otlp-traces-endpoint",
        metavar="ENDPOINT",
        help="with --enable-trace: OTLP traces endpoint (gRPC: http://HOST:4317 plaintext, https:// TLS; "
        "with OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf the full /v1/traces URL); "
        "default $OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT",
    )
    p.set_defaults(func=run)
