"""The files that say what a directory holds, which the commands read to refuse one another's
directories (a run trained into an export, an export written over a run): light to import, for the
tools that list directories before they load any model code."""

# A run's workdir: its config and its dataset's facts, written at its start (run_dir.write_run_info).
RUN = ('config.json', 'dataset_info.json')
# What vit_jax.tools.soup writes beside a soup's parameters: a run directory without a train state.
SOUP = 'soup.json'
# What vit_jax.tools.export writes beside model.npz and its config.json: the jax.export artefact.
EXPORT = 'model.jaxexport'
# The file whose lock a run's process 0 holds while it trains (vit_jax/train/workdir_lock.py).
LOCK = '.vit_jax.lock'
