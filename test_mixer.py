"""The test suite: python test_mixer.py   (the last line reads 'N passed, M failed, K skipped (of T tests)').

Runs every tests/test_*.py module, one file a subject: test_model (causality,
incremental decoding, each variant's definition), test_train, test_sample, test_look,
test_compile, test_prepare, test_retrieval, test_scale, the experiments'
(test_claims, test_icl, test_mqar, test_represent, test_bench), test_docs and test_runner (this
runner's own). Tests assert
the properties themselves: a future token changes no earlier logit, cached
generation equals the full forward, loss on real TinyStories text drops,
resuming equals not stopping.

Real text comes from $TINYSTORIES_DIR (train.txt, valid.txt), by default
../shared/data/tinystories; a test that needs it is skipped with a reason if it is
absent, and with CI=true in the environment such a skip counts as a failure.

    python test_mixer.py                  # everything (what CI runs)
    python test_mixer.py test_model       # some modules of tests/ (names, with or without .py)
    python test_mixer.py --fast           # the edit loop: about a minute, in one process
    python test_mixer.py --fast test_model
    python test_mixer.py --jobs 1         # everything in this one process (a debugger's view)
    python test_mixer.py --repeat 20 test_faults    # 20 runs: each test that failed, how often, its first message

Modules run on --jobs worker processes (default 2: the project's machine has 2 cores and every test
runs one torch thread), the slowest first, each worker taking the next module when it is free and
running its modules one after another (one start and one import of torch for many modules); each
module's output is printed whole when it ends, with the count so far, its CPU seconds and the time
left; the prepared data and the tiny checkpoint the modules share are made once, before they start
(shared_fixtures). A worker that dies fails its module, and the next module gets a new worker. One
module named, or --jobs 1, runs in this process. The slowest tests are listed with their wall and CPU seconds
(on a loaded machine the wall clock counts the other processes' work; the CPU seconds do not).

--repeat N hunts flakes: the modules named (default all) run N times on the worker processes, each run of a module
in a process it has not run in (its fixtures are cached there), two never at once; only a run with a failure prints
its output; then each test that failed in any run, its failures out of N and its first message; exit 1 if any did.

--fast is the edit loop, in one process unless --jobs says otherwise: a test is stopped, and counted
as skipped on the last line, the moment it starts a Python process (a project script's command line,
torchrun, a process pool: '--fast: starts a Python process'), calls torch.compile, or runs past
FAST_SECONDS (1 s; never stopped inside an import or torch's compiler, which would leave the process
broken for the tests after it: '--fast: compiles, or ran past 1 s'). It checks the models, the
functions and the entry points' main code; the whole suite also runs every command line end to end
(exit codes, stdout, stderr of a real process), DDP, the compiled paths, the slow tests and the
experiments' --quick runs. No test is marked by hand, so a new tests/test_*.py module
takes part as it is.
"""

import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import unittest

from tests.common import FAST_SKIP, NO_TEXT, ROOT, python_processes_forbidden, refused_python_processes

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


def unit(test):
    """The test a unittest outcome belongs to -> its id: a subtest's is its test's; a class or module
    whose setup failed or skipped (unittest's _ErrorHolder) is a unit of its own."""
    return getattr(test, 'test_case', test).id()


def outcomes(result, ci):
    """{test id: 'passed' | 'failed' | 'skipped'}, one outcome a test that ran (TimedResult.started) and
    one a class or module setup that failed or skipped: failed if it (or any of its subtests) failed,
    errored or passed unexpectedly, or, with ci=True, skipped for missing real text (NO_TEXT: CI cannot
    pass by skipping); else skipped if it (or a subtest) skipped; else passed."""
    out = dict.fromkeys(result.started, 'passed')
    for t, reason in result.skipped:
        data = ci and reason.startswith(NO_TEXT.split(':')[0])
        if data:
            print(f'FAIL (CI=true, skipped for missing data): {t.id()}')
        if out.get(unit(t)) != 'failed':
            out[unit(t)] = 'failed' if data else 'skipped'
    for t in [t for t, _ in result.failures + result.errors] + list(result.unexpectedSuccesses):
        out[unit(t)] = 'failed'
    return out


