"""What python test_mixer.py and tests/conftest.py add to pytest: bad command lines are one line; each test
has one outcome and the last line counts them; CI=true fails a skip for missing data; --fast skips what starts
a Python process, compiles or runs past its clock; a module ends with a line; a dead worker fails its test;
--repeat counts each test's failures in fresh processes; a Ctrl-C stops every process the tests started, in
one line.

    python test_mixer.py test_runner
"""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import unittest
from types import SimpleNamespace
from unittest import mock

import test_mixer
from tests.common import ROOT
from tests.conftest import FAST_SECONDS, InTestProcess
from tests.faults import ENV, LINUX, alive, assert_interrupted, interrupt, session_alive, write

# A module of every kind of outcome, run with CI=true under --fast (TestConftest)
OUTCOMES = '''
import os, subprocess, sys, time, unittest
from tests.common import NO_TEXT


def finished(name):
    with open(os.environ['FINISHED'], 'a') as f:
        f.write(name + '\\n')


class Fake(unittest.TestCase):
    def test_passes(self):
        pass

    def test_fails(self):
        self.assertEqual(1, 2, 'one is not two')

    def test_needs_text(self):
        raise unittest.SkipTest(NO_TEXT)

    def test_needs_cuda(self):
        self.skipTest('needs CUDA')

    def test_fails_two_subtests(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertEqual(i, 0)

    def test_skips_its_subtests(self):
        for i in range(3):
            with self.subTest(i=i):
                self.skipTest('not here')

    def test_starts_python(self):
        subprocess.run([sys.executable, '-c', 'pass'])

    def test_starts_another_program(self):
        subprocess.run(['true'], check=True)

    def test_a_library_wraps_the_skip(self):            # as inductor does
        try:
            subprocess.run([sys.executable, '-c', 'pass'])
        except Exception as e:
            raise RuntimeError('wrapped') from e

    def test_compiles(self):
        import torch
        torch.compile(lambda x: x)

    def test_slow(self):
        time.sleep(60)
        finished('slow')

    def test_slow_under_a_broad_except(self):
        try:
            time.sleep(60)
            finished('slow_under_a_broad_except')
        except Exception as e:
            raise RuntimeError('wrapped') from e

    def test_slow_subtests(self):
        for i in range(60):
            with self.subTest(i=i):
                time.sleep(0.5)
                finished('subtest')


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
'''


def pytest_of(*args, env=None):
    """python -m pytest args... from the repository root with tests/conftest.py as a plugin (for modules
    outside tests/) -> CompletedProcess (text)."""
    return subprocess.run([sys.executable, '-m', 'pytest', '-c', 'pytest.ini', '-p', 'tests.conftest', '-p',
                           'no:cacheprovider', *args], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=600)


def ids_of(module):
    """The test ids of tests/`module`.py -> list (unittest's loader: its TestCase classes' test methods)."""
    suite = unittest.defaultTestLoader.loadTestsFromName(f'tests.{module}')
    return [t.id() for c in suite for t in c]


class TestCommandLine(unittest.TestCase):
    def test_bad_command_lines_are_one_line(self):
        """An unknown option or module, a --repeat that is not a whole number of runs from 1 to 1000 in ASCII
        digits (int() takes '٣' and '1_0'; 10**20 runs would never end), a flag or a module given twice: one
        line naming it, exit 2, before anything runs."""
        cases = [(['--nonsense'], "unknown option '--nonsense'"), (['test_nope'], 'no test module test_nope'),
                 (['--repeat', '٣'], "not '٣'"), (['--repeat', '1_0'], "not '1_0'"),
                 (['--repeat', '1' + '0' * 20], 'from 1 to 1000'), (['--repeat', '1001'], 'from 1 to 1000'),
                 (['--repeat', '0'], 'from 1 to 1000'), (['--repeat=-3'], "not '-3'"),
                 (['--repeat'], "not ''"), (['--repeat', ' 2'], "not ' 2'"),
                 (['--fast', 'test_docs', '--fast'], '--fast given twice'),
                 (['--repeat', '2', '--repeat=3'], '--repeat=3 given twice'),
                 (['test_docs', 'tests/test_docs.py'], 'tests/test_docs.py given twice')]
        taken = mock.patch.object(test_mixer, 'run_command', side_effect=AssertionError('taken: it ran'))
        for argv, want in cases:
            with self.subTest(argv=argv), contextlib.redirect_stderr(io.StringIO()) as err, taken:
                with self.assertRaises(SystemExit) as stop:
                    test_mixer.main(argv)
                self.assertEqual(stop.exception.code, 2)
                self.assertEqual(len(err.getvalue().splitlines()), 1, err.getvalue())
                self.assertIn(want, err.getvalue())
                self.assertTrue(err.getvalue().startswith('test_mixer.py: error: '), err.getvalue())

    def test_the_slowest_modules_come_first(self):
        """Sorted by MODULE_SECONDS (a module not listed counts 60 s), each module's tests in their order."""
        ids = ['tests/test_docs.py::A::x', 'tests/test_compile.py::B::y', 'other/test_new.py::z',
               'tests/test_docs.py::A::w', 'tests/test_compile.py::B::v']
        items = [SimpleNamespace(nodeid=i) for i in ids]
        InTestProcess(fast=False).pytest_collection_modifyitems(items)
        self.assertEqual([i.nodeid for i in items], [ids[1], ids[4], ids[2], ids[0], ids[3]])


