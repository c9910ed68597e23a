"""The benchmark scripts: their FLOP count agrees with XLA's, and they run end to end (tiny sizes)."""

import functools
import os
import re
import subprocess
import sys
import time

import pytest

import helpers
from vit_jax.models import variants

sys.path.insert(0, f'{helpers.REPO}/benchmarks')
import step_harness  # pylint: disable=g-import-not-at-top,wrong-import-position
import train_step  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.mark.parametrize(
    'variant,mode,extra',
    [
        ('ViT-S_16', 'train', []),
        ('ViT-S_16', 'inference', []),
        ('Axial-ViT-S_16', 'inference', []),
        ('ViT-S_16', 'train', ['--lora_rank=8']),  # No gradient of the frozen weights: 2x forward.
    ],
)
def test_analytic_flops_agree_with_xla_cost_analysis(variant, mode, extra):
  args = train_step.make_parser().parse_args(
      [f'--variant={variant}', '--image_size=224', '--batch=8', f'--mode={mode}', *extra]
  )
  config = train_step.make_config(args)
  model = variants.get_model_config(config.variant, config.model.to_dict())
  analytic = train_step.step_flops(model, args) * args.batch
  # XLA also counts norms, softmax, GELU and the optimizer (on each of the 8 devices: parameters are
  # replicated): a little more than the matmuls.
  assert analytic <= step_harness.Ours(config, model, mode).xla_flops <= 1.05 * analytic