def tally(out, fast):
    """(exit code, last line 'N passed, M failed, K skipped (of T tests)') of {test id: outcome} (outcomes)
    and the set of ids `fast` that --fast skipped (FAST_SKIP, FAST_SLOW), the line saying how many were those."""
    n = {k: sum(v == k for v in out.values()) for k in ('passed', 'failed', 'skipped')}
    fast = sum(out[t] == 'skipped' for t in fast)
    note = f' ({fast} of them --fast skips: they start a Python process or take over {FAST_SECONDS} s)' if fast else ''
    return (1 if n['failed'] else 0), (f'{n["passed"]} passed, {n["failed"]} failed, {n["skipped"]} skipped{note} '
                                       f'(of {len(out)} tests)')


def summarize(result, ci):
    """tally() of a TimedResult, each test counted once (outcomes: passed + failed + skipped = T,
    whatever its subtests or its class's setup did)."""
    return tally(outcomes(result, ci), fast_skipped(result))


def fast_skipped(result):
    """The ids of the tests (or class setups) of a TimedResult that --fast skipped -> set."""
    return {unit(t) for t, reason in result.skipped if reason in (FAST_SKIP, FAST_SLOW)}


# --fast bounds the edit loop's time whatever a test does (the whole suite runs it all): a test (or a class's
# setup) is stopped and counted as skipped when it compiles (torch.compile: seconds to a minute), or when it is
# still running after FAST_SECONDS (but never inside an import or torch's compiler, whose half-done state would
# break the tests after it: the clock then tries again a moment later). Measured: README, "Usage".
FAST_SECONDS = 1
FAST_SLOW = f'--fast: compiles, or ran past {FAST_SECONDS} s (python test_mixer.py runs it)'
_STOPPED = [0]          # tests (or class setups) stopped so far by --fast's clock or its torch.compile refusal
_UNSAFE = ('<frozen importlib', '/torch/_dynamo/', '/torch/_inductor/', '/torch/fx/', '/torch/utils/_sympy/', '/sympy/')


def _stop_slow_test(signum=None, frame=None):
    """--fast: stop the running test (unittest counts SkipTest as a skip) unless an import or torch's
    compiler is on the stack `frame` (then SIGALRM again in 0.1 s)."""
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in _UNSAFE):
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            return
        frame = frame.f_back
    _STOPPED[0] += 1
    raise unittest.SkipTest(FAST_SLOW)


def fast_clock(seconds):
    """Arm --fast's clock: SIGALRM (ITIMER_REAL) in `seconds` (0 disarms it). A no-op where there is
    no SIGALRM (Windows): --fast then bounds only the Python processes and compilations."""
    if hasattr(signal, 'setitimer'):
        signal.signal(signal.SIGALRM, _stop_slow_test)
        signal.setitimer(signal.ITIMER_REAL, seconds)


@contextlib.contextmanager
def compilation_refused():
    """--fast: inside, torch.compile stops the test that calls it (_stop_slow_test, FAST_SLOW)."""
    import torch
    real = torch.compile
    torch.compile = lambda *a, **k: _stop_slow_test()
    try:
        yield
    finally:
        torch.compile = real


