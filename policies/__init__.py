"""Speculation policies: the YAML schema and loader, the pushed budget table, and its runtime.

One module set shared by the worker, the reference engine and the controller, so a policy or a
pushed table means the same thing (and fails the same way) everywhere.
"""

from policies.head import HeadCapacity, read_head_capacity
from policies.loader import load_policy, parse_policy_text
from policies.problems import PolicyError, Problem
from policies.runtime import ActivePolicy
from policies.schema import DEFAULT_MAX_BUDGET, CohortPolicy, Policy
from policies.table import CohortBudget, PolicyState, PolicyTable, Probe, StepPlan, default_table, validate_table

__all__ = [
    "DEFAULT_MAX_BUDGET",
    "ActivePolicy",
    "CohortBudget",
    "CohortPolicy",
    "HeadCapacity",
    "Policy",
    "PolicyError",
    "PolicyState",
    "PolicyTable",
    "Probe",
    "Problem",
    "StepPlan",
    "default_table",
    "load_policy",
    "parse_policy_text",
    "read_head_capacity",
    "validate_table",
]
