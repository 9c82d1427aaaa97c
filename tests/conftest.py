"""What the suite adds to pytest (`pytest` from the repository root, or `python test_mixer.py` around it).

    one outcome a test      passed, failed (it, a subtest or its class's setup failed) or skipped; the
                            last line 'N passed, M failed, K skipped (of T tests)'; a module that does not
                            import is one failed test
    a line a module         '== test_x (k of n modules): its counts; s so far, about s to go' as it ends
    the slowest first       modules sorted by MODULE_SECONDS, so that no long module starts last under
                            pytest-xdist (`-n 2 --dist loadfile` keeps a module's tests on one process)
    shared fixtures         under pytest-xdist, tests.common's prepared data and tiny checkpoint made once,
                            here, before the workers start (tests.common.shared_fixtures)
    CI=true                 a test skipped for missing real text (NO_TEXT) fails: CI cannot pass by skipping
    --fast                  the edit loop: a test (or its class's setup) is stopped and skipped the moment
                            it starts a Python process (FAST_SKIP), calls torch.compile, or runs past
                            FAST_SECONDS (FAST_SLOW; never inside an import or torch's compiler, whose
                            half-done state would break the tests after it). No test is marked by hand.
    --outcomes PATH         each test's outcome and first failure's message as JSON (test_mixer.py --repeat)
"""

import contextlib
import json
import os
import signal
import time
import unittest
from collections import Counter

os.environ.setdefault('OMP_NUM_THREADS', '1')   # before torch: one thread a process (why: tests/common.py)

import pytest  # noqa: E402

from tests.common import (FAST_SKIP, NO_TEXT, SHARED_ENV, python_processes_forbidden,  # noqa: E402
                          refused_python_processes, shared_fixtures)

# CPU seconds each module took in the whole suite on the project's 2-core machine (2026-11-28/29, a cold
# inductor cache as on a fresh CI machine: CPU seconds, which a load does not change): the slowest start
# first, so that the wall time comes near the total over the workers (a module not listed counts 60 s).
MODULE_SECONDS = {'test_compile': 138, 'test_gpu_path': 74, 'test_icl': 65, 'test_faults': 55,
                  'test_train': 55, 'test_bench': 51, 'test_retrieval': 50, 'test_claims': 35,
                  'test_model': 33, 'test_scale': 30, 'test_mqar': 28, 'test_faults_outputs': 27,
                  'test_faults_experiments': 21, 'test_faults_ctrl_c': 19, 'test_runner': 15, 'test_watch': 8,
                  'test_eval_tasks': 7, 'test_represent': 6, 'test_corpus': 6, 'test_corpus_inputs': 6,
                  'test_faults_edges': 5, 'test_look': 4, 'test_prepare': 3, 'test_sample': 2, 'test_card': 1,
                  'test_convert': 1, 'test_faults_convert': 1, 'test_docs': 1}
FAST_SECONDS = 1
FAST_SLOW = f'--fast: compiles, or ran past {FAST_SECONDS} s (python test_mixer.py runs it)'
# where --fast's clock never stops a test (it tries again 0.05 s later): an import, torch's compiler or a wait
# for a thread anywhere on the stack (their half-done state, a lock left held, would break the tests after),
# or pytest's, pluggy's, unittest's or pytest-xdist's own code, or this file's, at its top
_UNSAFE = ('<frozen importlib', '/torch/_dynamo/', '/torch/_inductor/', '/torch/fx/', '/torch/utils/_sympy/',
           '/sympy/', '/threading.py', '/concurrent/futures/', '/queue.py')
_OWN = ('/_pytest/', '/pluggy/', '/unittest/', '/xdist/', '/execnet/', __file__)
_STOPPED = [0]          # tests (or setups) stopped so far by --fast's clock or its torch.compile refusal
_PHASE = [False]        # a test's phase (setup, call, teardown) is running: --fast's clock may stop it


def pytest_addoption(parser):
    parser.addoption('--fast', action='store_true', help='the edit loop: skip a test that starts a Python '
                     'process, compiles, or runs past 1 s (tests/conftest.py)')
    parser.addoption('--outcomes', metavar='PATH', help="write each test's outcome and first failure's "
                     'message to PATH as JSON (test_mixer.py --repeat)')


def pytest_configure(config):
    """Register the suite's plugins: Tally where the reports arrive (pytest's process, or pytest-xdist's
    controller), InTestProcess where the tests run (pytest's process, or each worker); under pytest-xdist,
    make the shared fixtures first (unless the environment names them already)."""
    worker = hasattr(config, 'workerinput')
    distributed = not worker and config.getoption('dist', 'no') != 'no' and config.getoption('tx', None)
    if not worker:
        config.pluginmanager.register(Tally(config), 'mixer-tally')
    if not distributed:
        config.pluginmanager.register(InTestProcess(config.getoption('fast')), 'mixer-test-process')
    elif not os.environ.get(SHARED_ENV) and not config.getoption('collectonly'):
        shared_fixtures()       # in $TEST_MIXER_FIXTURES, which the workers inherit; removed at our exit


