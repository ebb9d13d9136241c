"""Write a simulated run as JSON (per-interval budget and gain per cohort) and as a PNG plot."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from controller.sim.goals import ScenarioScore
from controller.sim.simulator import SimResult


def run_to_json(result: SimResult, score: ScenarioScore) -> dict:
    return {
        "scenario": result.scenario.name,
        "description": result.scenario.description,
        "policy_file": result.scenario.policy_file,
        "interval_s": result.policy.controller.interval_s,
        "controller_down": [list(span) for span in result.scenario.controller_down],
        "score": {
            "passed": score.passed,
            "checks": score.checks,
            "loss_vs_off": score.loss_vs_off,
            "cohorts": [dataclasses.asdict(c) for c in score.cohorts],
        },
        "intervals": [
            {"t": t, "cohorts": {name: dataclasses.asdict(rows[k]) for name, rows in result.cohorts.items()}}
            for k, t in enumerate(result.times)
        ],
    }


def write_json(result: SimResult, score: ScenarioScore, path: str | Path) -> None:
    Path(path).write_text(json.dumps(run_to_json(result, score), indent=1))


def plot_run(result: SimResult, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    names = list(result.cohorts)
    fig, axes = plt.subplots(len(names), 2, figsize=(13, 2.6 * len(names)), sharex=True, squeeze=False)
    minutes = [t / 60 for t in result.times]
    for row, name in enumerate(names):
        rows = result.cohorts[name]
        budget_ax, gain_ax = axes[row]
        budget_ax.step(minutes, [r.budget for r in rows], where="post", label="budget in force")
        probes = [(m, r.probe_budget) for m, r in zip(minutes, rows) if r.probe_budget is not None]
        if probes:
            budget_ax.scatter(*zip(*probes), s=4, color="tab:orange", label="probe budget")
        budget_ax.set_yscale("symlog", base=2, linthresh=4)
        budget_ax.set_ylabel(f"{name}\nbudget (nodes)")
        gain_ax.plot(
            minutes,
            [r.gain if r.gain is not None else float("nan") for r in rows],
            lw=0.8,
            label="realized gain vs off",
        )
        gain_ax.plot(
            minutes,
            [r.best_gain if r.best_gain is not None else float("nan") for r in rows],
            lw=1.2,
            ls="--",
            color="black",
            label="best candidate (expected)",
        )
        gain_ax.axhline(1.0, color="grey", lw=0.6)
        gain_ax.set_ylabel("gain")
        for start, end in result.scenario.controller_down:
            for ax in (budget_ax, gain_ax):
                ax.axvspan(start / 60, end / 60, color="red", alpha=0.12, lw=0)
    axes[0][0].legend(loc="upper right", fontsize=7)
    axes[0][1].legend(loc="upper right", fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("minutes (red: controller down)")
    fig.suptitle(f"{result.scenario.name}: {result.scenario.description}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
