"""What the commands print: the training run's progress bar in a terminal (and plain lines without
one), and export and predict printing their own lines only."""

import contextlib
import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
import tty
from typing import Iterator

import numpy as np
import pytest
from PIL import Image

import helpers
from vit_jax.train import progress

# A user's environment: the tests' conftest quiets TensorFlow for every process it starts, which
# would hide what the commands themselves fail to quiet.
_USER_ENV = {
    k: v
    for k, v in os.environ.items()
    if k not in ('TF_CPP_MIN_LOG_LEVEL', 'TF_ENABLE_ONEDNN_OPTS')
}
# An absl log line, whole: nothing of the bar before it or inside it.
_LOG_LINE = r'^[IWE]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+:\d+\] '
_ESCAPE = '\x1b'


class _Terminal(io.StringIO):
  """A stand-in for a terminal's stderr: what was written, and isatty() True."""

  def isatty(self) -> bool:
    return True


class _Clock:

  def __init__(self):
    self.now = 100.0

  def __call__(self) -> float:
    return self.now


@contextlib.contextmanager
def _terminal_bar() -> Iterator[tuple[progress.TerminalBar, _Terminal, _Clock]]:
  """A TerminalBar of 100 steps at batch 16 on a _Terminal, with a clock the test moves. (Made in
  the test, not a fixture: pytest sets sys.stderr again between a fixture and the test.)"""
  terminal, clock = _Terminal(), _Clock()
  stderr = sys.stderr
  bar = progress.TerminalBar(100, 0, 16, terminal, clock=clock)
  try:
    yield bar, terminal, clock
  finally:
    bar.close()
  assert sys.stderr is stderr


def _visible_lines(output: str) -> list[str]:
  """The lines a terminal shows: each line's text after its last erase (a redrawn bar shows once)."""
  return [line.split(progress.CLEAR)[-1] for line in output.split('\n')]


def test_the_bar_shows_speed_eta_and_the_latest_host_metrics():
  with _terminal_bar() as (bar, _, clock):
    bar.advance(1)  # The first step's end: its compile is not part of the speed.
    clock.now += 1.0
    bar.advance(11)  # 10 steps/s, 16 images a step.
    bar.show({'train_loss': 2.3456789, 'grad_norm': 1.0})
    bar.show({'eval_top1': 0.5, 'eval_loss': 1.0})
    text = bar.text(200)
    assert text.startswith('step 11/100 [##')
    assert ' 11% | 160 img/s | ETA 0:09 | loss 2.3457 | eval top-1 50.00%' in text, text
    assert 'grad_norm' not in text and 'eval_loss' not in text
    narrow = bar.text(40)
    assert len(narrow) <= 40 and narrow.startswith('step 11/100 ') and '#' not in narrow


def test_a_log_line_erases_the_bar_and_the_bar_comes_back_below_it():
  with _terminal_bar() as (bar, terminal, clock):
    bar.advance(3)
    print('I1124 a log line', file=sys.stderr)  # Two writes: the text, then the newline.
    clock.now += 1.0
    bar.advance(5)
    output = terminal.getvalue()
    assert output.startswith(f'{progress.CLEAR}step 0/100 ')  # Up while the first step compiles.
    # Erased for the line, drawn again under it once the line is complete, then at the next step.
    assert f'{progress.CLEAR}I1124 a log line\n{progress.CLEAR}step 3/100 ' in output
    assert _visible_lines(output)[0] == 'I1124 a log line'
    assert _visible_lines(output)[1].startswith('step 5/100 ')


def test_the_bar_redraws_at_most_ten_times_a_second():
  with _terminal_bar() as (bar, terminal, clock):
    for step in range(1, 1001):  # A thousand fast steps in 0.5 s.
      clock.now += 0.0005
      bar.advance(step)
    draws = terminal.getvalue().count(progress.CLEAR)
    assert 5 <= draws <= 7, draws  # The first draw, then one per 0.1 s.


def test_close_leaves_the_last_bar_on_its_line_and_gives_stderr_back():
  terminal, stderr = _Terminal(), sys.stderr
  bar = progress.TerminalBar(12, 0, 16, terminal)
  assert sys.stderr is not stderr
  bar.advance(12)
  bar.close()
  assert sys.stderr is stderr
  assert terminal.getvalue().endswith('\n') and _visible_lines(terminal.getvalue())[-2].startswith(
      'step 12/12 [########################] 100% | '
  )


def test_only_process_0_of_an_interactive_run_gets_a_bar(monkeypatch):
  monkeypatch.setenv('TERM', 'xterm')
  monkeypatch.setattr(sys, 'stderr', io.StringIO())  # Not a terminal: a pipe, a file, a SLURM log.
  assert type(progress.for_run(12, 0, 16, 0)) is progress.Bar
  monkeypatch.setattr(sys, 'stderr', _Terminal())
  assert type(progress.for_run(12, 0, 16, 1)) is progress.Bar
  bar = progress.for_run(12, 0, 16, 0)
  assert isinstance(bar, progress.TerminalBar)
  bar.close()


def _tiny_run_args(data_dir: str, workdir: str) -> list[str]:
  return helpers.main_args('configs/demo.py', workdir, {**helpers.TINY, 'data_dir': data_dir})