def module_of(nodeid):
    """The module name of a test id: 'tests/test_model.py::TestX::test_y' -> 'test_model'."""
    return os.path.basename(nodeid.split('::')[0]).removesuffix('.py')


def first_message(report):
    """A failed report's message: its exception's type and text ('AssertionError: 1 != 2'), or its last
    line."""
    crash = getattr(report.longrepr, 'reprcrash', None)
    return crash.message if crash else (str(report.longrepr).strip().splitlines() or [''])[-1]


def tally(outcomes, fast=()):
    """The counts line of {test id: 'passed' | 'failed' | 'skipped'}, saying how many skips were --fast's
    (the ids `fast`): 'N passed, M failed, K skipped (of T tests)'."""
    n, k = Counter(outcomes.values()), sum(outcomes.get(t) == 'skipped' for t in fast)
    note = f' ({k} of them --fast skips: they start a Python process or take over {FAST_SECONDS} s)' * bool(k)
    return (f'{n["passed"]} passed, {n["failed"]} failed, {n["skipped"]} skipped{note} '
            f'(of {len(outcomes)} tests)')


class Tally:
    """Each test's one outcome from its reports (setup, call, teardown, subtests, a crashed worker's), a
    line as each module ends, and the counts line after pytest's own summary."""

    def __init__(self, config):
        self.config, self.t0 = config, time.perf_counter()
        self.outcomes, self.messages, self.fast, self.todo, self.finished = {}, {}, set(), {}, []

    def expect(self, ids):
        """The test ids the run will report, grouped by module."""
        for nodeid in ids:
            self.todo.setdefault(module_of(nodeid), set()).add(nodeid)

    def pytest_collection_finish(self, session):
        self.expect(item.nodeid for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):     # every worker collected the same
        if not self.todo:
            self.expect(ids)

    @pytest.hookimpl(optionalhook=True, tryfirst=True)
    def pytest_xdist_make_scheduler(self, config, log):
        return once_loadfile(config, log) if config.getoption('dist') == 'loadfile' else None

    def pytest_collectreport(self, report):
        if report.failed:                                   # a module that does not import: a failed test
            self.outcomes[report.nodeid] = 'failed'
            self.messages.setdefault(report.nodeid, first_message(report))

    def pytest_runtest_logreport(self, report):
        nodeid, old = report.nodeid, self.outcomes.get(report.nodeid, 'passed')
        if report.failed:
            self.outcomes[nodeid] = 'failed'
            self.messages.setdefault(nodeid, first_message(report))
        elif report.skipped and old != 'failed':
            self.outcomes[nodeid] = 'skipped'
            if '--fast: ' in str(report.longrepr):
                self.fast.add(nodeid)
        else:
            self.outcomes[nodeid] = old
        if report.when in ('teardown', '???'):              # '???': pytest-xdist's report of a crashed worker
            module = module_of(nodeid)
            self.todo.get(module, set()).discard(nodeid)
            if not self.todo.get(module) and module not in self.finished:
                self.finished.append(module)
                self.say(self.module_line(module))

    def module_line(self, module):
        """'== test_x (k of n modules): its counts; s so far, about s to go' (the rest estimated from
        MODULE_SECONDS of the modules done and to do)."""
        cost = lambda names: sum(MODULE_SECONDS.get(m, 60) for m in names)     # noqa: E731
        done, elapsed = cost(self.finished), time.perf_counter() - self.t0
        left = cost(set(self.todo) - set(self.finished))
        mine = {t: o for t, o in self.outcomes.items() if module_of(t) == module}
        return (f'== {module} ({len(self.finished)} of {len(self.todo)} modules): {tally(mine, self.fast)}; '
                f'{elapsed:.0f} s so far, about {elapsed * left / max(1, done):.0f} s to go')

    def say(self, line):
        """Print `line` on a line of its own (pytest's dots do not end theirs)."""
        writer = self.config.get_terminal_writer()
        if writer.width_of_current_line:
            writer.line()
        writer.line(line)

    def pytest_sessionfinish(self, session):
        path = self.config.getoption('outcomes')
        if path:
            with open(path, 'w') as f:
                json.dump({'outcomes': self.outcomes, 'messages': self.messages}, f)

    def pytest_unconfigure(self, config):
        if not config.getoption('collectonly'):
            print(tally(self.outcomes, self.fast), flush=True)


