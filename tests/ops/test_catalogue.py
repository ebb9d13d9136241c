"""ops/METRICS.md is exactly what `python -m ops.catalogue` generates from the code's registries."""

from __future__ import annotations

import subprocess
import sys

from ops_support import OPS, REPO

from ops.catalogue import metric_entries, render


def test_the_committed_catalogue_is_up_to_date():
    assert (OPS / "METRICS.md").read_text() == render(), "run: python -m ops.catalogue --write"


def test_the_check_command_fails_on_a_stale_catalogue(tmp_path, monkeypatch):
    import ops.catalogue as catalogue

    stale = tmp_path / "METRICS.md"
    stale.write_text(render().replace("Verify steps", "Verify stepz"))
    monkeypatch.setattr(catalogue, "CATALOGUE", stale)
    assert catalogue.main(["--check"]) == 1
    stale.write_text(render())
    assert catalogue.main(["--check"]) == 0


def test_the_catalogue_command_runs_as_a_module():
    result = subprocess.run(
        [sys.executable, "-m", "ops.catalogue", "--check"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_the_catalogue_covers_worker_controller_and_shadow_with_their_labels():
    entries = {e.family: e for e in metric_entries()}
    assert entries["jetspec_committed_tokens"].labels == ("cohort", "budget")
    assert entries["jetspec_accept_length"].samples == (
        "jetspec_accept_length_bucket",
        "jetspec_accept_length_sum",
        "jetspec_accept_length_count",
    )
    assert entries["jetspec_controller_push_failures"].labels == ("server", "kind")
    assert entries["jetspec_shadow_p_value"].type == "gauge" and entries["jetspec_shadow_p_value"].labels == ("test",)
    assert entries["jetspec_shadow_spool_dropped"].samples == ("jetspec_shadow_spool_dropped_total",)