def _run(script, *args, env=None):
  """The standard output of benchmarks/`script` (Python, or bash for a .sh) with `args`."""
  program = 'bash' if script.endswith('.sh') else sys.executable
  run = subprocess.run(
      [program, f'benchmarks/{script}', *args],
      cwd=helpers.REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  return run.stdout


@pytest.mark.parametrize(
    'peer,extra,fast_paths',
    [('timm', ['--scan'], 'scan'), ('peft', ['--lora_rank=4'], 'LoRA rank 4 of query,value')],
)
def test_train_step_compares_with_its_peer_in_one_run(peer, extra, fast_paths):
  out = _run(
      'train_step.py',
      '--variant=ViT-Ti_16',
      '--image_size=32',
      '--batch=8',
      f'--peer={peer}',
      '--warmup=1',
      '--steps=1',
      '--rounds=2',
      '--peak-tflops=gemm',
      '--header',
      *extra,
  )
  rows = [
      line
      for line in out.splitlines()
      if line.startswith('| vit_jax') or line.startswith(f'| {peer} ')
  ]
  assert len(rows) == 2 and f'| {fast_paths} |' in rows[0], out
  assert all(
      line.split('|')[14].strip().endswith('%') for line in rows
  ), out  # MFU of the measured peak.
  assert f'# ours/{peer} images/s: ' in out
  assert re.search(
      rf'^# ours/{peer} images/s paired by round: [\d.]+x median \([\d.]+-[\d.]+x over 2 rounds\)$',
      out,
      re.M,
  ), out
  assert re.search(
      r'^# machine: .*, AVX-512: (yes|no).*transparent huge pages: \w+; \d{4}-\d\d-\d\d$', out, re.M
  ), out


def test_paired_ratio_compares_each_round_with_its_neighbour():
  # Ours is 2x the peer's speed in every round while the machine slows 3x between rounds: each round's
  # ratio of sums is 2x.
  ours, peer = [[1.0, 1.0], [3.0, 3.0], [1.5, 1.5]], [[2.0, 2.0], [6.0, 6.0], [2.4, 3.6]]
  assert step_harness.paired_ratio(ours, peer) == (2.0, 2.0, 2.0)
  assert step_harness.paired_ratio([[1.0], [1.0], [1.0]], [[0.9], [1.2], [1.0]]) == (1.0, 0.9, 1.2)
  with pytest.raises(ValueError):
    step_harness.paired_ratio([[1.0]], [])


def test_in_flight_steps_are_waited_for_once_and_share_the_rounds_time():
  calls = []
  step = lambda: calls.append('step') or time.sleep(0.01)
  times = step_harness.time_steps(step, 3, wait=lambda: calls.append('wait') or time.sleep(0.03))
  assert calls == ['step', 'step', 'step', 'wait']
  assert len(set(times)) == 1 and 0.02 <= times[0] < 0.1  # (3 x 0.01 + 0.03) / 3
  calls.clear()
  assert len(step_harness.time_steps(step, 2)) == 2 and calls == ['step', 'step']


def test_revisions_runs_the_step_of_each_prepared_commit(tmp_path):
  env = {**os.environ, 'REVISIONS_DIR': str(tmp_path), 'PYTHON': sys.executable}
  run = functools.partial(_run, 'revisions.sh', env=env)

  run('prepare', 'HEAD~1', 'HEAD')
  revisions = sorted(os.listdir(tmp_path))
  assert [r.split('-')[0] for r in revisions] == ['1', '2']
  assert all(os.path.exists(tmp_path / r / 'vit_jax/models/vit.py') for r in revisions)
  out = run(
      'run',
      '--variant=ViT-Ti_16',
      '--image_size=32',
      '--batch=8',
      '--warmup=1',
      '--steps=2',
      '--rounds=1',
      '--in-flight',
  )
  rows = [line for line in out.splitlines() if line.startswith('| vit_jax@')]
  assert [row.split('|')[1].strip() for row in rows] == [
      f"vit_jax@{r.split('-')[1]}" for r in revisions
  ]
  assert all('train (in flight)' in row for row in rows)


def test_profile_names_gpu_kernels_by_their_ops_source():
  """A GPU trace names an XLA fusion's kernel with '_' for its '.'; cuBLAS's kernels are not ops."""
  hlo = (
      '%loop_add_fusion.3 = f32[8]{0} fusion(%p), kind=kLoop, metadata={op_name="jit(train_step)/'
      'Transformer/encoderblock_4/add"}\n%dot.1 = f32[2]{0} dot(%a, %b), metadata={op_name="jit(f)/'
      'encoderblock_0/MlpBlock_3/Dense_0/dot_general"}\n'
  )
  sources = step_harness.op_sources(hlo)
  assert (
      sources['loop_add_fusion_3']
      == sources['loop_add_fusion.3']
      == 'Transformer/encoderblock_*/add'
  )
  durations = {
      'loop_add_fusion_3': [2.0, 1.0],
      'dot.1': [4.0, 5.0],  # 2 steps: fastest of each op.
      'nvjet_sm90_tst_128x160': [3.0, 1.0, 3.0, 1.0],
  }  # A library kernel: all of its time.
  assert step_harness.time_by_source(durations, sources, steps=2) == {
      ('loop_add_fusion', 'Transformer/encoderblock_*/add'): 1.0,
      ('dot', 'encoderblock_*/MlpBlock_3/Dense_0/dot_general'): 4.0,
      ('nvjet_sm90_tst_128x160', '(library kernel)'): 4.0,
  }


def test_profile_prints_where_the_cpu_steps_time_goes(capsys):
  args = train_step.make_parser().parse_args(
      ['--variant=ViT-testing_4', '--image_size=16', '--batch=8']
  )
  config = train_step.make_config(args)
  ours = step_harness.Ours(config, helpers.model_config(config), 'train')
  ours.allocate()
  step_harness.profile(ours, steps=2, top=5)
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].startswith('# profile: ') and len(lines) == 6, lines
  assert any('encoderblock_*' in line for line in lines[1:]), lines


def test_input_pipeline_reads_the_digits_with_and_without_workers():
  out = _run(
      'input_pipeline.py',
      '--source=digits',
      '--image_size=16',
      '--batch=8',
      '--warmup=1',
      '--batches=2',
      '--workers=0,1',
  )
  for workers in (0, 1):
    assert (
        f'| bundled digits (8x8, in memory) | 16 | 8 | inception + flip | 0 | {workers} |' in out
    ), out