@unittest.skipUnless(LINUX, 'reads /proc')
class TestConftest(unittest.TestCase):
    def test_outcomes_ci_fast_module_lines_and_a_dead_worker(self):
        """OUTCOMES and two more modules (one that does not import; one whose worker dies in its first test)
        on one pytest-xdist worker with CI=true and --fast: each test one outcome (a subtest or its class's
        setup decides it), a skip for missing data failed, a test that starts a Python process, compiles or
        runs past FAST_SECONDS (stopped there, not let finish, also under a broad except and in its subtests)
        skipped, a real failure kept with its first message, the test whose worker died failed and the next
        one run by a new worker, a line a module, and the counts on the last line; exit 1."""
        with tempfile.TemporaryDirectory() as tmp:
            write(os.path.join(tmp, 'test_outcomes.py'), OUTCOMES)
            write(os.path.join(tmp, 'test_dies.py'), 'import os\n\n\ndef test_dies():\n    os._exit(3)\n\n\n'
                  'def test_after():\n    pass\n')
            write(os.path.join(tmp, 'test_broken.py'), "raise ImportError('broken')\n")
            finished = os.path.join(tmp, 'finished')
            r = pytest_of(tmp, '-n', '1', '--fast', '--outcomes', os.path.join(tmp, 'out.json'),
                          '--continue-on-collection-errors', '--rootdir', tmp,
                          env={**ENV, 'CI': 'true', 'FINISHED': finished, 'TEST_MIXER_FIXTURES': tmp})
            with open(os.path.join(tmp, 'out.json')) as f:
                got = json.load(f)
            done = open(finished).read().split() if os.path.exists(finished) else []
        out = {t.split('::', 1)[-1]: o for t, o in got['outcomes'].items()}
        messages = {t.split('::', 1)[-1]: m for t, m in got['messages'].items()}
        want = {'Fake::test_passes': 'passed', 'Fake::test_fails': 'failed',
                'Fake::test_needs_text': 'failed', 'Fake::test_needs_cuda': 'skipped',
                'Fake::test_fails_two_subtests': 'failed', 'Fake::test_skips_its_subtests': 'skipped',
                'Fake::test_starts_python': 'skipped', 'Fake::test_starts_another_program': 'passed',
                'Fake::test_a_library_wraps_the_skip': 'skipped', 'Fake::test_compiles': 'skipped',
                'Fake::test_slow': 'skipped',
                'Fake::test_slow_under_a_broad_except': 'skipped', 'Fake::test_slow_subtests': 'skipped',
                'SkipsInSetup::test_a': 'skipped', 'SkipsInSetup::test_b': 'skipped',
                'FailsInSetup::test_c': 'failed', 'test_dies': 'failed', 'test_after': 'passed',
                'test_broken.py': 'failed'}
        self.assertEqual(out, want, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertEqual(r.returncode, 1)
        self.assertEqual(messages['Fake::test_fails'], 'AssertionError: 1 != 2 : one is not two')
        self.assertIn('CI=true', messages['Fake::test_needs_text'])
        self.assertIn('crashed', messages['test_dies'])
        self.assertIn('broken', messages['test_broken.py'])
        self.assertLessEqual(done.count('subtest'), 2 * FAST_SECONDS, 'the subtests went on past the clock')
        self.assertEqual([d for d in done if d != 'subtest'], [], 'a slow test ran to its end')
        lines = r.stdout.splitlines()
        self.assertEqual(lines[-1], '3 passed, 6 failed, 10 skipped (6 of them --fast skips: they start a '
                                    f'Python process or take over {FAST_SECONDS} s) (of 19 tests)')
        module_lines = [line for line in lines if line.startswith('== test_')]
        self.assertEqual(len(module_lines), 2, r.stdout[-3000:])
        self.assertRegex(module_lines[-1], r'^== test_\w+ \(2 of 2 modules\): .*; \d+ s so far, about 0 s to '
                                           'go$')
        self.assertIn('== test_dies (', r.stdout)
        self.assertIn('1 passed, 1 failed, 0 skipped (of 2 tests)', r.stdout)


@unittest.skipUnless(LINUX, 'reads /proc')
class TestCommand(unittest.TestCase):
    """python test_mixer.py as a process, a module of the test's own added through PYTEST_ADDOPTS."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix='mixer_runner_')
        self.addCleanup(__import__('shutil').rmtree, self.tmp, ignore_errors=True)

    def test_repeat_counts_failures_over_fresh_processes_with_ctrl_c_at_its_default(self):
        """--repeat 2 of test_docs and a module whose one test fails in its first run only and another that
        reads its process's signal mask, the command started with SIGINT ignored (nohup, a script's `&`): each
        run in a process of its own, the failed run's output printed, the other's not, then '1 of 2' and the
        first message, a count, exit 1; and the tests' processes take SIGINT at Python's default (inherited
        ignored, the commands the Ctrl-C tests start would ignore it)."""
        write(os.path.join(self.tmp, 'test_flaky.py'), textwrap.dedent(f'''
            import os

            def test_flaky():
                with open({self.tmp!r} + '/runs', 'a') as f:
                    f.write(f'{{os.getpid()}}\\n')
                assert len(open({self.tmp!r} + '/runs').read().split()) > 1, 'fails in its first run'

            def test_sigint_at_its_default():
                with open('/proc/self/status') as f:
                    ignored = int(next(l for l in f if l.startswith('SigIgn:')).split()[1], 16)
                assert not ignored & 2, 'SIGINT ignored'
            '''))
        r = subprocess.run([sys.executable, 'test_mixer.py', '--repeat', '2', 'test_docs'], cwd=ROOT,
                           text=True, capture_output=True, timeout=600,
                           env={**ENV, 'PYTEST_ADDOPTS': self.tmp},
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        lines = r.stdout.splitlines()
        self.assertEqual(r.returncode, 1, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertEqual(len(set(open(os.path.join(self.tmp, 'runs')).read().split())), 2)
        self.assertEqual(r.stdout.count('FAILED'), 1, r.stdout[-3000:])
        n = len(ids_of('test_docs')) + 2
        self.assertEqual([line for line in lines if line.startswith('--repeat: run')],
                         [f'--repeat: run 1 of 2: 1 of {n} failed', f'--repeat: run 2 of 2: 0 of {n} failed'])
        first = next(i for i, line in enumerate(lines) if line.startswith('  1 of 2  '))
        self.assertRegex(lines[first], r'^  1 of 2  .*test_flaky\.py::test_flaky$')
        self.assertEqual(lines[first + 1], '          AssertionError: fails in its first run')
        self.assertEqual(lines[-1], f'--repeat 2: 1 of {n} tests failed at least once (2 runs)')

    def test_ctrl_c_stops_every_process_the_tests_started(self):
        """SIGINT to the command's group, as a terminal's Ctrl-C: while its two workers import torch (a normal
        run of two modules), and during --repeat's first run while a test's process runs in a session of its
        own (as the fault tests start torchrun): exit 130, one line, no traceback (a worker importing torch
        printed KeyboardInterrupt's), no process of its session left, nor the test's own (they outlived the
        runner by 15 to 19 s); the signal reached the command only (pytest runs in a process group of its
        own), which stopped the rest."""
        pid_file = os.path.join(self.tmp, 'pid')
        write(os.path.join(self.tmp, 'test_sleeper.py'), textwrap.dedent(f'''
            import signal, subprocess, sys, time

            def test_sleeps():
                signal.signal(signal.SIGINT, lambda *a: open({pid_file!r} + '.sigint', 'w').close())
                p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],
                                     start_new_session=True)
                with open({pid_file!r}, 'w') as f:
                    f.write(str(p.pid))
                time.sleep(600)
            '''))

        def workers_started(p, lines):          # the command, pytest and a worker
            return len(session_alive(p.pid)) >= 3
        moments = [(['test_card', 'test_docs'], {}, workers_started, 0.3),
                   (['--repeat', '2', 'test_docs'], {'PYTEST_ADDOPTS': self.tmp},
                    lambda p, lines: os.path.exists(pid_file), 0.0)]
        for argv, env, ready, settle in moments:
            with self.subTest(argv=argv):
                env = {**ENV, 'TEST_MIXER_FIXTURES': self.tmp, **env}      # no shared fixtures: made sooner
                got = interrupt(['test_mixer.py', *argv], ready, settle, env=env)
                assert_interrupted(self, got, ready, allow=())
                self.assertIn('every test process stopped', ''.join(got.lines))
        self.assertFalse(alive(int(open(pid_file).read())), "the test's process outlived the command")
        self.assertFalse(os.path.exists(pid_file + '.sigint'), 'the Ctrl-C reached the tests too')


if __name__ == '__main__':
    unittest.main()