def _run_in_terminal(args: list[str], timeout: float = 300) -> tuple[int, str]:
  """Runs `args` with stdout and stderr on a pseudo-terminal; (status, everything it wrote)."""
  master, slave = pty.openpty()
  tty.setraw(slave)  # No '\n' -> '\r\n': the test reads exactly what the process wrote.
  fcntl.ioctl(
      slave, termios.TIOCSWINSZ, struct.pack('HHHH', 40, 160, 0, 0)
  )  # 40 rows, 160 columns.
  process = subprocess.Popen(
      args, cwd=helpers.REPO, env=_USER_ENV, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave
  )
  os.close(slave)
  chunks, deadline = [], time.time() + timeout
  try:
    while time.time() < deadline:
      if not select.select([master], [], [], 1.0)[0]:
        continue
      try:
        chunk = os.read(master, 65536)
      except OSError:  # EIO: the process and its children have closed the terminal.
        break
      if not chunk:
        break
      chunks.append(chunk)
    else:
      process.kill()
  finally:
    os.close(master)
  return process.wait(timeout=60), b''.join(chunks).decode('utf-8', errors='replace')


def test_an_interactive_run_shows_a_bar_below_intact_metric_lines(data_dir, tmp_path):
  status, output = _run_in_terminal(_tiny_run_args(data_dir, str(tmp_path / 'run')))
  assert status == 0, output[-3000:]
  assert output.count(progress.CLEAR) >= 5  # Redrawn in place, under each log line.
  lines = _visible_lines(output)
  train = [line for line in lines if 'train_loss=' in line]
  assert len(train) == 3, train  # Steps 4, 8 and 12, each whole on its own line:
  for line in train:
    assert re.match(
        _LOG_LINE + r'\[(4|8|12)\] grad_norm=[\d.e-]+, images_per_sec=[\d.e+-]+, '
        r'learning_rate=[\d.e-]+, train_loss=[\d.]+$',
        line,
    ), repr(line)
  evals = [line for line in lines if 'eval_top1=' in line]
  assert len(evals) == 2 and re.match(_LOG_LINE + r'\[12\] eval_loss=', evals[0]), evals
  assert re.match(_LOG_LINE + 'Final eval: ', evals[1]), evals
  bars = [line for line in lines if line.startswith('step ')]
  final = bars[-1]
  assert (
      final.startswith('step 12/12 [')
      and ' 100% | ' in final
      and ' img/s | ETA 0:00 | loss ' in final
  )
  top1 = float(re.search(r'eval_top1=([\d.]+)', evals[0]).group(1))
  assert final.endswith(f' | eval top-1 {top1:.2%}'), final
  assert lines.index(final) < lines.index(evals[1])  # The last bar stays, above what follows.
  assert not any(re.match(_LOG_LINE, line) and re.search(r'step \d+/12', line) for line in lines)


def test_a_run_without_a_terminal_prints_plain_lines(data_dir, tmp_path):
  run = subprocess.run(
      _tiny_run_args(data_dir, str(tmp_path / 'run')),
      cwd=helpers.REPO,
      env=_USER_ENV,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  output = run.stdout + run.stderr
  assert '\r' not in output and _ESCAPE not in output
  assert not re.search(r'step \d+/12', output)
  lines = run.stderr.splitlines()
  assert (
      len(
          [line for line in lines if re.match(_LOG_LINE + r'\[\d+\] grad_norm=.*train_loss=', line)]
      )
      == 3
  )
  assert (
      len([line for line in lines if re.match(_LOG_LINE + r'Progress: [\d.]+ steps/s, ', line)])
      == 3
  )
  assert re.match(_LOG_LINE + 'Final eval: ', lines[-1]), lines[-1]


def test_export_prints_its_one_line_only(trained_tiny_run, tmp_path):
  out = str(tmp_path / 'out')
  run = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.tools.export',
          f'--workdir={trained_tiny_run}',
          f'--out={out}',
      ],
      cwd=helpers.REPO,
      env=_USER_ENV,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stdout[-3000:]
  # Not orbax's INFO lines on reading the checkpoint, nor jax's, nor TensorFlow's C++ banners.
  assert run.stdout.splitlines() == [
      f'exported step 12 (raw parameters) of {trained_tiny_run} to {out}'
  ]


@pytest.mark.parametrize('source', ['workdir', 'export'])
def test_predict_prints_its_own_lines_only(trained_tiny_run, exported_tiny_run, tmp_path, source):
  image = np.random.RandomState(0).randint(0, 256, (8, 8, 3), np.uint8)
  Image.fromarray(image).save(tmp_path / 'a.png')
  (tmp_path / 'bad.png').write_text('not an image')  # TensorFlow's decoder warns in C++ about it.
  flag = f'--workdir={trained_tiny_run}' if source == 'workdir' else f'--export={exported_tiny_run}'
  run = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.tools.predict',
          flag,
          '--top_k=2',
          str(tmp_path / 'a.png'),
          str(tmp_path / 'bad.png'),
      ],
      cwd=helpers.REPO,
      env=_USER_ENV,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  lines = run.stdout.splitlines()
  assert lines[0] == str(tmp_path / 'a.png') and len(lines) == 3, run.stdout
  assert all(re.fullmatch(r'  [01]\.\d{4}  \d', line) for line in lines[1:]), lines
  # Not TensorFlow's 'W0000 ... local_rendezvous.cc ...' warning for bad.png, nor absl's note on it.
  assert run.stderr.splitlines() == [
      f'skipped: cannot decode {tmp_path}/bad.png: not an image format PIL reads'
  ]