class TimedResult(unittest.TextTestResult):
    """A unittest result that also records wall-clock seconds in .seconds {name: s}: each test's (its id), and the time
    between two classes' tests (the next class's setUpClass and the last one's tearDownClass) as 'module.Class
    (class setup)'; and their CPU seconds in .cpu {name: s} (process_cpu: what a test costs on a loaded machine,
    whose wall clock counts the others' work); and in .messages {test id: its first failure's message (the
    exception's type and text)}. Under --fast, an error or failure of a test (or class setup) that tried to start a
    Python process is --fast's skip: a library may wrap the SkipTest (inductor turns it into an InductorError)."""

    fast = False            # main sets it for --fast: every test (and the gap before it) on the clock

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds, self._stop, self._cls, self.started, self.messages = {}, time.perf_counter(), None, [], {}
        self.cpu, self._cpu_stop = {}, process_cpu()
        self._refused, self._stopped = refused_python_processes(), _STOPPED[0]

    def startTestRun(self):
        super().startTestRun()
        if self.fast:                   # the first class's setup on the clock
            fast_clock(FAST_SECONDS)

    def startTest(self, test):
        self.started.append(test.id())
        if self.fast:
            fast_clock(FAST_SECONDS)
        self._t0, self._cpu0 = time.perf_counter(), process_cpu()
        if type(test) is not self._cls:
            self._cls = type(test)
            name = f'{self._cls.__module__}.{self._cls.__name__} (class setup)'
            self.seconds[name], self.cpu[name] = self._t0 - self._stop, self._cpu0 - self._cpu_stop
        super().startTest(test)

    def stopTest(self, test):
        self._stop, self._cpu_stop = time.perf_counter(), process_cpu()
        self.seconds[test.id()], self.cpu[test.id()] = self._stop - self._t0, self._cpu_stop - self._cpu0
        super().stopTest(test)
        self._refused, self._stopped = refused_python_processes(), _STOPPED[0]
        if self.fast:                   # the next class's setup (and this one's teardown) on the clock too
            fast_clock(FAST_SECONDS)

    def fast_reason(self):
        """FAST_SKIP or FAST_SLOW if --fast stopped this test (or class setup), a Python process refused or
        its clock run out since the last test ended, else None: whatever error followed is that stop."""
        if refused_python_processes() > self._refused:
            return FAST_SKIP
        return FAST_SLOW if _STOPPED[0] > self._stopped else None

    def note(self, test, err):
        """Keep the first failure's message of `test`'s unit (its exception's last line(s), `err` from exc_info)."""
        self.messages.setdefault(unit(test), ''.join(traceback.format_exception_only(*err[:2])).strip())

    def addError(self, test, err):
        if self.fast_reason():
            return self.addSkip(test, self.fast_reason())
        self.note(test, err)
        super().addError(test, err)

    def addFailure(self, test, err):
        if self.fast_reason():
            return self.addSkip(test, self.fast_reason())
        self.note(test, err)
        super().addFailure(test, err)

    def addSubTest(self, test, subtest, err):
        if err is not None and self.fast_reason():
            return self.addSkip(subtest, self.fast_reason())
        if err is not None:
            self.note(test, err)
        super().addSubTest(test, subtest, err)

    def addUnexpectedSuccess(self, test):
        self.messages.setdefault(unit(test), 'passed, where it was expected to fail')
        super().addUnexpectedSuccess(test)


def process_cpu():
    """CPU seconds (user + system) of this process and of the child processes it has waited for, so far."""
    import resource
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def slowest(seconds, n=10, cpu=None):
    """Lines naming the n slowest tests of {test id: seconds}, slowest first, and their share; with
    cpu {test id: CPU seconds}, each one's CPU seconds beside (the measure a loaded machine keeps)."""
    total, cpu = sum(seconds.values()) or 1.0, cpu or {}
    top = sorted(seconds.items(), key=lambda kv: -kv[1])[:n]
    return [f'slowest {len(top)} tests ({sum(s for _, s in top) / total:.0%} of {total:.0f} s'
            + (f'; {sum(cpu.values()):.0f} s of CPU' if cpu else '') + '):'] + \
        [f'  {s:6.1f} s' + (f' {cpu[name]:6.1f} s CPU' if name in cpu else '') + f'  {name}' for name, s in top]


def by_module(seconds):
    """One line of {test id: seconds} summed a module (tests.test_x.Class.test -> test_x; this file's
    own tests -> test_mixer), slowest first: where the suite's time goes."""
    total = {}
    for name, s in seconds.items():
        parts = name.split(' ')[0].split('.')
        module = parts[1] if parts[0] == 'tests' else 'test_mixer'
        total[module] = total.get(module, 0.0) + s
    return 'seconds a module: ' + ', '.join(f'{m} {s:.0f}' for m, s in sorted(total.items(), key=lambda kv: -kv[1]))


