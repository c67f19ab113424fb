"""Catalog of named demo workloads (see catalog.py)."""

from .catalog import DEFAULT_SCENARIO, SCENARIOS, Scenario, scenario_args

__all__ = ["Scenario", "SCENARIOS", "DEFAULT_SCENARIO", "scenario_args"]
