"""launch/console.py: a local multi-process run's output shows each message once."""

import sys

import console as console_lib

# What each process of a local run prints: the same config warning and error on stderr (absl's
# prefix differs in time and thread), gloo's connection line on stdout, and something of its own.
_PROCESS = r"""
import sys, time
index = int(sys.argv[1])
time.sleep(0.3 * (1 - index))  # Process 1 speaks first: its copy of a message waits for process 0's.
print(f'[Gloo] Rank {index} is connected to 1 peer ranks. Expected number of connected peer ranks is : 1', flush=True)
print(f'W1127 20:00:0{index}.1 14038695{index} setup.py:191] warmup past the end', file=sys.stderr, flush=True)
print(f'own line of process {index}', flush=True)
print('error: Unknown model variant', file=sys.stderr, flush=True)
"""


def test_each_message_shows_once_and_another_processs_own_lines_are_marked(capsys):
  console = console_lib.Console()
  procs = [console.popen(index, [sys.executable, '-c', _PROCESS, str(index)]) for index in range(2)]
  for p in procs:
    p.wait(timeout=60)
  console.close()
  out, err = capsys.readouterr()
  assert out.splitlines() == ['own line of process 0', '[process 1] own line of process 1']
  assert err.splitlines() == [
      'W1127 20:00:00.1 140386950 setup.py:191] warmup past the end',
      'error: Unknown model variant',
  ]


def test_a_message_is_what_a_line_says_without_absls_time_and_thread_or_the_terminals_codes():
  assert console_lib.message('W1127 20:00:23.921209 140386958190400 setup.py:191] lr high\n') == (
      'setup.py:191] lr high'
  )
  assert console_lib.message('\r\x1b[K[12] loss=1\r\n') == '[12] loss=1'
  assert console_lib.message('error: x\n') == 'error: x'