def test_input_pipeline_reads_generated_jpegs():
  out = _run(
      'input_pipeline.py',
      '--source=folder',
      '--num_images=16',
      '--image_size=32',
      '--batch=8',
      '--warmup=1',
      '--batches=2',
      '--header',
      '--randaug=2,10',
      '--jpeg_size=300x200',
      '--reducing_gap=0,3',
  )
  for gap in (0, 3):
    assert (
        '| 16 generated 300x200 JPEGs (image folder) | 32 | 8 | inception + flip + RandAugment(2, '
        f'10) | {gap} | auto |' in out
    ), out


def test_hf_datasets_reads_the_same_jpegs_as_parquet_and_as_a_folder():
  out = _run(
      'hf_datasets.py',
      '--num_images=24',
      '--shards=3',
      '--image_size=32',
      '--batch=8',
      '--reads=20',
      '--warmup=1',
      '--batches=2',
      '--rounds=1',
  )
  assert '# 24 JPEGs of 500x375' in out, out
  rows = ('| ours | ', '| ours, tar shards | ', '| datasets | ', '| folder | ', '| huggingface | ')
  rows += ('| ours, zip archive | ', '| datasets, zip archive | ', '| huggingface, zip archive | ')
  rows += ('| Parquet copy: one host of 4 (its data shard) |',)
  rows += ('| Parquet copy: one host of 4, its 2 data shards together |',)
  for row in (*rows, '| huggingface, tar shards | ', '| tar split read: first (indexed) |'):
    assert row in out, out


def test_eval_passes_times_kept_workers_against_new_ones():
  out = _run(
      'eval_passes.py',
      '--num_images=16',
      '--image_size=32',
      '--batch=8',
      '--workers=1',
      '--passes=2',
      '--rounds=1',
      '--header',
  )
  row = re.search(
      r'\| 16 \| 32 \| 8 \| 1 \| 1 \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|', out
  )
  assert row, out
  fresh, _, kept, ratio = (float(x) for x in row.groups())
  assert ratio == pytest.approx(kept / fresh, abs=0.01)


def test_recipes_trains_each_recipe_and_prints_its_row(data_dir):
  out = _run('recipes.py', '--steps=2', '--only=all four', f'--data_dir={data_dir}', '--header')
  rows = [line for line in out.splitlines() if line.startswith('| + all four |')]
  assert len(rows) == 1 and rows[0].split('|')[2].strip().endswith('%'), out


def test_distillation_trains_a_teacher_and_the_student_alone_and_distilled():
  out = _run(
      'distillation.py',
      '--teacher_steps=2',
      '--steps=2',
      '--seeds=0',
      '--only=hard, dist',
      '--student=XS',
      '--train_split=train[:20%]',
      '--set=pp.min_area=0.08',
  )
  assert re.search(r'^teacher: the demo ViT, 2 steps, seed 0: [\d.]+% test top-1', out, re.M), out
  assert '| student XS (2 steps on train[:20%], pp.min_area=0.08) |' in out, out
  for side in ('alone', 'hard, distillation token'):
    assert re.search(rf'^\| {re.escape(side)} \| 0 \| [\d.]+ \|', out, re.M), out
    assert f'| {side} | mean ± sd |' in out, out


def test_tfdata_peer_times_ours_and_tf_datas_two_pipelines():
  out = _run(
      'tfdata_peer.py',
      '--num_images=16',
      '--image_size=32',
      '--batch=4',
      '--warmup=1',
      '--batches=2',
      '--rounds=1',
  )
  for pipeline in ('ours (grain, threads)', 'tf.data, same work', 'tf.data, shortcut'):
    assert re.search(rf'^\| {re.escape(pipeline)} \| 1 \| \d+ \| \d+ \|$', out, re.M), out


