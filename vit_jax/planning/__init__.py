"""The planner's knowledge: memory and step-time footprints of a config, and the chips it knows."""
