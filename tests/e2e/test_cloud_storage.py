"""Every path on cloud storage: gs:// URLs served by a GCS emulator on localhost (tests/gcs_emulator.py).

The programs run from an empty working directory, which must stay empty: a gs:// path taken for a
local one would leave a `gs:` directory there."""

import io
import os
import signal
import subprocess
import sys
import zipfile

import chex
from etils import epath
from etils.epath import backend
import orbax.checkpoint as ocp
from PIL import Image
import pytest

import gcs_emulator
import helpers
from vit_jax.checkpoints import saved_state
from vit_jax.train import events
from vit_jax.data import digits
from vit_jax.data import folder
from vit_jax.data import images
from vit_jax.train import loop, setup as train_setup

pytest.importorskip('gcp_storage_emulator', reason='the test extra installs gcp-storage-emulator')
pytest.importorskip('gcsfs', reason='the test extra installs gcsfs')

BUCKET = 'vit-jax-tests'


@pytest.fixture(scope='module')
def gcs(tmp_path_factory):
  emulator = gcs_emulator.GcsEmulator(BUCKET, str(tmp_path_factory.mktemp('gcs') / 'emulator.log'))
  yield emulator
  emulator.close()


def _run(cwd, env, *args, returncode=0):
  result = subprocess.run(
      [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
  )
  assert result.returncode == returncode, f'{args}:\n{result.stderr[-3000:]}'
  # gcsfs keeps the listings it has seen in this process; the child processes have changed them.
  backend.fsspec_backend.fs('gs://').invalidate_cache()
  return result


@pytest.mark.slow
def test_train_resume_init_export_and_every_tool_on_gcs(tmp_path, data_dir, gcs, monkeypatch):
  for name, value in gcs.env.items():  # The checks below read the bucket from this process.
    monkeypatch.setenv(name, value)
  # epath decides once per process whether TensorFlow serves gs://; it may have decided already.
  monkeypatch.setattr('etils.epath.gpath._is_tf_installed', lambda: False)
  env = dict(os.environ)
  cwd = tmp_path / 'cwd'
  cwd.mkdir()
  root = f'gs://{BUCKET}'
  png = io.BytesIO()
  Image.fromarray(digits.split_arrays()['test'][0][0]).save(png, format='PNG')
  epath.Path(f'{root}/images/digit.png').write_bytes(png.getvalue())

  # A run killed (SIGKILL) after its first checkpoints resumes from its newest one on the bucket and
  # ends bit-identical to the same run on a local disk.
  overrides = {**helpers.TINY, 'data_dir': data_dir, 'lr.base': 1e-2}
  flags = [
      f'--config={helpers.REPO}/configs/demo.py',
      f'--workdir={root}/runs/pre',
      *(f'--config.{k}={v}' for k, v in overrides.items()),
  ]
  _run(
      cwd,
      dict(env, FAULT='kill_before_step:10'),
      os.path.join(helpers.REPO, 'tests/faulty_main.py'),
      *flags,
      returncode=-signal.SIGKILL,
  )
  newest = saved_state.saved_steps(f'{root}/runs/pre')[-1]
  assert newest in (4, 8)
  resumed = _run(cwd, env, '-m', 'vit_jax.main', *flags)
  assert f'Training 12 steps from step {newest}:' in resumed.stderr, resumed.stderr[-3000:]
  reference = str(tmp_path / 'reference')
  loop.train_and_evaluate(train_setup.prepare(helpers.load_config('demo', overrides), reference))
  checkpointer = ocp.StandardCheckpointer()
  final = [
      checkpointer.restore(f'{workdir}/checkpoints/12/default')
      for workdir in (reference, f'{root}/runs/pre')
  ]
  chex.assert_trees_all_equal(final[0], final[1])
  scalars = events.read_scalars(f'{root}/runs/pre')  # TensorBoard's files went to the bucket too.
  assert scalars['eval_top1'][12] == events.read_scalars(reference)['eval_top1'][12]

  _run(
      cwd,
      env,
      '-m',
      'vit_jax.tools.export',
      f'--workdir={root}/runs/pre',
      f'--out={root}/exported/pre',
  )
  assert sorted(p.name for p in epath.Path(f'{root}/exported/pre').iterdir()) == [
      'config.json',
      'model.jaxexport',
      'model.npz',
      'timm',
  ]
  image = f'{root}/images/digit.png'
  from_run = _run(
      cwd, env, '-m', 'vit_jax.tools.predict', f'--workdir={root}/runs/pre', image
  ).stdout
  from_export = _run(
      cwd, env, '-m', 'vit_jax.tools.predict', f'--export={root}/exported/pre', image
  ).stdout
  assert 'digit.png' in from_run and from_run == from_export

  # Fine-tuning at a new resolution from the exported .npz and from the run's workdir: the same
  # parameters, so the same losses; not those of the same run from scratch.
  finetuned = {}
  for name, init_from in (
      ('npz', f'{root}/exported/pre/model.npz'),
      ('workdir', f'{root}/runs/pre'),
      ('scratch', None),
  ):
    workdir = f'{root}/runs/finetune_{name}'
    _run(
        cwd,
        env,
        '-m',
        'vit_jax.main',
        f'--config={helpers.REPO}/configs/demo.py',
        f'--workdir={workdir}',
        *(f'--config.{k}={v}' for k, v in overrides.items()),
        '--config.image_size=12',
        '--config.total_steps=4',
        *([f'--config.init_from={init_from}'] if init_from else []),
    )
    finetuned[name] = events.read_scalars(workdir)['train_loss'][4]
  assert finetuned['npz'] == finetuned['workdir'] != finetuned['scratch']
  # The killed run wrote its curves up to its last checkpoint before it was killed.
  assert sorted(scalars['train_loss']) == [4, 8, 12]

  fewshot = _run(
      cwd,
      env,
      '-m',
      'vit_jax.tools.fewshot',
      f'--workdir={root}/runs/pre',
      '--shots=1',
      '--seeds=1',
  ).stdout
  assert fewshot.splitlines()[-1].split()[0] == '1'
  _run(
      cwd,
      env,
      '-m',
      'vit_jax.tools.pictures',
      f'--workdir={root}/runs/pre',
      f'--image={image}',
      f'--out={root}/pictures',
  )
  assert epath.Path(f'{root}/pictures/attention_rollout.png').exists()
  _run(cwd, env, '-m', 'vit_jax.tools.report', f'{root}/runs', f'--out={root}/report')
  assert {p.name for p in epath.Path(f'{root}/report').iterdir()} == {'report.png', 'report.html'}
  assert os.listdir(cwd) == []


def _uploaded(local, name: str) -> str:
  """The files under folder `local` copied to gs://BUCKET/`name`, and that folder."""
  remote = f'gs://{BUCKET}/{name}'
  for path in local.rglob('*'):
    if path.is_file():
      epath.Path(f'{remote}/{path.relative_to(local)}').write_bytes(path.read_bytes())
  backend.fsspec_backend.fs('gs://').invalidate_cache()
  return remote


def _assert_same_examples(ours, theirs, counts: dict[str, int]) -> None:
  """Sources `ours` and `theirs` hold `counts[split]` examples of each split, the same labels and
  pixels."""
  for split, count in counts.items():
    mine, reference = ours.examples(split), theirs.examples(split)
    assert mine.num_records == reference.num_records == count
    for k in range(count):
      a, b = ours.load(mine.read(k)), theirs.load(reference.read(k))
      assert int(a['label']) == int(b['label'])
      chex.assert_trees_all_equal(images.pixels(a['image']), images.pixels(b['image']))


@pytest.mark.slow
def test_a_hugging_face_dataset_on_gcs_reads_as_its_local_copy(tmp_path, gcs, monkeypatch):
  """Parquet files in a bucket: the splits, classes, rows and pixels of the same files on disk,
  copied once into the local cache; a save_to_disk directory there is one line naming the fix."""
  datasets = pytest.importorskip('datasets')
  from vit_jax.data import dataset_cache  # pylint: disable=g-import-not-at-top
  from vit_jax.data import hf_source  # pylint: disable=g-import-not-at-top

  for name, value in gcs.env.items():
    monkeypatch.setenv(name, value)
  monkeypatch.setattr('etils.epath.gpath._is_tf_installed', lambda: False)
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(tmp_path / 'cache'))
  features = datasets.Features(
      {'image': datasets.Image(), 'label': datasets.ClassLabel(names=list(digits.CLASS_NAMES))}
  )
  local = tmp_path / 'hf'
  for split, (pixels, labels) in digits.split_arrays().items():
    for shard in range(2):
      rows = slice(shard, 40, 2)
      datasets.Dataset.from_dict(
          {'image': [Image.fromarray(p) for p in pixels[rows]], 'label': labels[rows].tolist()},
          features=features,
      ).to_parquet(str(local / 'data' / f'{split}-{shard:05d}-of-00002.parquet'))
  remote = _uploaded(local, 'hf')

  ours, theirs = (
      hf_source.HuggingFaceSource(root, 'train', 'label') for root in (remote, str(local))
  )
  assert ours.class_names == theirs.class_names == digits.CLASS_NAMES
  _assert_same_examples(ours, theirs, {'train': 40, 'test[5:]': 35})
  assert len(list((tmp_path / 'cache').glob('*.arrow'))) == 4  # Two splits, from two places.

  datasets.Dataset.from_dict({'image': [], 'label': []}, features=features).save_to_disk(
      str(tmp_path / 'saved')
  )
  _uploaded(tmp_path / 'saved', 'saved')
  with pytest.raises(
      ValueError, match='save_to_disk directory on cloud storage.*copy it to a local'
  ):
    hf_source.HuggingFaceSource(f'gs://{BUCKET}/saved', 'train', 'label')


