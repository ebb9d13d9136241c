"""`policy check FILE [--head DIR]` and `policy show FILE`.

`add_subcommands(subparsers)` plugs them into another program's argparse as `policy ...`; each
parsed namespace carries `func(args) -> exit code`. `python -m policies check FILE` uses `main`.
"""

from __future__ import annotations

import argparse
import sys

from policies.head import read_head_capacity
from policies.loader import load_policy
from policies.problems import PolicyError
from policies.schema import Policy


def _check(args: argparse.Namespace) -> int:
    try:
        head = read_head_capacity(args.head) if args.head else None
        load_policy(args.file, head)
    except PolicyError as exc:
        exc.report()
        return 1
    except ValueError as exc:  # unreadable head config
        print(exc, file=sys.stderr)
        return 1
    print(f"{args.file}: ok")
    return 0


def render_policy(policy: Policy) -> str:
    rows = [("cohort", "batch sizes", "budgets (* = default, 0 = off)")]
    for c in policy.cohorts:
        budgets = " ".join(f"{b}*" if b == c.default else str(b) for b in c.budgets)
        rows.append((c.name, f"{c.min_batch}..{c.max_batch}", budgets))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}" for r in rows]
    for section in ("gate", "controller", "shadow", "head"):
        values = getattr(policy, section).model_dump()
        lines.append(f"{section}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
    return "\n".join(lines)


def _show(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.file)
    except PolicyError as exc:
        exc.report()
        return 1
    print(render_policy(policy))
    return 0


def _add_check_and_show(subparsers: argparse._SubParsersAction) -> None:
    check = subparsers.add_parser("check", help="validate a policy file; exit 1 listing every problem")
    check.add_argument("file", help="policy YAML file")
    check.add_argument(
        "--head", metavar="DIR", help="draft head checkpoint directory: also reject budgets its block_size cannot use"
    )
    check.set_defaults(func=_check)
    show = subparsers.add_parser("show", help="print a policy file's cohort/budget table and settings")
    show.add_argument("file", help="policy YAML file")
    show.set_defaults(func=_show)


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Add `policy check|show` to a parent command's subparsers."""
    policy = subparsers.add_parser("policy", help="check or show a speculation policy file")
    _add_check_and_show(policy.add_subparsers(dest="policy_command", required=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m policies", description=__doc__.splitlines()[0])
    _add_check_and_show(parser.add_subparsers(dest="policy_command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
