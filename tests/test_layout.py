"""The package's layout as the README describes it: no import cycles, tools that load a trained model
without the training loop, no library code outside vit_jax/."""

import ast
import os
import subprocess
import sys

import helpers

PACKAGE = os.path.join(helpers.REPO, 'vit_jax')
TOOLS = (
    'vit_jax.tools.predict',
    'vit_jax.tools.export',
    'vit_jax.tools.fewshot',
    'vit_jax.tools.pictures',
    'vit_jax.checkpoints.run_dir',
)


def _module_name(path: str) -> str:
  relative = os.path.relpath(path, helpers.REPO)[: -len('.py')].split(os.sep)
  return '.'.join(relative[:-1] if relative[-1] == '__init__' else relative)


def _imports() -> dict[str, set[str]]:
  """Each vit_jax module -> the vit_jax modules it imports (anywhere in the file)."""
  modules = {}
  for root, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith('.py'):
        path = os.path.join(root, name)
        modules[_module_name(path)] = path
  graph = {}
  for module, path in modules.items():
    imported = set()
    for node in ast.walk(ast.parse(open(path).read())):
      if isinstance(node, ast.Import):
        imported |= {alias.name for alias in node.names}
      elif isinstance(node, ast.ImportFrom) and node.module:
        # `from package import module` imports that module; `from module import name`, the module.
        submodules = {f'{node.module}.{alias.name}' for alias in node.names} & set(modules)
        imported |= submodules or {node.module}
    # A module's own packages are initialised before it in any case: no edge to them.
    graph[module] = {m for m in imported if m in modules and not (module + '.').startswith(m + '.')}
  return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
  seen, todo = set(), [start]
  while todo:
    for child in graph[todo.pop()]:
      if child not in seen:
        seen.add(child)
        todo.append(child)
  return seen


def test_no_import_cycles():
  graph = _imports()
  for module in graph:
    assert module not in _reachable(
        graph, module
    ), f'{module} imports itself through another module'


def test_the_tools_that_load_a_trained_model_do_not_import_the_training_loop():
  graph = _imports()
  for tool in TOOLS:
    assert not any(m.startswith('vit_jax.train') for m in _reachable(graph, tool) | {tool}), tool
  # And at run time, all the way down.
  code = (
      f'import sys; import {", ".join(TOOLS)}; '
      "print(sorted(m for m in sys.modules if m.startswith('vit_jax.train')))"
  )
  run = subprocess.run(
      [sys.executable, '-c', code], cwd=helpers.REPO, capture_output=True, text=True, timeout=300
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.strip() == '[]'


def test_configs_hold_experiment_files_only():
  configs = os.path.join(helpers.REPO, 'configs')
  for root, _, files in os.walk(configs):
    for name in files:
      if name.endswith('.py') and name != '__init__.py':
        tree = ast.parse(open(os.path.join(root, name)).read())
        functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert set(functions) <= {'get_config', 'get_sweep'}, (name, functions)
  package = subprocess.run(
      [
          sys.executable,
          '-c',
          'import vit_jax.train.loop, sys; '
          "print([m for m in sys.modules if m.split('.')[0] == 'configs'])",
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert package.stdout.strip() == '[]', 'the library imports configs/'
