"""The controller simulator: fake servers with a cost model, scenarios, goals and reports (bench/controller_sim.py)."""