def once_loadfile(config, log):
    """pytest-xdist's --dist loadfile scheduling, except that a test whose worker died is failed once and not
    run again (loadfile puts it back with the rest of its module: a test that kills its process would kill
    every worker in turn), and a new worker is given two tests, or told none is left (a worker runs a test
    only when it knows the next: with one, the new worker waited for ever) -> the scheduler."""
    from xdist.scheduler import LoadFileScheduling

    class Once(LoadFileScheduling):
        def remove_node(self, node):
            pending = [(unit, t) for unit in self.assigned_work.get(node, {}).values()
                       for t, done in unit.items() if not done]
            if pending:                         # the first test not done was running: marked done
                pending[0][0][pending[0][1]] = True
            crashed = super().remove_node(node)
            return pending[0][1] if pending else crashed

        def _reschedule(self, node):           # each call gives a module, or tells the node to finish
            super()._reschedule(node)
            while node in self.assigned_work and not node.shutting_down and \
                    self._pending_of(self.assigned_work[node]) < 2:
                super()._reschedule(node)
    return Once(config, log)


class InTestProcess:
    """Where the tests run: the modules sorted slowest first; under CI=true a skip for missing real text made
    a failure; under --fast, Python processes and torch.compile refused, every phase of a test (setup, with
    its class's, call, teardown) on a clock of FAST_SECONDS, and an error that follows a refusal or a stop (a
    library may wrap the SkipTest: inductor's InductorError) made --fast's skip."""

    def __init__(self, fast):
        self.fast, self.ci = fast, os.environ.get('CI', '').lower() == 'true'
        self.stack, self.marks = contextlib.ExitStack(), (0, 0)

    def pytest_collection_modifyitems(self, items):      # a stable sort: a module's tests as written
        items.sort(key=lambda item: -MODULE_SECONDS.get(module_of(item.nodeid), 60))

    def pytest_sessionstart(self, session):
        if self.fast:
            self.stack.enter_context(python_processes_forbidden())
            self.stack.enter_context(compilation_refused())

    def pytest_sessionfinish(self, session):
        if self.fast:
            fast_clock(0)
        self.stack.close()

    def timed(self):
        """A phase of a test: what was refused or stopped before it forgotten; under --fast, on the clock."""
        self.marks = (refused_python_processes(), _STOPPED[0])
        _PHASE[0] = True
        if self.fast:
            fast_clock(FAST_SECONDS)
        try:
            return (yield)
        finally:
            _PHASE[0] = False
            if self.fast:
                fast_clock(0)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item):
        return (yield from self.timed())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        return (yield from self.timed())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item):
        return (yield from self.timed())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if report.failed and self.fast:
            why = FAST_SKIP if refused_python_processes() > self.marks[0] else \
                FAST_SLOW if _STOPPED[0] > self.marks[1] else None
            if why:
                report.outcome = 'skipped'
                report.longrepr = (str(item.path), item.location[1] or 0, f'Skipped: {why}')
        if report.skipped and self.ci and NO_TEXT.split(':')[0] in str(report.longrepr):
            report.outcome = 'failed'
            report.longrepr = f'CI=true: a test skipped for missing data fails: {NO_TEXT}'
        return report


def _stop_slow_test(signum=None, frame=None):
    """--fast's clock ran out (SIGALRM): stop the running test, and again every 0.05 s until its phase ends (a
    SkipTest in a subtest stops only that subtest), unless the stack `frame` is _UNSAFE or its top pytest's
    own (then try again in 0.05 s); outside a test's phase, nothing."""
    unsafe = frame is not None and any(part in frame.f_code.co_filename for part in _OWN)
    while frame is not None and not unsafe:
        unsafe = any(part in frame.f_code.co_filename for part in _UNSAFE)
        frame = frame.f_back
    if _PHASE[0]:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        if not unsafe:
            _stop()


def _stop():
    """Stop the running test, counted: unittest.SkipTest(FAST_SLOW)."""
    _STOPPED[0] += 1
    raise unittest.SkipTest(FAST_SLOW)


def fast_clock(seconds):
    """Arm --fast's clock: SIGALRM (ITIMER_REAL) in `seconds` (0 disarms it). A no-op where there is no
    SIGALRM (Windows): --fast then bounds only the Python processes and compilations."""
    if hasattr(signal, 'setitimer'):
        signal.signal(signal.SIGALRM, _stop_slow_test)
        signal.setitimer(signal.ITIMER_REAL, seconds)


@contextlib.contextmanager
def compilation_refused():
    """--fast: inside, torch.compile stops the test that calls it (FAST_SLOW)."""
    import torch
    real = torch.compile
    torch.compile = lambda *a, **k: _stop()
    try:
        yield
    finally:
        torch.compile = real