def run_quietly(*cases):
    """Run the TestCase classes `cases` through TimedResult with the output discarded -> the result."""
    suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in cases)
    with open(os.devnull, 'w') as devnull:
        return unittest.TextTestRunner(stream=devnull, resultclass=TimedResult).run(suite)


# CPU seconds each module took in the whole suite on the project's 2-core machine (2026-11-28/29, worker
# processes, a cold inductor cache as on a fresh CI machine: CPU seconds, which a load does not change): the
# parallel run starts the slowest first, so that no long module starts last and the wall time comes near
# the total over --jobs (a module not listed counts 60 s).
MODULE_SECONDS = {'test_compile': 138, 'test_gpu_path': 74, 'test_icl': 65, 'test_faults': 55, 'test_train': 55,
                  'test_bench': 51, 'test_retrieval': 50, 'test_claims': 35, 'test_model': 33, 'test_scale': 30,
                  'test_mqar': 28, 'test_faults_outputs': 27, 'test_faults_experiments': 21, 'test_faults_ctrl_c': 19,
                  'test_watch': 8, 'test_eval_tasks': 7, 'test_represent': 6, 'test_corpus': 6,
                  'test_corpus_inputs': 6, 'test_faults_edges': 5, 'test_runner': 5, 'test_look': 4,
                  'test_prepare': 3, 'test_sample': 2, 'test_card': 1, 'test_convert': 1, 'test_faults_convert': 1,
                  'test_docs': 1}
USAGE = 'usage: python test_mixer.py [--fast] [--jobs N] [--repeat N] [test_module ...]'
EXIT_IN_ENV = 'TEST_MIXER_EXIT_IN'      # a module at which a worker exits at once (tests/test_runner.py: a crash)


def run_suite(suite, fast):
    """Run a unittest suite verbosely with TimedResult -> the result; under --fast, with Python processes and
    compilation refused and every test on --fast's clock."""
    TimedResult.fast = fast
    with python_processes_forbidden() if fast else contextlib.nullcontext(), \
            compilation_refused() if fast else contextlib.nullcontext():
        try:
            return unittest.TextTestRunner(verbosity=2, resultclass=TimedResult).run(suite)
        finally:
            if fast:
                fast_clock(0)


def run_module(name, fast, ci):
    """Run tests/<name>.py in this process, its output (fds 1 and 2: what C code and child processes write
    too) wherever they point -> {'outcomes': {test id: outcome}, 'fast': ids --fast skipped, 'seconds':
    {test id: s}, 'cpu': {test id: CPU s}, 'messages': {failed test id: its first failure's message},
    'module_cpu': CPU s of the whole module, its import included, 'pid': this process's}. A module that does not
    import is one failed test, 'name (its import)', its traceback printed."""
    cpu0 = process_cpu()
    try:
        suite = unittest.defaultTestLoader.loadTestsFromModule(test_modules([name])[0])
    except Exception as e:                              # a syntax error, a missing import: that module fails
        traceback.print_exc()
        return {'outcomes': {f'{name} (its import)': 'failed'}, 'fast': [], 'seconds': {}, 'cpu': {},
                'messages': {f'{name} (its import)': ''.join(traceback.format_exception_only(e)).strip()},
                'module_cpu': process_cpu() - cpu0, 'pid': os.getpid()}
    result = run_suite(suite, fast)
    return {'outcomes': outcomes(result, ci), 'fast': sorted(fast_skipped(result)), 'seconds': result.seconds,
            'cpu': result.cpu, 'messages': result.messages, 'module_cpu': process_cpu() - cpu0, 'pid': os.getpid()}