@pytest.mark.slow
def test_webdataset_shards_on_gcs_read_in_place_as_their_local_copy(tmp_path, gcs, monkeypatch):
  """Tar shards in a bucket: indexed from their headers, each image then one ranged read: the
  splits, rows and pixels of the same shards on disk."""
  from vit_jax.data import dataset_cache  # pylint: disable=g-import-not-at-top
  from vit_jax.data import hf_source  # pylint: disable=g-import-not-at-top

  for name, value in gcs.env.items():
    monkeypatch.setenv(name, value)
  monkeypatch.setattr('etils.epath.gpath._is_tf_installed', lambda: False)
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(tmp_path / 'cache'))
  local = tmp_path / 'shards'
  helpers.digits_shards(str(local), 2, examples=30)
  remote = _uploaded(local, 'shards')

  ours, theirs = (
      hf_source.HuggingFaceSource(root, 'train', 'cls') for root in (remote, str(local))
  )
  assert ours.class_names == theirs.class_names
  _assert_same_examples(ours, theirs, {'train': 30, 'test[3:]': 27})
  assert len(list((tmp_path / 'cache').glob('*.webdataset'))) == 4  # Two splits, two places.


@pytest.mark.slow
def test_an_image_folder_on_gcs_reads_as_its_local_copy(tmp_path, gcs, monkeypatch):
  """Image files in a bucket, labelled by folder in one copy and by a metadata.csv in another: the
  splits, classes, rows and pixels of the same files on disk."""
  from vit_jax.data import hf_source  # pylint: disable=g-import-not-at-top

  for name, value in gcs.env.items():
    monkeypatch.setenv(name, value)
  monkeypatch.setattr('etils.epath.gpath._is_tf_installed', lambda: False)
  for layout in ('folders', 'metadata'):
    local = tmp_path / layout
    for split, (pixels, labels) in digits.split_arrays().items():
      listed = []
      for k in range(12):
        name = f'{labels[k]}/{k:03d}.png' if layout == 'folders' else f'images/{k:03d}.png'
        (local / split / name).parent.mkdir(parents=True, exist_ok=True)
        (local / split / name).write_bytes(helpers.encoded(pixels[k][..., 0], 'PNG'))
        listed.append(f'{name},{labels[k]}\n')
      if layout == 'metadata':
        (local / split / 'metadata.csv').write_text('file_name,label\n' + ''.join(listed))
    remote = _uploaded(local, layout)
    ours, theirs = (
        hf_source.HuggingFaceSource(root, 'train', 'label') for root in (remote, str(local))
    )
    assert ours.class_names == theirs.class_names and len(ours.class_names) > 1
    _assert_same_examples(ours, theirs, {'train': 12, 'test[2:]': 10})

  # The class folders zipped: an archive a split for datasets' image folder, and one archive of
  # the whole folder, read as a folder (dataset='folder'), each unextracted from the bucket.
  local, zips = tmp_path / 'folders', tmp_path / 'zips'
  zips.mkdir()
  for archive, prefix in (
      (zips / 'data/train.zip', 'train'),
      (zips / 'data/test.zip', 'test'),
      (tmp_path / 'all.zip', ''),
  ):
    archive.parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(archive, 'w', zipfile.ZIP_DEFLATED) as zipped:
      for path in sorted((local / prefix).rglob('*.png')):
        zipped.write(path, path.relative_to(local / prefix))
  remote = _uploaded(zips, 'zips')
  ours, theirs = (hf_source.HuggingFaceSource(r, 'train', 'label') for r in (remote, str(local)))
  assert ours.class_names == theirs.class_names
  _assert_same_examples(ours, theirs, {'train': 12, 'test[2:]': 10})
  epath.Path(f'{remote}/all.zip').write_bytes((tmp_path / 'all.zip').read_bytes())
  ours, theirs = (folder.FolderSource(r, 'train') for r in (f'{remote}/all.zip', str(local)))
  assert ours.class_names == theirs.class_names
  _assert_same_examples(ours, theirs, {'train': 12})  # The 12 test digits hold other classes.
