"""The suite's runner itself (test_mixer.py): it finds every module, refuses unknown ones, counts every test
once, CI cannot pass by skipping, --fast skips what starts a Python process or runs past its clock, a
parallel run counts every module and a dead process fails, --repeat counts each test's failures and keeps
its first message, and the times it reports add up.

    python test_mixer.py test_runner
"""

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

import test_mixer

from test_mixer import (EXIT_IN_ENV, FAST_SECONDS, FAST_SLOW, TESTS, TimedResult, Workers, by_module, fast_clock,
                        repeated, run_parallel, run_quietly, slowest, summarize, tally, test_modules)
from tests.common import FAST_SKIP, NO_TEXT, python_processes_forbidden


class TestRunner(unittest.TestCase):
    """The runner itself: it finds every module, refuses unknown ones, and CI cannot pass by skipping."""

    def test_discovers_every_test_module(self):
        names = {m.__name__.split('.')[-1] for m in test_modules()}
        on_disk = {f[:-3] for f in os.listdir(TESTS) if f.startswith('test_') and f.endswith('.py')}
        self.assertEqual(names, on_disk)
        self.assertIn('test_train', names)
        self.assertIn('test_model', names)

    def test_unknown_module_is_refused(self):
        with self.assertRaisesRegex(ValueError, 'no test module test_nope'):
            test_modules(['test_nope'])
        self.assertEqual([m.__name__ for m in test_modules(['test_docs.py'])], ['tests.test_docs'])

    def test_ci_counts_a_data_skip_as_a_failure(self):
        class Fake(unittest.TestCase):
            def test_needs_text(self):
                raise unittest.SkipTest(NO_TEXT)

            def test_other_skip(self):
                raise unittest.SkipTest('needs CUDA')

            def test_passes(self):
                pass
        result = run_quietly(Fake)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            self.assertEqual(summarize(result, ci=False), (0, '1 passed, 0 failed, 2 skipped (of 3 tests)'))
            self.assertEqual(summarize(result, ci=True), (1, '1 passed, 1 failed, 1 skipped (of 3 tests)'))
        self.assertIn('test_needs_text', out.getvalue())

    def test_counts_add_up_with_subtests_and_class_setups(self):
        """passed + failed + skipped = tests: a class whose setup skips or fails is one test, a test is one
        whatever its subtests did (the count went negative when skips came from these)."""
        class SkipsInSetup(unittest.TestCase):
            @classmethod
            def setUpClass(cls):
                raise unittest.SkipTest('needs CUDA')

            def test_a(self):
                pass

            def test_b(self):
                pass

        class FailsInSetup(unittest.TestCase):
            @classmethod
            def setUpClass(cls):
                raise RuntimeError('no data')

            def test_c(self):
                pass

        class Subtests(unittest.TestCase):
            def test_skips_three(self):
                for i in range(3):
                    with self.subTest(i=i):
                        self.skipTest('not here')

            def test_fails_two(self):
                for i in range(3):
                    with self.subTest(i=i):
                        self.assertEqual(i, 0)

            def test_passes(self):
                for i in range(3):
                    with self.subTest(i=i):
                        pass
        result = run_quietly(SkipsInSetup, FailsInSetup, Subtests)
        code, line = summarize(result, ci=False)
        self.assertEqual((code, line), (1, '1 passed, 2 failed, 2 skipped (of 5 tests)'))

    def test_fast_skips_a_test_that_starts_python_and_only_that(self):
        from tests.common import run

        class Fake(unittest.TestCase):
            def test_starts_python(self):
                run('-c', 'pass')

            def test_starts_a_pool(self):
                import concurrent.futures
                import multiprocessing
                with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn')) as p:
                    p.submit(int, 1).result()

            def test_starts_another_program(self):
                self.assertEqual(subprocess.run(['true']).returncode, 0)

            def test_a_library_wraps_the_skip(self):          # as inductor does
                try:
                    run('-c', 'pass')
                except Exception as e:
                    raise RuntimeError('wrapped') from e

            def test_fails_by_itself(self):
                self.fail('a real failure')
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(Fake)
        with open(os.devnull, 'w') as devnull, python_processes_forbidden():
            result = unittest.TextTestRunner(stream=devnull, resultclass=TimedResult).run(suite)
        self.assertEqual(sorted((t.id().split('.')[-1], r) for t, r in result.skipped),
                         [('test_a_library_wraps_the_skip', FAST_SKIP), ('test_starts_a_pool', FAST_SKIP),
                          ('test_starts_python', FAST_SKIP)])
        self.assertEqual([t.id().split('.')[-1] for t, _ in result.failures], ['test_fails_by_itself'])
        self.assertEqual((result.testsRun, len(result.errors)), (5, 0))
        self.assertEqual(run('-c', 'print(6 * 7)').stdout, '42\n')        # outside, processes start again
        self.assertIn('(3 of them --fast skips: they start a Python process or take over', summarize(result, ci=True)[1])

    def test_fast_stops_a_slow_test_and_only_that_one(self):
        """--fast's clock: a test still running after FAST_SECONDS is stopped there and counted as --fast's
        skip, also when the code under it turns the stop into another error; a quick test passes, a real
        failure stays a failure, and the clock is off after the run. (Stopped, not let finish: the line after
        the sleep never runs. No wall-clock bound: a loaded machine takes longer to get there.)"""
        finished = []

        class Fake(unittest.TestCase):
            def test_slow(self):
                time.sleep(FAST_SECONDS + 5)
                finished.append('test_slow')

            def test_slow_under_a_broad_except(self):
                try:
                    time.sleep(FAST_SECONDS + 5)
                    finished.append('test_slow_under_a_broad_except')
                except Exception as e:
                    raise RuntimeError('wrapped') from e

            def test_quick(self):
                pass

            def test_fails_by_itself(self):
                self.fail('a real failure')
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(Fake)
        TimedResult.fast = True
        try:
            with open(os.devnull, 'w') as devnull:
                result = unittest.TextTestRunner(stream=devnull, resultclass=TimedResult).run(suite)
        finally:
            TimedResult.fast = False
            fast_clock(0)
        self.assertEqual(finished, [])
        self.assertEqual(sorted((t.id().split('.')[-1], r) for t, r in result.skipped),
                         [('test_slow', FAST_SLOW), ('test_slow_under_a_broad_except', FAST_SLOW)])
        self.assertEqual([t.id().split('.')[-1] for t, _ in result.failures], ['test_fails_by_itself'])
        self.assertEqual(len(result.errors), 0)
        self.assertEqual(signal.getitimer(signal.ITIMER_REAL), (0.0, 0.0))

    def test_names_the_slowest_tests(self):
        lines = slowest({'a': 1.0, 'b': 3.0, 'c': 6.0}, n=2)
        self.assertEqual(lines[0], 'slowest 2 tests (90% of 10 s):')
        self.assertEqual([x.split()[-1] for x in lines[1:]], ['c', 'b'])
        lines = slowest({'a': 1.0, 'b': 3.0, 'c': 6.0}, n=2, cpu={'a': 0.5, 'b': 2.5, 'c': 1.0})
        self.assertEqual(lines, ['slowest 2 tests (90% of 10 s; 4 s of CPU):', '     6.0 s    1.0 s CPU  c',
                                 '     3.0 s    2.5 s CPU  b'])

    def test_sums_the_seconds_a_module(self):
        line = by_module({'tests.test_a.C.test_x': 1.0, 'tests.test_a.C (class setup)': 2.0,
                          'tests.test_b.D.test_y': 4.0, '__main__.TestRunner.test_z': 0.4})
        self.assertEqual(line, 'seconds a module: test_b 4, test_a 3, test_mixer 0')

    def test_parallel_run_counts_every_module_and_a_dead_process_fails(self):
        """Modules on worker processes, each run twice (--repeat 2): a module's tests' outcomes come back under their
        ids; a module that does not import is a failed test; so is one whose worker process dies (here it exits as
        it is given test_nope the first time: TEST_MIXER_EXIT_IN), not a gap, and the run after it gets a new
        worker; each run of a module has a process of its own (its fixtures are cached in the one it ran in, as
        in the suite, where it runs once). quiet: only a run with a failure prints its output. repeated() counts
        each test's failures out of its module's runs, with its first message."""
        with mock.patch.dict(os.environ, {EXIT_IN_ENV: 'test_nope@1'}), \
                contextlib.redirect_stdout(io.StringIO()) as printed:
            out, fast, seconds, cpu, runs = run_parallel(['test_docs', 'test_nope'] * 2, 1, fast=False, quiet=True)
        ids = {t.id() for c in unittest.defaultTestLoader.loadTestsFromModule(test_modules(['test_docs'])[0])
               for t in c}
        self.assertEqual({t for t in out if t.startswith('tests.test_docs.')}, ids)
        self.assertEqual({out[t] for t in ids}, {'passed'})
        self.assertEqual((out['test_nope (its import)'], out['test_nope (its process)']), ('failed', 'failed'))
        self.assertEqual(tally(out, fast)[0], 1)
        self.assertLessEqual(ids, set(seconds))
        self.assertEqual(set(cpu), set(seconds))
        docs = [got for name, got in runs if name == 'test_docs']
        self.assertEqual([set(got['outcomes'].values()) for got in docs], [{'passed'}, {'passed'}])
        self.assertNotEqual(docs[0]['pid'], docs[1]['pid'])
        self.assertEqual(printed.getvalue().count('== test_docs ('), 2)
        self.assertIn('no test module test_nope', printed.getvalue())
        self.assertIn('test_nope: its process ended (exit code 3)', printed.getvalue())
        self.assertNotIn('test_readme_is_short', printed.getvalue())        # test_docs passed: its output not shown
        code, lines = repeated(runs, 2)
        self.assertEqual(code, 1)
        self.assertEqual(lines[0], '  1 of 2  test_nope (its import)')
        self.assertIn('ValueError: no test module test_nope', lines[1])
        self.assertEqual(lines[2:], ['  1 of 2  test_nope (its process)',
                                     '          its process ended (exit code 3) before reporting its tests',
                                     f'--repeat 2: 2 of {len(ids) + 2} tests failed at least once (2 modules, 4 runs)'])

    def test_a_worker_whose_runner_is_gone_ends_without_a_traceback(self):
        """A worker whose runner was killed (SIGTERM, kill -9) finishes its module and finds no one to reply to:
        it ends with exit 0 and writes nothing to stderr (it wrote BrokenPipeError's traceback into the terminal).
        The runner's end of the reply pipe is closed before the worker is given its module."""
        worker = subprocess.Popen([sys.executable, os.path.abspath(test_mixer.__file__), '--worker'],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        worker.stdout.close()
        with tempfile.TemporaryDirectory() as tmp:
            _, err = worker.communicate(f'test_card\t{os.path.join(tmp, "out.txt")}\t1\n', timeout=600)
            self.assertTrue(os.path.exists(os.path.join(tmp, 'out.txt')), 'the module did not run')
        self.assertEqual((worker.returncode, err), (0, ''))

    def test_a_background_start_gives_the_commands_a_ctrl_c(self):
        """Started with SIGINT ignored (nohup, `python test_mixer.py &` in a script), the suite's processes take
        SIGINT as Python does by default: the commands they start inherit an ignored SIGINT through exec, ignore
        the Ctrl-C the tests send them, and those tests fail (test_faults' Ctrl-C during a save ran to its end).
        Read from the worker's /proc status after its module has run."""
        worker = subprocess.Popen([sys.executable, os.path.abspath(test_mixer.__file__), '--worker'],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        try:
            with tempfile.TemporaryDirectory() as tmp:
                worker.stdin.write(f'test_card\t{os.path.join(tmp, "out.txt")}\t1\n')
                worker.stdin.flush()
                self.assertIn('outcomes', worker.stdout.readline())
            with open(f'/proc/{worker.pid}/status') as f:
                ignored = int(next(line for line in f if line.startswith('SigIgn:')).split()[1], 16)
        finally:
            worker.stdin.close()
            worker.wait(timeout=600)
        self.assertFalse(ignored & 1 << (signal.SIGINT - 1), 'SIGINT still ignored')

    def test_repeat_counts_each_test_s_failures_and_keeps_the_first_message(self):
        """repeated(): each test that failed in any run, 'K of N' and its first failure's message, the most failures
        first; exit 1; none failed: only the count line, exit 0. The messages come from TimedResult: a failure's,
        an error's and a failed subtest's first, none for a test that passed or skipped."""
        class Fake(unittest.TestCase):
            def test_fails(self):
                self.assertEqual(1, 2, 'one is not two')

            def test_raises(self):
                raise OSError('disk full')

            def test_subtests(self):
                for i in range(3):
                    with self.subTest(i=i):
                        self.assertEqual(i, 0, f'subtest {i}')

            def test_passes(self):
                pass

            def test_skips(self):
                self.skipTest('needs CUDA')
        messages = run_quietly(Fake).messages
        name = f'{__name__}.{Fake.__qualname__}'
        self.assertEqual(messages, {f'{name}.test_fails': 'AssertionError: 1 != 2 : one is not two',
                                    f'{name}.test_raises': 'OSError: disk full',
                                    f'{name}.test_subtests': 'AssertionError: 1 != 0 : subtest 1'})
        runs = [('m', {'outcomes': {'a': 'passed', 'b': 'failed', 'c': 'skipped'}, 'messages': {'b': 'E: first b'}}),
                ('m', {'outcomes': {'a': 'failed', 'b': 'failed', 'c': 'skipped'},
                       'messages': {'a': 'E: a\nits second line', 'b': 'E: second b'}}),
                ('m', {'outcomes': {'a': 'passed', 'b': 'passed', 'c': 'skipped'}, 'messages': {}})]
        self.assertEqual(repeated(runs, 3), (1, ['  2 of 3  b', '          E: first b', '  1 of 3  a', '          E: a',
                                                 '          its second line',
                                                 '--repeat 3: 2 of 3 tests failed at least once (1 modules, 3 runs)']))
        self.assertEqual(repeated(runs[2:], 1),
                         (0, ['--repeat 1: 0 of 3 tests failed at least once (1 modules, 1 runs)']))

    def test_two_runs_of_one_module_never_overlap(self):
        """--repeat's runs of one module wait for each other (its tests may share a fixture's path), while another
        module takes the free worker: every run of a module starts after its previous one ended. Workers.run stood in
        by a stand-in that records when each run starts and ends (no process)."""
        events, lock = [], threading.Lock()

        def fake_run(self, p, name, run=1):
            with lock:
                events.append(('start', name, run))
            time.sleep(0.1)
            with lock:
                events.append(('end', name, run))
            return None, '', {'outcomes': {f'{name}.t': 'passed'}, 'fast': [], 'seconds': {}, 'cpu': {},
                              'messages': {}, 'module_cpu': None}
        with mock.patch.object(Workers, 'run', fake_run), contextlib.redirect_stdout(io.StringIO()):
            runs = run_parallel(['test_a'] * 3 + ['test_b'] * 2, 2, fast=False, quiet=True)[4]
        self.assertEqual(len(runs), 5)
        for name, n in (('test_a', 3), ('test_b', 2)):
            mine = [(kind, run) for kind, m, run in events if m == name]
            self.assertEqual(mine, [(kind, r) for r in range(1, n + 1) for kind in ('start', 'end')], events)
        self.assertIn(('start', 'test_b', 1), events[:events.index(('end', 'test_a', 1))], 'a worker stood idle')

    def test_class_setup_time_is_counted(self):
        """A class's setup time is its own entry, not its first test's: timed on a clock that only the setup
        moves (a real sleep would make the verdict hang on the machine's load)."""
        now = [100.0]

        class Slow(unittest.TestCase):
            @classmethod
            def setUpClass(cls):
                now[0] += 0.2

            def test_a(self):
                pass
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(Slow)
        with open(os.devnull, 'w') as devnull, mock.patch('time.perf_counter', lambda: now[0]):
            result = unittest.TextTestRunner(stream=devnull, resultclass=TimedResult).run(suite)
        self.assertAlmostEqual(result.seconds[f'{__name__}.Slow (class setup)'], 0.2, places=9)
        self.assertEqual(result.seconds[next(k for k in result.seconds if k.endswith('test_a'))], 0)


if __name__ == '__main__':
    unittest.main()