@pytest.mark.slow  # Two end-to-end training runs: our CLI and timm's loop, in their own processes.
def test_folder_vs_timm_trains_both_sides_on_the_same_folder(tmp_path):
  # One torch thread: with more, other load on the machine (the rest of the suite) slows timm's steps
  # many times over.
  out = _run(
      'folder_vs_timm.py',
      '--steps=4',
      '--seeds=0',
      '--train_fraction=0.1',
      '--png_size=16',
      '--timm_threads=1',
      f'--root={tmp_path / "digits"}',
      '--header',
  )
  rows = {
      line.split('|')[1].strip(): line.split('|')
      for line in out.splitlines()
      if line.startswith(('| ours | 0 |', '| timm | 0 |'))
  }
  assert set(rows) == {'ours', 'timm'}, out
  for cells in rows.values():
    top1, loss, wall, images_per_sec = (float(cells[i]) for i in range(3, 7))
    assert 0 <= top1 <= 100 and loss > 0 and wall > 0 and images_per_sec > 0, out
  ratios = [line for line in out.splitlines() if line.startswith('# ours/timm')]
  assert len(ratios) == 1 and ' points, ' in ratios[0] and ratios[0].endswith('x'), out
  assert '(142 train / 360 test' in out, out  # The first tenth of each class's train images.
  # timm drops where the demo config drops: the head's features, and inside the encoder.
  config = helpers.load_config('demo')
  model = variants.get_model_config(config.variant, config.model.to_dict())
  assert (
      f"timm dropout: {{'drop_rate': {model['head_dropout_rate']}, 'pos_drop_rate': "
      f"{model['dropout_rate']}, 'proj_drop_rate': {model['dropout_rate']}}}"
  ) in out, out


@pytest.mark.slow  # Four demo commands (a cold one and three warm), each its own process.
def test_startup_times_the_demo_command_against_a_peer_checkout():
  out = _run('startup.py', '--runs=1', f'--peer={helpers.REPO}')
  rows = [line for line in out.splitlines() if line.startswith(('| this', '| peer'))]
  assert len(rows) == 2, out
  for row in rows:
    first_step, whole = (float(cell.split()[0]) for cell in row.split('|')[2:4])
    assert 0 < first_step < whole, row
  assert out.splitlines()[-1].startswith('this / peer: first step '), out


def test_host_to_device_times_float32_and_uint8_batches():
  out = _run('host_to_device.py', '--batch=2', '--image_size=8', '--repeats=1')
  rows = [
      line.split('|')[1].strip()
      for line in out.splitlines()
      if line.startswith('| f') or line.startswith('| u')
  ]
  assert rows == ['float32', 'uint8'], out
  assert out.splitlines()[-1].startswith('uint8 (copy + normalise) / float32 (copy): '), out


def test_divided_index_times_threads_processes_and_two_hosts_that_make_the_same_index():
  out = _run('divided_index.py', '--tars=16', '--samples=10')
  assert '# 16 tars of 10 samples' in out, out
  for row in ('1 process, threads', '1 process, its indexing processes', '2 processes (hosts)'):
    assert f'| {row}' in out, out


def test_worker_paths_times_packed_paths_against_a_list_and_a_zips_index_against_its_listing():
  out = _run('worker_paths.py', '--classes=3', '--per_class=5', '--rounds=1')
  assert '# 15 paths' in out and '| list | ' in out and '| packed | ' in out, out
  assert 'packed / list: MB pickled ' in out and '| index mapped (each worker, now) | ' in out, out
  assert out.splitlines()[-1].startswith('index / listing: s '), out


def test_knn_times_ours_against_dinos_torch_loop_and_sklearn_at_one_accuracy():
  out = _run(
      'knn.py', '--train=600', '--test=90', '--dim=16', '--classes=5', '--rounds=1', '--sklearn'
  )
  assert ', k=20: top-1 ' in out and 'on every side' in out, out
  for side in ('ours (jax)', "DINO's (torch)", 'scikit-learn'):
    assert f'| {side} | ' in out, out