def worker(fast, ci):
    """python test_mixer.py --worker [--fast]: the modules named on stdin, one a line (name, path, the run's number
    among that module's runs (--repeat), tab-separated), run one after another in this process (run_module), each
    one's output written to its path, each one's results as one JSON line on stdout -> exit code 0 when stdin ends.
    The modules share this process, its import of torch and the fixtures it caches (tests.common); stdin and stdout
    stay the runner's: the tests' own processes get /dev/null and stderr."""
    commands, replies = os.fdopen(os.dup(0)), os.fdopen(os.dup(1), 'w')
    with open(os.devnull) as devnull:
        os.dup2(devnull.fileno(), 0)
    os.dup2(2, 1)
    for line in commands:
        name, path, run = line.rstrip('\n').split('\t')
        if os.environ.get(EXIT_IN_ENV) in (name, f'{name}@{run}'):
            os._exit(3)
        saved = [os.dup(1), os.dup(2)]
        state = os.getcwd(), dict(os.environ), list(sys.path), {s: signal.getsignal(s) for s in (signal.SIGINT,
                                                                                                  signal.SIGTERM)}
        with open(path, 'w') as f:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(f.fileno(), 1), os.dup2(f.fileno(), 2)
            try:
                got = run_module(name, fast, ci)
            finally:
                sys.stdout.flush(), sys.stderr.flush()
                for fd, old in zip((1, 2), saved):
                    os.dup2(old, fd)
                    os.close(old)
                os.chdir(state[0])               # what a module changed and left is not the next one's
                os.environ.clear()
                os.environ.update(state[1])
                sys.path[:] = state[2]
                for sig, handler in state[3].items():
                    signal.signal(sig, handler)
        try:
            replies.write(json.dumps(got) + '\n')
            replies.flush()
        except BrokenPipeError:                  # the runner is gone (killed): no one to tell, and no traceback
            os._exit(0)
    return 0


class Workers:
    """The worker processes of a parallel run (python test_mixer.py --worker), each running the modules it is given
    one after another: one start, one import of torch and one set of cached fixtures for many modules. A worker that
    dies (killed, crashed) fails the module it ran, 'name (its process)', and the next module gets a new one."""

    def __init__(self, fast):
        self.fast, self.live, self.lock = fast, set(), threading.Lock()

    def start(self):
        argv = [sys.executable, os.path.abspath(__file__), '--worker'] + (['--fast'] if self.fast else [])
        p = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        p.modules = set()                   # the modules it ran
        with self.lock:
            self.live.add(p)
        return p

    def run(self, p, name, run=1):
        """Module `name` on worker p (None, or one that ran it already (--repeat): a new one; a module's fixtures
        are cached in its process, as in the suite, where it runs once), its `run`-th run -> (the worker, or None
        if it died; output, results)."""
        if p is not None and name in p.modules:
            self.stop(p, kill=False)
            p = None
        p = p or self.start()
        p.modules.add(name)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, 'output.txt')
            try:
                p.stdin.write(f'{name}\t{path}\t{run}\n')
                p.stdin.flush()
                line = p.stdout.readline()
            except (BrokenPipeError, OSError):
                line = ''
            text = open(path, errors='replace').read() if os.path.exists(path) else ''
        if line:
            return p, text, json.loads(line)
        self.stop(p)
        died = f'its process ended (exit code {p.returncode}) before reporting its tests'
        return None, text + f'{name}: {died}\n', {'outcomes': {f'{name} (its process)': 'failed'}, 'fast': [],
                                                 'seconds': {}, 'cpu': {}, 'messages': {f'{name} (its process)': died},
                                                 'module_cpu': None}

    def stop(self, p, kill=True):
        """End worker p: killed, or (kill=False) told that no module is coming and waited for."""
        if kill:
            p.kill()
        with contextlib.suppress(OSError):
            p.stdin.close()
        p.wait()
        p.stdout.close()
        with self.lock:
            self.live.discard(p)


def shared_fixtures():
    """prepared_data() and tiny_checkpoint() made once, in this process, for every module's process of a parallel
    run (their folder in $TEST_MIXER_FIXTURES: tests.common.shared_fixture), where each process made its own (a
    few CPU seconds a module) -> that folder, to remove at the end; None without the real text or when making
    them failed (each module then makes its own, and fails there)."""
    from tests.common import SHARED_ENV, prepared_data, tiny_checkpoint
    try:
        root = os.path.dirname(prepared_data())
        tiny_checkpoint()
    except (unittest.SkipTest, AssertionError) as e:
        print(f'test_mixer.py: the shared fixtures were not made ({str(e).strip()[-300:] or type(e).__name__}); '
              'each module makes its own', file=sys.stderr)
        return None
    os.environ[SHARED_ENV] = root
    return root


