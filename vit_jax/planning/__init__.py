"""The planner's knowledge: memory and step-time footprints of a config, the meshes it plans for
(the config's, checked; the suggestions), and the chips it knows."""
