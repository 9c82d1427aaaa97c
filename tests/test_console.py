"""The console's lines after a Ctrl-C (issue 90): the interrupt's line, and an error's, start on a line of
their own, whatever was printed before them (harness/cli.py own_line, experiments/runner.py say).

    python test_mixer.py test_console

How they can be glued: under PYTHONUNBUFFERED (as here) print() writes its text and its newline in two writes; a
progress line's newline that waits on a full pipe (a reader that lags on a loaded machine) is cut off by the
Ctrl-C (the write fails with EINTR, the handler raises), and the interrupt's line followed the text at once. A
command may also leave a line partial on purpose: a progress counter on stdout or stderr without its newline.
"""

import contextlib
import io
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

from experiments import runner
from harness import cli
from tests.common import ROOT

PROGRESS = '  [{}/6] runs/r0-0123456789: ok, slept 0.3 s; 1 s so far, about 1 s left in this phase'

# A command that prints progress lines (runner.say) as fast as it can; with BEGIN, begin() started it first
LOOP = """
import sys
from harness import cli
if {begin}:
    cli.begin('glue.py')
from experiments.runner import say
def main():
    i = 0
    while True:
        say({line!r}.format(i))
        i += 1
sys.exit(cli.run_command('glue.py', main))
"""

# A command that leaves a line partial on `stream` (begin() started it), makes the file `ready`, then waits
PARTIAL = """
import sys, time
from harness import cli
cli.begin('glue.py')
def main():
    getattr(sys, {stream!r}).write({text!r})
    getattr(sys, {stream!r}).flush()
    open({ready!r}, 'w').close()
    time.sleep(60)
sys.exit(cli.run_command('glue.py', main))
"""


def python(code, **kw):
    """Start `python -c code` from the repository root, stdout and stderr piped (bytes: a '\\r' is kept),
    unbuffered as this machine's and the suite's environment is (PYTHONUNBUFFERED=1) -> Popen."""
    return subprocess.Popen([sys.executable, '-c', code], cwd=ROOT,
                            stdout=kw.pop('stdout', subprocess.PIPE),
                            stderr=kw.pop('stderr', subprocess.PIPE),
                            env={**os.environ, 'PYTHONUNBUFFERED': '1', 'OMP_NUM_THREADS': '1'}, **kw)


class Recorder(io.StringIO):
    """A stream that keeps each write it is given, in order (writes)."""

    def __init__(self):
        super().__init__()
        self.writes = []

    def write(self, text):
        self.writes.append(text)
        return super().write(text)


class TestOwnLine(unittest.TestCase):

    def test_say_writes_its_line_in_one_write(self):
        """runner.say: the text and its newline in one write (print wrote them in two)."""
        err = Recorder()
        with contextlib.redirect_stderr(err):
            runner.say('  [1/6] runs/r0: ok')
        self.assertEqual(err.writes, ['  [1/6] runs/r0: ok\n'])

    def test_ctrl_c_while_progress_lines_wait_on_a_full_pipe(self):
        """Progress lines (runner.say) written as fast as the command can, its stderr a pipe nobody reads for
        a moment (full: the next write waits), then SIGINT, five times, with and without begin(): every line
        read is a whole progress line or the interrupt's own line, which comes last (glued to a progress line
        36 times in 40 before the fix)."""
        interrupt = 'glue.py: interrupted (Ctrl-C)'
        whole = re.compile(re.escape(PROGRESS).replace(r'\{\}', r'\d+') + '$')
        for begin in (False, True):
            for trial in range(5):
                with self.subTest(begin=begin, trial=trial):
                    p = python(LOOP.format(begin=begin, line=PROGRESS), stdout=subprocess.DEVNULL)
                    select.select([p.stderr], [], [], 120)      # its first line (not read: the pipe fills)
                    time.sleep(0.3)                               # full: the loop waits in a write
                    p.send_signal(signal.SIGINT)
                    err = p.communicate(timeout=120)[1].decode()
                    self.assertEqual(p.returncode, 130, err[-2000:])
                    lines = err.split('\n')[:-1]
                    self.assertEqual(lines[-1], interrupt)
                    self.assertEqual([l for l in lines[:-1] if not whole.match(l)], [])

    def test_a_partial_line_is_ended_before_the_interrupt_line(self):
        """A line left partial on stdout ('progress 40%', no newline) or on stderr ('\\rdone 3/10'), stdout
        and stderr in one pipe as on a terminal: after SIGINT the interrupt's line is a line of its own."""
        for stream, text in (('stdout', 'progress 40%'), ('stderr', '\rdone 3/10')):
            with self.subTest(stream), tempfile.TemporaryDirectory() as tmp:
                ready = os.path.join(tmp, 'ready')
                p = python(PARTIAL.format(stream=stream, text=text, ready=ready), stderr=subprocess.STDOUT)
                deadline = time.time() + 120
                while not os.path.exists(ready) and p.poll() is None and time.time() < deadline:
                    time.sleep(0.02)
                p.send_signal(signal.SIGINT)
                out = p.communicate(timeout=120)[0].decode()
                self.assertEqual(p.returncode, 130, out)
                self.assertEqual(out, f'{text}\nglue.py: interrupted (Ctrl-C)\n')

    def test_an_error_after_a_partial_line(self):
        """cli.fail after a partial line on stdout (begin()'s stream): the error line is a line of its own."""
        out = io.StringIO()
        stdout = cli._Stream(out, 'glue.py', keep=True)
        with mock.patch.object(sys, 'stdout', stdout), contextlib.redirect_stderr(io.StringIO()) as err:
            sys.stdout.write('downloading: 3.1 MB')
            with self.assertRaises(SystemExit):
                cli.fail('no network', 'glue.py')
        self.assertEqual((out.getvalue(), err.getvalue()),
                         ('downloading: 3.1 MB\n', 'glue.py: error: no network\n'))


if __name__ == '__main__':
    unittest.main()
