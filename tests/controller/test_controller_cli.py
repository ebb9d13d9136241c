"""`python -m controller` end to end: a bounded live loop on loopback, and a simulation with outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.cli import main


@pytest.fixture
def fast_policy(tmp_path: Path, test_policy_yaml: str) -> Path:
    """The test policy with a fast loop, so a few intervals take a fraction of a second."""
    fast = test_policy_yaml.replace(
        "controller: {interval_s: 10, ttl_s: 90, window_s: 300, min_samples: 3}",
        "controller: {interval_s: 0.1, ttl_s: 1, window_s: 5, min_samples: 2}",
    )
    assert fast != test_policy_yaml
    path = tmp_path / "fast.yaml"
    path.write_text(fast)
    return path


@pytest.fixture
def run_loop(control_server, fast_policy):
    """`python -m controller FLAGS` on the control server with the fast policy, a free metrics port and
    quiet logs: its exit code."""

    def run(*flags: str) -> int:
        return main(
            [
                "--policy",
                str(fast_policy),
                "--server",
                control_server.url,
                "--metrics-port",
                "0",
                "--log-level",
                "WARNING",
                *flags,
            ]
        )

    return run


def test_dry_run_logs_decisions_and_never_pushes(control_server, run_loop, capsys):
    code = run_loop("--dry-run", "--max-intervals", "3")
    assert code == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["cohort"] for r in records} == {"bs1", "bs2-8"}
    assert all(r["event"] == "jetspec_decision" for r in records)
    assert len(records) == 2 * 2  # the first interval only sets the counter baseline
    assert control_server.posts() == []


@pytest.mark.parametrize("default_api_key", [None, "unused-api-key"])
def test_live_loop_pushes_with_the_key_from_the_environment(
    control_server, run_loop, admin_key, monkeypatch, default_api_key, caplog
):
    # A server without an API key (the reference server) works whether $JETSPEC_API_KEY is set or not.
    monkeypatch.setenv("MY_ADMIN_KEY", admin_key)
    if default_api_key is None:
        monkeypatch.delenv("JETSPEC_API_KEY", raising=False)
    else:
        monkeypatch.setenv("JETSPEC_API_KEY", default_api_key)
    code = run_loop("--admin-key-env", "MY_ADMIN_KEY", "--max-intervals", "2")
    assert code == 0
    assert control_server.posts()
    assert control_server.active.state(control_server.now[0]).source == "pushed"
    assert {r.headers.get("Authorization") for r in control_server.readbacks()} == {
        f"Bearer {default_api_key}" if default_api_key else None
    }
    assert "failed" not in caplog.text


def test_live_loop_reads_back_with_the_api_key_from_the_environment(
    control_server, run_loop, admin_key, api_key, monkeypatch, caplog
):
    control_server.api_key = api_key  # SGLang with --api-key and --admin-api-key
    monkeypatch.setenv("MY_ADMIN_KEY", admin_key)
    monkeypatch.setenv("MY_API_KEY", api_key)
    code = run_loop("--admin-key-env", "MY_ADMIN_KEY", "--api-key-env", "MY_API_KEY", "--max-intervals", "2")
    assert code == 0
    assert {r.headers["Authorization"] for r in control_server.posts()} == {f"Bearer {admin_key}"}
    readbacks = control_server.readbacks()
    assert len(readbacks) == 1 + len(control_server.posts())  # resume, then one per push
    assert {r.headers["Authorization"] for r in readbacks} == {f"Bearer {api_key}"}
    assert control_server.active.state(control_server.now[0]).source == "pushed"
    assert "failed" not in caplog.text and "cannot read" not in caplog.text


def test_without_the_api_key_the_readback_failure_names_the_flag(
    control_server, run_loop, admin_key, api_key, monkeypatch, caplog
):
    control_server.api_key = api_key
    monkeypatch.setenv("JETSPEC_ADMIN_KEY", admin_key)
    monkeypatch.delenv("JETSPEC_API_KEY", raising=False)
    code = run_loop("--max-intervals", "2")
    assert code == 0
    assert f"resume: cannot read {control_server.url}: GET {control_server.url}/server_info answered 401" in caplog.text
    assert (
        f"push to {control_server.url} failed (rejected): GET {control_server.url}/server_info answered 401"
        in caplog.text
    )
    assert "missing or wrong API key for the readback" in caplog.text and "--api-key-env" in caplog.text
    assert "missing or wrong admin key" not in caplog.text


def test_an_api_key_variable_named_but_unset_is_a_usage_error(control_server, run_loop, admin_key, monkeypatch, capsys):
    monkeypatch.setenv("JETSPEC_ADMIN_KEY", admin_key)
    monkeypatch.delenv("MY_API_KEY", raising=False)
    with pytest.raises(SystemExit) as exited:
        run_loop("--api-key-env", "MY_API_KEY")
    assert exited.value.code == 2
    assert "--api-key-env MY_API_KEY: $MY_API_KEY is not set" in capsys.readouterr().err
    assert control_server.requests == []


def test_missing_admin_key_is_a_usage_error(run_loop, monkeypatch, capsys):
    monkeypatch.delenv("JETSPEC_ADMIN_KEY", raising=False)
    with pytest.raises(SystemExit) as exited:
        run_loop()
    assert exited.value.code == 2
    assert "$JETSPEC_ADMIN_KEY is not set" in capsys.readouterr().err


def test_invalid_policy_exits_2_with_file_line(tmp_path, test_policy_yaml, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(test_policy_yaml.replace("default: 16", "default: 17"))
    assert main(["--policy", str(bad), "--server", "http://127.0.0.1:9", "--dry-run", "--metrics-port", "0"]) == 2
    assert f"{bad}:2: cohorts[0] 'bs1' default 17 is not one of its budgets" in capsys.readouterr().err


def test_simulate_writes_json_and_plot(tmp_path, capsys):
    out_json, out_png = tmp_path / "run.json", tmp_path / "run.png"
    assert main(["--simulate", "speculation-hurts", "--json", str(out_json), "--plot", str(out_png)]) == 0
    run = json.loads(out_json.read_text())
    assert run["scenario"] == "speculation-hurts" and run["score"]["passed"] is True
    intervals = run["intervals"]
    assert len(intervals) == 720 and intervals[0]["t"] == 0.0
    first, last = intervals[0]["cohorts"]["bs7-12"], intervals[-1]["cohorts"]["bs7-12"]
    assert first["budget"] == 8 and last["budget"] == 0
    assert set(first) == {"budget", "probe_budget", "source", "request_seconds", "goodput", "gain", "best_gain"}
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out_png.stat().st_size > 20_000
    assert "PASS  speculation-hurts: loss vs plain decoding <= 2%" in capsys.readouterr().out
