"""Training: setup.py validates a config into a Setup before anything is written or compiled,
state.py initialises or restores the train state on the mesh, step.py is the jitted update, and
loop.py feeds batches through it, runs the evaluators and saves checkpoints."""
