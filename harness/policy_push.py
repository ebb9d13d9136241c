"""Pushes of a JETSPEC server's policy table (`/set_internal_state` with its admin key), as a controller sends them."""

from __future__ import annotations

from harness.client import post


def push_budgets(url: str, admin_key: str, budgets: dict[str, int], ttl_s: float = 3600) -> None:
    """Each named cohort at its budget for `ttl_s` seconds (then the server's YAML again); raises if refused."""
    flat = {"jetspec_policy.ttl_s": ttl_s, **{f"jetspec_policy.{name}.budget": b for name, b in budgets.items()}}
    status, reply = post(f"{url}/set_internal_state", {"server_args": flat}, {"Authorization": f"Bearer {admin_key}"})
    if status != 200 or reply != [True]:
        raise RuntimeError(f"push of {budgets} refused: {status} {reply}")
