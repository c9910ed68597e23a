"""The Python half of benchmarks/accelerator_check.sh: the inputs it writes, the figures it reads.

  python3 benchmarks/accelerator_check.py environment
  python3 benchmarks/accelerator_check.py normalize_bits
  python3 benchmarks/accelerator_check.py jpegs DIR --num_images=2048
  python3 benchmarks/accelerator_check.py digits DIR --count=100
  python3 benchmarks/accelerator_check.py metric WORKDIR eval_top1 [--at_least=0.97]
  python3 benchmarks/accelerator_check.py same_params RUN_A RUN_B
  python3 benchmarks/accelerator_check.py predictions LOG
  python3 benchmarks/accelerator_check.py train_rate WORKDIR [--synthetic=IMAGES_PER_S]
  python3 benchmarks/accelerator_check.py table_value LOG vit_jax 'images/s (median)'
  python3 benchmarks/accelerator_check.py test_results JUNIT_XML FAILURES_MD

Each command prints one line, what the check's summary shows for its step, and exits with status 1
(the line saying why) where the step fails.
"""

import argparse
import concurrent.futures
import os
import statistics
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


class CheckFailed(Exception):
  """What a step found wrong, in one line."""


def _write_jpeg(path: str, seed: tuple[int, ...], size: tuple[int, int]) -> None:
  from PIL import Image  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  # Upsampled noise compresses like a photograph more than white noise does (as
  # benchmarks/input_pipeline.py writes its JPEGs).
  small = rng.integers(0, 256, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
  Image.fromarray(small).resize(size, Image.BILINEAR).save(path, quality=90)


def write_jpegs(
    root: str, num_images: int, num_classes: int = 10, size: tuple[int, int] = (500, 375)
) -> str:
  """`num_images` random JPEGs of `size` (quality 90) in root/train/<class>/ and `num_classes` in
  root/test/<class>/: an image folder dataset, written on every core."""
  jobs = []
  for split_id, (split, count) in enumerate((('train', num_images), ('test', num_classes))):
    for i in range(count):
      folder = os.path.join(root, split, f'class_{i % num_classes}')
      os.makedirs(folder, exist_ok=True)
      jobs.append((os.path.join(folder, f'{i:05d}.jpg'), (0, split_id, i), size))
  with concurrent.futures.ProcessPoolExecutor(len(os.sched_getaffinity(0))) as pool:
    list(pool.map(_write_jpeg, *zip(*jobs), chunksize=64))
  return f'{num_images} + {num_classes} JPEGs of {size[0]}x{size[1]} in {root}'


def write_digits(folder: str, count: int) -> str:
  """The first `count` test digits of the demo's split (scikit-learn's, as vit_jax/data/digits.py
  splits them) as 8x8 PNGs named <label>_<index>.png, for predict."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from sklearn import datasets, model_selection  # pylint: disable=g-import-not-at-top

  digits = datasets.load_digits()
  grey = np.round(digits.images * 255 / 16).astype(np.uint8)
  _, images, _, labels = model_selection.train_test_split(
      grey, digits.target, test_size=0.2, random_state=0, stratify=digits.target
  )
  os.makedirs(folder, exist_ok=True)
  for i, (image, label) in enumerate(zip(images[:count], labels[:count])):
    Image.fromarray(image).save(os.path.join(folder, f'{label}_{i:04d}.png'))
  return f'{min(count, len(images))} test digits in {folder}'


def final_metric(workdir: str, tag: str, at_least: float | None = None) -> str:
  """The last logged value of `tag` in the run's TensorBoard events."""
  from vit_jax.train import events  # pylint: disable=g-import-not-at-top

  values = events.read_scalars(workdir).get(tag)
  if not values:
    raise CheckFailed(f'no {tag} logged in {workdir}')
  step = max(values)
  text = f'{tag} {values[step]:.4f} at step {step}'
  if at_least is not None and values[step] < at_least:
    raise CheckFailed(f'{text}, below {at_least}')
  return text


def same_params(run_a: str, run_b: str) -> str:
  """Asserts that the last checkpoints of two workdirs are of the same step and hold bit-identical
  parameters (the Polyak average where the runs keep one: what saved_state.restore_params reads)."""
  from vit_jax.checkpoints import saved_state  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  steps = [saved_state.saved_steps(run)[-1:] for run in (run_a, run_b)]
  if not all(steps) or steps[0] != steps[1]:
    raise CheckFailed(f'last checkpoints differ: {steps[0]} in {run_a}, {steps[1]} in {run_b}')
  (a, name), (b, _) = (
      saved_state.restore_params(os.path.join(run, 'checkpoints', str(steps[0][0])))
      for run in (run_a, run_b)
  )
  leaves_a, leaves_b = (jax.tree_util.tree_leaves_with_path(tree) for tree in (a, b))
  if [p for p, _ in leaves_a] != [p for p, _ in leaves_b]:
    raise CheckFailed('the parameter trees differ')
  differing = []
  for (path, x), (_, y) in zip(leaves_a, leaves_b):
    if x.dtype != y.dtype or x.shape != y.shape:
      differing.append(f'{jax.tree_util.keystr(path)} ({x.dtype}{x.shape} vs {y.dtype}{y.shape})')
    elif x.tobytes() != y.tobytes():
      gap = np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))
      differing.append(f'{jax.tree_util.keystr(path)} (max |difference| {gap:.3g})')
  if differing:
    raise CheckFailed(
        f'{len(differing)} of {len(leaves_a)} {name} arrays differ at step '
        f'{steps[0][0]}, e.g. {differing[0]}'
    )
  size = sum(x.size for _, x in leaves_a)
  return f'{name} bit-identical at step {steps[0][0]} ({len(leaves_a)} arrays, {size:,} values)'


