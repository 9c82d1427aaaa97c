"""The test suite: python test_mixer.py   (the last line reads 'N passed, M failed, K skipped').

Runs every tests/test_*.py module, one file a subject: test_model (causality,
incremental decoding, each variant's definition), test_train, test_sample,
test_compile, test_prepare, test_retrieval, test_scale, the experiments'
(test_claims, test_icl, test_mqar, test_represent, test_bench) and test_docs. Tests assert
the properties themselves: a future token changes no earlier logit, cached
generation equals the full forward, loss on real TinyStories text drops,
resuming equals not stopping.

Real text comes from $TINYSTORIES_DIR (train.txt, valid.txt), by default
../shared/data/tinystories; a test that needs it is skipped with a reason if it is
absent, and with CI=true in the environment such a skip counts as a failure.

    python test_mixer.py                  # everything
    python test_mixer.py test_model       # some modules of tests/ (names, with or without .py)
"""

import importlib
import os
import sys
import time
import unittest

from tests.common import NO_TEXT, ROOT

TESTS = os.path.join(ROOT, 'tests')


def module_names():
    """Names of every tests/test_*.py module, sorted."""
    return sorted(f[:-3] for f in os.listdir(TESTS) if f.startswith('test_') and f.endswith('.py'))


def test_modules(names=None):
    """The test modules `names` (default: all of tests/), imported -> list of modules.
    Raises ValueError naming an unknown module."""
    known = module_names()
    names = [n.removesuffix('.py').removeprefix('tests/') for n in names] if names else known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f'no test module {", ".join(unknown)} in tests/ (have: {", ".join(known)})')
    return [importlib.import_module(f'tests.{n}') for n in names]


def summarize(result, ci):
    """(exit code, last line 'N passed, M failed, K skipped') of a unittest result.
    With ci=True a test skipped for missing real text (reason NO_TEXT) counts as failed:
    CI cannot pass by skipping."""
    data_skips = [t for t, reason in result.skipped if reason.startswith(NO_TEXT.split(':')[0])] if ci else []
    for t in data_skips:
        print(f'FAIL (CI=true, skipped for missing data): {t.id()}')
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses) + len(data_skips)
    skipped = len(result.skipped) - len(data_skips)
    passed = result.testsRun - len(result.failures) - len(result.errors) - len(result.unexpectedSuccesses) \
        - len(result.skipped)
    return (1 if failed else 0), f'{passed} passed, {failed} failed, {skipped} skipped'


class TimedResult(unittest.TextTestResult):
    """A unittest result that also records wall-clock seconds in .seconds {name: s}: each test's
    (its id), and the time between two classes' tests (the next class's setUpClass and the last
    one's tearDownClass) as 'module.Class (class setup)'."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds, self._stop, self._cls = {}, time.perf_counter(), None

    def startTest(self, test):
        self._t0 = time.perf_counter()
        if type(test) is not self._cls:
            self._cls = type(test)
            self.seconds[f'{self._cls.__module__}.{self._cls.__name__} (class setup)'] = self._t0 - self._stop
        super().startTest(test)

    def stopTest(self, test):
        self._stop = time.perf_counter()
        self.seconds[test.id()] = self._stop - self._t0
        super().stopTest(test)


def slowest(seconds, n=10):
    """Lines naming the n slowest tests of {test id: seconds}, slowest first, and their share."""
    total = sum(seconds.values()) or 1.0
    top = sorted(seconds.items(), key=lambda kv: -kv[1])[:n]
    return [f'slowest {len(top)} tests ({sum(s for _, s in top) / total:.0%} of {total:.0f} s):'] + \
        [f'  {s:6.1f} s  {name}' for name, s in top]


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
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(Fake)
        result = unittest.TextTestRunner(stream=open(os.devnull, 'w')).run(suite)
        result.stream.stream.close()
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()) as out:
            self.assertEqual(summarize(result, ci=False), (0, '1 passed, 0 failed, 2 skipped'))
            self.assertEqual(summarize(result, ci=True), (1, '1 passed, 1 failed, 1 skipped'))
        self.assertIn('test_needs_text', out.getvalue())

    def test_names_the_slowest_tests(self):
        lines = slowest({'a': 1.0, 'b': 3.0, 'c': 6.0}, n=2)
        self.assertEqual(lines[0], 'slowest 2 tests (90% of 10 s):')
        self.assertEqual([x.split()[-1] for x in lines[1:]], ['c', 'b'])

    def test_class_setup_time_is_counted(self):
        class Slow(unittest.TestCase):
            @classmethod
            def setUpClass(cls):
                time.sleep(0.2)

            def test_a(self):
                pass
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(Slow)
        with open(os.devnull, 'w') as devnull:
            result = unittest.TextTestRunner(stream=devnull, resultclass=TimedResult).run(suite)
        self.assertGreaterEqual(result.seconds[f'{__name__}.Slow (class setup)'], 0.2)
        self.assertLess(result.seconds[next(k for k in result.seconds if k.endswith('test_a'))], 0.2)


def main(argv):
    """Run the modules named in argv (default all) and this file's own tests -> exit code."""
    if any(a.startswith('-') for a in argv):
        print(f'test_mixer.py: error: unknown option {next(a for a in argv if a.startswith("-"))!r}; '
              'usage: python test_mixer.py [test_module ...]', file=sys.stderr)
        return 2
    try:
        modules = test_modules(argv)
    except ValueError as e:
        print(f'test_mixer.py: error: {e}', file=sys.stderr)
        return 2
    loader = unittest.defaultTestLoader
    suite = unittest.TestSuite([loader.loadTestsFromModule(m) for m in modules])
    if not argv:
        suite.addTests(loader.loadTestsFromTestCase(TestRunner))
    result = unittest.TextTestRunner(verbosity=2, resultclass=TimedResult).run(suite)
    print('\n'.join(slowest(result.seconds)))
    code, line = summarize(result, ci=os.environ.get('CI', '').lower() == 'true')
    print(line)
    return code


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
