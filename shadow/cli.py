"""`jetspec shadow run`: check spooled requests against a non-speculative reference.

    jetspec shadow run --spool DIR --reference local|URL [--window N] [--out DIR] [--follow]
                       [--policy FILE] [--alpha A] [--metrics-port PORT] [--regenerate URL]

Each window of N records gets `window-NNNN.json` and `.html` in --out, the metrics textfile
`shadow.prom` (read by the controller's --shadow-alarm) and `state.json` (spool progress and the
sequential monitor, so a restart neither re-checks records nor forgets evidence). Exit code 0 when
the last window raised no alarm, 3 when it did (for cron and CI), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from pathlib import Path

from sglang_jetspec.observability.process import add_telemetry_options, serve_metrics, stop_on_signals
from shadow.margins import DEFAULT_TIE_MARGIN

log = logging.getLogger("jetspec.shadow")

EXIT_ALARM = 3


def register(sub) -> None:
    shadow = sub.add_parser("shadow", help="shadow verification: re-check spooled requests without speculation")
    cmds = shadow.add_subparsers(dest="shadow_cmd", required=True)
    p = cmds.add_parser("run", help="check a spool against a non-speculative reference; write reports and metrics")
    p.add_argument("--spool", required=True, metavar="DIR", help="spool directory the servers write (--shadow-spool)")
    p.add_argument(
        "--reference",
        required=True,
        metavar="local|URL",
        help="'local' = the reference engine's target (see --target), or an SGLang server URL "
        "running WITHOUT speculation",
    )
    p.add_argument("--target", default="smollm2", help="with --reference local: 'smollm2' or a checkpoint directory")
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="the served model's tokenizer, to rebuild constrained records' "
        "grammars (default: the --target checkpoint; loaded only when such a record arrives)",
    )
    p.add_argument("--vocab-size", type=int, help="with a URL: the model's vocabulary size (required)")
    p.add_argument(
        "--top-logprobs",
        type=int,
        help="with a URL: logprobs per position for sampled requests "
        "(default: the whole vocabulary; fewer is exact only for requests with top_k <= N)",
    )
    p.add_argument("--window", type=int, default=64, metavar="N", help="records per window (default 64)")
    p.add_argument("--out", default="shadow-reports", metavar="DIR", help="report directory (default shadow-reports)")
    p.add_argument("--policy", metavar="FILE", help="policy YAML: alpha from shadow.alpha")
    p.add_argument("--alpha", type=float, help="false-alarm rate (default: the policy's shadow.alpha, else 0.01)")
    p.add_argument(
        "--tie-margin",
        type=float,
        default=DEFAULT_TIE_MARGIN,
        help=f"greedy mismatches within this logprob margin (nats) are ties (default {DEFAULT_TIE_MARGIN})",
    )
    p.add_argument("--follow", action="store_true", help="keep polling the spool (continuous monitoring)")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between polls with --follow")
    p.add_argument(
        "--regenerate",
        metavar="URL",
        help="also regenerate greedy requests on this non-speculative endpoint and diff the outputs",
    )
    add_telemetry_options(p, "checker", "jetspec.shadow.check")
    p.add_argument("--seed", type=int, default=0, help="seed of the PIT randomisation")
    p.set_defaults(func=run)


def _alpha(args) -> float:
    if args.alpha is not None:
        return args.alpha
    if args.policy:
        from policies.loader import load_policy

        return load_policy(args.policy).shadow.alpha
    return 0.01


def _reference(args):
    from shadow.target_logits import HttpReference, LocalReference

    if args.reference == "local":
        import torch

        from sglang_jetspec.reference.loading import resolve_target_dir
        from sglang_jetspec.reference.target import TargetModel

        return LocalReference(TargetModel(resolve_target_dir(args.target), dtype=torch.float32))
    if not args.reference.startswith(("http://", "https://")):
        raise ValueError(f"--reference {args.reference!r}: use 'local' or an http(s):// URL")
    if not args.vocab_size:
        raise ValueError("--reference URL needs --vocab-size (the served model's vocabulary size)")
    return HttpReference(args.reference, args.vocab_size, args.top_logprobs)


def run(args: argparse.Namespace) -> int:
    from policies.problems import PolicyError
    from sglang_jetspec.reference.loading import resolve_target_dir
    from sglang_jetspec.spool.record import ShadowRecord
    from shadow.checker import ShadowChecker
    from shadow.constraints import ConstraintMasks
    from shadow.metrics import ShadowMetrics
    from shadow.regenerate import Regenerator
    from shadow.report import write_report
    from shadow.spool import SpoolReader
    from shadow.stats import BettingMonitor
    from shadow.tracing import make_tracer

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.window < 1:
        print(f"jetspec shadow run: --window {args.window}: use 1 or more", file=sys.stderr)
        return 2
    if not Path(args.spool).is_dir():
        print(
            f"jetspec shadow run: --spool {args.spool}: no such directory -- start the server with --shadow-spool",
            file=sys.stderr,
        )
        return 2
    try:
        alpha = _alpha(args)
        reference = _reference(args)
    except PolicyError as exc:
        exc.report()
        return 2
    except ValueError as exc:
        print(f"jetspec shadow run: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state_path = out / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else None
    reader = SpoolReader.from_json(args.spool, state["reader"]) if state else SpoolReader(Path(args.spool))
    monitor = BettingMonitor.from_json(state["monitor"]) if state else BettingMonitor(alpha)
    next_window = state["next_window"] if state else 1
    metrics = ShadowMetrics()
    serve_metrics(args, metrics.registry)
    tokenizer = getattr(getattr(reference, "target", None), "tokenizer", None)
    checker = ShadowChecker(
        reference,
        alpha,
        metrics,
        make_tracer(args.otlp_endpoint, args.trace_console),
        monitor,
        args.tie_margin,
        args.seed,
        Regenerator(args.regenerate, tokenizer) if args.regenerate else None,
        ConstraintMasks(lambda: args.tokenizer or resolve_target_dir(args.target)),
    )
    stop = stop_on_signals() if args.follow else threading.Event()
    pending = [ShadowRecord.model_validate(r) for r in state["pending"]] if state else []
    last_alarm = False
    reported_skips = (0, 0)
    while True:
        final = not args.follow or stop.is_set()
        pending.extend(reader.poll(final=final))
        while len(pending) >= args.window or (final and pending):
            window, pending = pending[: args.window], pending[args.window :]
            report = checker.check_window(next_window, window)
            json_path, _ = write_report(report, out)
            last_alarm = report.alarm
            print(
                f"window {next_window}: {len(window)} requests, alarm={report.alarm} "
                f"{','.join(report.alarm_reasons)} -> {json_path}",
                flush=True,
            )
            next_window += 1
        # The reader has moved past the records still pending (a partial window): they are saved too.
        state_path.write_text(
            json.dumps(
                {
                    "reader": reader.to_json(),
                    "monitor": monitor.to_json(),
                    "next_window": next_window,
                    "pending": [r.model_dump() for r in pending],
                }
            )
        )
        skipped = (reader.torn_lines, len(reader.bad_lines))
        if skipped != reported_skips:
            log.warning("spool: %d torn lines skipped, %d unreadable: %s", *skipped, "; ".join(reader.bad_lines[-3:]))
            reported_skips = skipped
        metrics.write_textfile(out / "shadow.prom")
        if final:
            return EXIT_ALARM if last_alarm else 0
        stop.wait(args.interval)