def predictions(log: str) -> str:
  """Top-1 accuracy of predict's output (an image's path line, then its '  prob  label' lines) on
  images named <label>_*.png."""
  right = total = 0
  lines = open(log, encoding='utf-8').read().splitlines()
  for path, top in zip(lines, lines[1:]):
    if path.startswith(' ') or not top.startswith('  '):
      continue
    expected = os.path.basename(path).split('_')[0]
    total += 1
    right += top.split()[-1] == expected
  if not total:
    raise CheckFailed(f'no prediction in {log}')
  return f'{right}/{total} top-1 right'


def train_rate(workdir: str, synthetic: float | None = None) -> str:
  """The median images/s of a run's logged windows after the first (which holds the compilation),
  its ratio to `synthetic` images/s (the train step's on synthetic batches), and the median share of
  those windows' time the loop waited for its next batch (the input pipeline's hold on the steps).
  """
  from vit_jax.train import events  # pylint: disable=g-import-not-at-top

  scalars = events.read_scalars(workdir)
  windows = scalars.get('images_per_sec', {})
  rates = [windows[step] for step in sorted(windows)[1:]]
  if not rates:
    raise CheckFailed(f'fewer than 2 logged windows of images_per_sec in {workdir}')
  rate = statistics.median(rates)
  text = f'{rate:.1f} images/s (median of {len(rates)} windows, {min(rates):.1f}-{max(rates):.1f})'
  if synthetic:
    text += f", {rate / synthetic:.2f}x the synthetic batches' {synthetic:.1f}"
  waits = scalars.get('input_wait', {})
  if len(waits) > 1:
    text += (
        f'; {100 * statistics.median(waits[s] for s in sorted(waits)[1:]):.1f}% waiting for input'
    )
  return text


def table_value(log: str, row: str, column: str) -> str:
  """The value in `column` of the markdown row whose first cell is `row` (empty: the first row),
  under the header that names `column`, in a benchmark's output."""
  header = None
  for line in open(log, encoding='utf-8'):
    cells = [cell.strip() for cell in line.strip().strip('|').split('|')]
    if column in cells:
      header = cells
    elif (
        header
        and len(cells) == len(header)
        and not set(cells[0]) <= set('-:')
        and (cells[0] == row or not row)
    ):
      return cells[header.index(column)]
  raise CheckFailed(f'no row {row!r} under a header with {column!r} in {log}')