def run_parallel(names, jobs, fast, ci=False, quiet=False):
    """Every module of `names` on `jobs` worker processes (Workers), the slowest (MODULE_SECONDS) first; a name
    given k times runs k times (--repeat), never two runs of one module at once; each run's output printed whole
    when it ends (quiet: only a run with a failure), with the count so far, its CPU seconds and an estimate of the
    time left -> ({test id: outcome}, ids --fast skipped, {test id: seconds}, {test id: CPU seconds}, every run's
    results [(name, run_module's dict)] in the order they ended); of a module run more than once, the dicts hold
    its last run's. Ctrl-C stops every process."""
    order = sorted(names, key=lambda n: -MODULE_SECONDS.get(n, 60))
    total = left = sum(MODULE_SECONDS.get(n, 60) for n in order)
    t0, todo, ready, stopping = time.perf_counter(), list(order), threading.Condition(), False
    out, fast_ids, seconds, cpus, test_cpu, finished, running, runs, started = {}, set(), {}, {}, {}, [], set(), [], {}
    workers = Workers(fast)

    def lane():
        p = None
        while True:
            with ready:
                ready.wait_for(lambda: not todo or any(n not in running for n in todo))
                if not todo:
                    break
                name = todo.pop(next(i for i, n in enumerate(todo) if n not in running))
                running.add(name)
                started[name] = started.get(name, 0) + 1
            p, text, got = workers.run(p, name, started[name])
            with ready:
                nonlocal left
                running.discard(name)
                ready.notify_all()
                if stopping:                        # Ctrl-C: the module was cut short, not failed
                    return
                out.update(got['outcomes']), fast_ids.update(got['fast']), seconds.update(got['seconds'])
                test_cpu.update(got['cpu'])
                runs.append((name, got))
                left -= MODULE_SECONDS.get(name, 60)
                finished.append(name)
                elapsed = time.perf_counter() - t0
                eta = elapsed * left / max(1, total - left)
                cpu = got['module_cpu']
                if cpu is not None:
                    cpus[name] = cpu
                if not quiet or 'failed' in got['outcomes'].values():
                    print(text, end='')
                cpu = '' if cpu is None else f', {cpu:.0f} s of CPU'
                print(f'== {name} ({len(finished)} of {len(order)} modules{cpu}): '
                      f'{tally(got["outcomes"], set(got["fast"]))[1]}; {elapsed:.0f} s so far, about {eta:.0f} s to go',
                      flush=True)
        if p:
            workers.stop(p, kill=False)
    threads = [threading.Thread(target=lane, daemon=True) for _ in range(min(jobs, len(set(order))))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except KeyboardInterrupt:
        with ready:
            todo.clear()
            stopping = True
            ready.notify_all()
        for p in list(workers.live):
            p.kill()
        raise
    print(f'CPU seconds a module ({sum(cpus.values()):.0f} in all): '
          + ', '.join(f'{m} {s:.0f}' for m, s in sorted(cpus.items(), key=lambda kv: -kv[1])))
    return out, fast_ids, seconds, test_cpu, runs


def repeated(runs, n):
    """--repeat `n`'s report of every run's results [(module name, run_module's dict)] -> (exit code: 1 if a test
    failed in any run, else 0; lines: for each test that failed at least once (a module that did not import or
    whose process died counts as one), 'K of N  test id' (N: its module's runs) and its first failure's message
    under it, the most failures first; then a last line counting them)."""
    fails, messages, module, count = {}, {}, {}, {}
    for name, got in runs:
        count[name] = count.get(name, 0) + 1
        for test, outcome in got['outcomes'].items():
            module[test] = name
            if outcome == 'failed':
                fails[test] = fails.get(test, 0) + 1
                messages.setdefault(test, got.get('messages', {}).get(test, '(no message: see its output above)'))
    lines = []
    for test in sorted(fails, key=lambda t: (-fails[t], t)):
        lines.append(f'{fails[test]:3d} of {count[module[test]]}  {test}')
        lines += ['          ' + line for line in messages[test].splitlines()[:12]]
    lines.append(f'--repeat {n}: {len(fails)} of {len(module)} tests failed at least once ({len(count)} modules, '
                 f'{len(runs)} runs)')
    return (1 if fails else 0), lines


def main(argv):
    """Run the modules named in argv (default all); --fast: only the tests that start no Python process;
    --jobs N (default: 2, or 1 on one core): N modules at a time, on N worker processes (one module, or
    --jobs 1: all in this process); --repeat N: each module N times on the worker processes, then each test
    that failed, how often and its first message (repeated()); --worker: be one of those (worker()) -> exit
    code. SIGINT ignored (a background start) is made Python's default again: the Ctrl-C tests' commands
    would inherit it. Every process the
    suite starts runs one torch thread (OMP_NUM_THREADS=1 unless set): its models are tiny, and two
    threads that wait for a core spin (the measurements: tests/common.py)."""
    if '--help' in argv or '-h' in argv:
        print(__doc__)
        return 0
    fast, jobs, repeat, names, as_worker = False, None, None, [], False
    args = iter(argv)
    for a in args:
        if a == '--fast':
            fast = True
        elif a == '--worker':
            as_worker = True
        elif a.partition('=')[0] in ('--jobs', '--repeat'):
            flag, _, n = a.partition('=')
            n = n or next(args, '')
            if not n.isdigit() or int(n) < 1:
                what = 'processes' if flag == '--jobs' else 'runs'
                print(f'test_mixer.py: error: {flag} takes a whole number of {what}, at least 1 (got {n!r}); '
                      f'{USAGE}', file=sys.stderr)
                return 2
            jobs, repeat = (int(n), repeat) if flag == '--jobs' else (jobs, int(n))
        elif a.startswith('-'):
            print(f'test_mixer.py: error: unknown option {a!r}; {USAGE}', file=sys.stderr)
            return 2
        else:
            names.append(a)
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:   # started in the background (nohup, a script's `&`):
        signal.signal(signal.SIGINT, signal.default_int_handler)   # the commands tested inherit it and ignore Ctrl-C
    ci = os.environ.get('CI', '').lower() == 'true'
    if as_worker:
        return worker(fast, ci)
    if jobs is None:                # --fast: one process (it is mostly torch's import, paid once)
        jobs = 1 if fast else min(2, os.cpu_count() or 1)
    names = [n.removesuffix('.py').removeprefix('tests/') for n in names] or module_names()
    unknown = [n for n in names if n not in module_names()]
    if unknown:
        print(f'test_mixer.py: error: no test module {", ".join(unknown)} in tests/ (have: '
              f'{", ".join(module_names())})', file=sys.stderr)
        return 2
    if repeat or jobs > 1 and len(names) > 1:
        shared = shared_fixtures()
        try:
            out, fast_ids, seconds, cpu, runs = run_parallel(names * (repeat or 1), jobs, fast, ci, quiet=bool(repeat))
        except KeyboardInterrupt:
            print('test_mixer.py: interrupted (Ctrl-C); every test process stopped', file=sys.stderr)
            return 130
        finally:
            if shared:
                shutil.rmtree(shared, ignore_errors=True)
    else:
        suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromModule(m) for m in test_modules(names))
        result = run_suite(suite, fast)
        out, fast_ids, seconds, cpu = outcomes(result, ci), fast_skipped(result), result.seconds, result.cpu
    if repeat:
        code, lines = repeated(runs, repeat)
        print('\n'.join(lines))
        return code
    print('\n'.join(slowest(seconds, cpu=cpu)))
    print(by_module(seconds))
    code, line = tally(out, fast_ids)
    print(line)
    return code


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
