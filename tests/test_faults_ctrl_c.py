"""Ctrl-C at any moment of a command that runs a pool or a thread: one line, exit 130, no traceback, not even
from Python's exit (a pool's thread, an atexit hook), and no process left (issue #81):
python test_mixer.py test_faults_ctrl_c

    TestPool      the experiments' pool (experiments/runner.py, under claims, icl and mqar): a Ctrl-C held
                  while a pool process starts, not lost; SIGINT at 13
                  moments of tests/pool_command.py's calibration, runs and report, and during claims' own
                  calibration, each under tests.faults.EXIT_RACE (a pool left stopping at exit trips
                  concurrent.futures' exit hook every time, not by luck)
"""

import os
import shutil
import signal
import subprocess
import tempfile
import unittest
from concurrent.futures import ThreadPoolExecutor

from tests.common import prepared_data
from tests.faults import ENV, LINUX, PROGRESS, assert_interrupted, exit_race, interrupt, interrupt_pool, write

# (the stderr line a signal waits for, seconds after it) of tests/pool_command.py: its workers starting, busy,
# a job ending, the next phase submitting, the pool closing, the report after it
POOL_MOMENTS = [('calibration: 4 runs', s) for s in (0.0, 0.02, 0.1, 0.25, 0.5)] + \
               [('[1/4] calibration', s) for s in (0.0, 0.1)] + \
               [('runs: 6 runs', s) for s in (0.0, 0.15, 0.4)] + \
               [('[6/6] runs', 0.0), ('[5/6] runs', 0.1), ('report: writing', 0.0)]
POOL_LINES = PROGRESS + (r'^\w+: (starting|writing)$', r'^done$')      # tests/pool_command.py's own


@unittest.skipUnless(LINUX, 'reads /proc')
class TestPool(unittest.TestCase):
    """Runner.stop and Runner.close leave nothing running for concurrent.futures' exit hook, and Runner.submit
    loses no Ctrl-C."""

    def test_a_ctrl_c_while_a_pool_process_starts_is_held_not_lost(self):
        """pool.held_interrupt (Runner.submit's): a SIGINT inside the block raises KeyboardInterrupt when it
        ends, not before, and a process started inside starts with SIGINT blocked (its start-up is no traceback;
        its pool initializer then ignores it)."""
        from experiments.pool import held_interrupt
        self.addCleanup(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler))
        steps = []
        with self.assertRaises(KeyboardInterrupt):
            with held_interrupt():
                os.kill(os.getpid(), signal.SIGINT)
                status = subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout
                steps.append('after the signal')
        self.assertEqual(steps, ['after the signal'])
        blocked = int(next(l for l in status.splitlines() if l.startswith('SigBlk:')).split()[1], 16)
        self.assertTrue(blocked >> (signal.SIGINT - 1) & 1, status)
        self.assertFalse(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []), 'SIGINT left blocked')

    def test_ctrl_c_at_every_moment_of_the_pool(self):
        """SIGINT (once, or twice 50 ms apart as `timeout -s INT` sends it) at each of POOL_MOMENTS of
        tests/pool_command.py, three commands at a time: exit 130, one line, no traceback, no process left.
        Its pool processes import a stand-in torch (the pool's Ctrl-C is under test, not torch: a real import
        costs 1.6 s of CPU a process)."""
        tmp = tempfile.mkdtemp(prefix='mixer_ctrl_c_')
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        stub = os.path.dirname(os.path.dirname(write(os.path.join(tmp, 'stub', 'torch', '__init__.py'),
                                                     'def set_num_threads(n):\n    pass\n')))
        env = {**ENV, 'PYTHONPATH': stub}

        def one(i):
            ready, settle = POOL_MOMENTS[i]
            return interrupt(exit_race('tests.pool_command', os.path.join(tmp, f'out{i}')), ready, settle,
                             sigints=1 + i % 2, env=env)
        with ThreadPoolExecutor(3) as ex:
            got = list(ex.map(one, range(len(POOL_MOMENTS))))
        for (ready, settle), g in zip(POOL_MOMENTS, got):
            with self.subTest(ready=ready, settle=settle):
                assert_interrupted(self, g, ready, POOL_LINES)

    def test_ctrl_c_during_the_claims_pool(self):
        """SIGINT to the group while claims --quick calibrates on its pool (under EXIT_RACE): exit 130 and one
        line after the interrupt (the progress lines before it are claims' own), no traceback from any worker
        or at exit, the runs stopped (not left to finish: a full run's would take minutes) and no process left."""
        out = tempfile.mkdtemp(prefix='mixer_ctrl_c_')
        self.addCleanup(shutil.rmtree, out, ignore_errors=True)
        interrupt_pool(self, exit_race('experiments.claims', '--quick', '--models', 'flat', '--data_dir', prepared_data(),
                                       '--out', out), 'runs, about', settle=0.2)     # settle: the workers are starting
        finished = [d for d, _, files in os.walk(os.path.join(out, 'calibration')) if 'result.json' in files]
        self.assertEqual(finished, [], 'the pool was left to finish its runs after Ctrl-C, not stopped')


if __name__ == '__main__':
    unittest.main()