def test_results(junit_xml: str, failures_md: str) -> str:
  """Counts a pytest run's outcomes from its JUnit XML, and writes to `failures_md` each failed or
  erring test under the first line of its message, tests of one message together."""
  import collections  # pylint: disable=g-import-not-at-top
  from xml.etree import ElementTree  # pylint: disable=g-import-not-at-top

  counts = collections.Counter()
  causes = collections.defaultdict(list)
  for case in ElementTree.parse(junit_xml).iter('testcase'):
    # A module that failed to import is a case with its name and no class.
    test = '::'.join(filter(None, (case.get('classname'), case.get('name'))))
    outcome = next((child for child in case if child.tag in ('failure', 'error', 'skipped')), None)
    if outcome is None:
      counts['passed'] += 1
      continue
    message = (outcome.get('message') or outcome.text or '').strip().splitlines()
    counts[outcome.tag] += 1
    if outcome.tag == 'skipped':
      counts['skipped for want of devices'] += 'devices of' in ''.join(message[:1])
    else:
      causes[message[0][:300] if message else f'({outcome.tag} without a message)'].append(test)
  with open(failures_md, 'w', encoding='utf-8') as out:
    for cause, tests in sorted(causes.items(), key=lambda item: -len(item[1])):
      out.write(f'- {len(tests)}: {cause}\n' + ''.join(f'  - {test}\n' for test in tests))
  text = (
      f"{counts['passed']} passed, {counts['failure']} failed, {counts['error']} errors, "
      f"{counts['skipped']} skipped ({counts['skipped for want of devices']} for want of devices)"
  )
  if not counts['passed'] + counts['failure'] + counts['error'] + counts['skipped']:
    raise CheckFailed(f'no test ran: {junit_xml} lists none')
  if causes:
    raise CheckFailed(f'{text}; {len(causes)} causes in {failures_md}')
  return text


def environment() -> str:
  """The devices, the GPU's driver, and the versions of the packages the steps use."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import grain  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import
  import tensorflow_datasets  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import
  from vit_jax.runtime import cpuinfo  # pylint: disable=g-import-not-at-top

  devices = jax.devices()
  text = f'{devices[0].device_kind} x{len(devices)} ({jax.default_backend()})'
  try:
    text += (
        '; driver '
        + subprocess.run(
            ['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.split()[0]
    )
  except (OSError, subprocess.SubprocessError, IndexError):
    pass
  versions = []
  for name in (
      'jax',
      'jaxlib',
      'flax',
      'optax',
      'orbax-checkpoint',
      'numpy',
      'pillow',
      'grain',
      'tensorflow-datasets',
      'protobuf',
      'tensorflow',
      'tensorflow-cpu',
  ):
    try:
      versions.append(f'{name} {importlib.metadata.version(name)}')
    except importlib.metadata.PackageNotFoundError:
      versions.append(f'{name} absent')
  return (
      f'{text}; host: {cpuinfo.summary()}; Python {sys.version.split()[0]}; '
      f'{", ".join(versions)}'
  )


def normalize_bits() -> str:
  """Asserts that the default device normalises every uint8 level (a batch's pixels, in the jitted
  step) to the bits of the host's `images.normalize`."""
  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax.data import images, on_device  # pylint: disable=g-import-not-at-top

  levels = np.repeat(np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1), 3, axis=-1)
  got = np.asarray(jax.jit(on_device.model_input)(jax.device_put(levels)))
  wrong = np.flatnonzero(got[..., 0].ravel() != images.normalize(levels)[..., 0].ravel())
  if got.dtype != np.float32 or wrong.size:
    raise CheckFailed(
        f'{wrong.size} of 256 levels differ on {jax.default_backend()} (e.g. level '
        f'{wrong[:1]}), or the dtype: {got.dtype}'
    )
  return f"all 256 uint8 levels normalised on {jax.default_backend()} to the host's bits"


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  commands = parser.add_subparsers(dest='command', required=True)
  command = commands.add_parser('jpegs')
  command.add_argument('root')
  command.add_argument('--num_images', type=int, default=2048)
  command = commands.add_parser('digits')
  command.add_argument('folder')
  command.add_argument('--count', type=int, default=100)
  command = commands.add_parser('metric')
  command.add_argument('workdir')
  command.add_argument('tag')
  command.add_argument('--at_least', type=float, default=None)
  command = commands.add_parser('same_params')
  command.add_argument('run_a')
  command.add_argument('run_b')
  commands.add_parser('predictions').add_argument('log')
  command = commands.add_parser('train_rate')
  command.add_argument('workdir')
  command.add_argument('--synthetic', type=float, default=None)
  command = commands.add_parser('table_value')
  for name in ('log', 'row', 'column'):
    command.add_argument(name)
  command = commands.add_parser('test_results')
  command.add_argument('junit_xml')
  command.add_argument('failures_md')
  commands.add_parser('environment')
  commands.add_parser('normalize_bits')
  args = vars(parser.parse_args())
  function = {
      'jpegs': write_jpegs,
      'digits': write_digits,
      'metric': final_metric,
      'same_params': same_params,
      'predictions': predictions,
      'train_rate': train_rate,
      'table_value': table_value,
      'test_results': test_results,
      'environment': environment,
      'normalize_bits': normalize_bits,
  }[args.pop('command')]
  try:
    print(function(**args))
  except CheckFailed as e:
    print(e)
    sys.exit(1)


if __name__ == '__main__':
  main()
