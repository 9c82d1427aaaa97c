"""The test suite: python test_mixer.py   (its last line: 'N passed, M failed, K skipped (of T tests)').

pytest runs tests/ (one file a subject) with the hooks of tests/conftest.py; this is the command of the README
and CI:

    python test_mixer.py                  # everything (what CI runs): two processes, a module's tests on one
    python test_mixer.py test_model       # some modules of tests/ (one: in one process)
    python test_mixer.py --fast           # the edit loop, about 40 s: a test that starts a Python process,
                                          # compiles or runs past 1 s is skipped
    python test_mixer.py --repeat 20 test_faults   # 20 runs: each test that failed, how often, its message
    pytest tests/test_model.py -k causal  # pytest itself, from the repository root

--repeat runs pytest N times, each in a fresh process (a loop, not pytest-flakefinder, whose copies of a test
share one process and its state), and prints a run's output only if it failed. pytest runs in a process group
of its own: a Ctrl-C reaches only this command, which stops every process the tests started (on Linux those
in sessions of their own too: this process is their subreaper), prints one line and exits 130.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

from harness.cli import begin, deferred_interrupt, fail, run_command

ROOT = os.path.dirname(os.path.abspath(__file__))
USAGE = 'usage: python test_mixer.py [--fast] [--repeat N] [test_module ...]'


def parse(argv):
    """argv -> (fast, --repeat's N or None, module names); bad input is one line, exit 2."""
    def error(msg):
        fail(f'{msg}; {USAGE}', 'test_mixer.py')
    known = sorted(f[:-3] for f in os.listdir(f'{ROOT}/tests') if re.fullmatch(r'test_\w+\.py', f))
    given, names, args = {}, [], iter(argv)
    for a in args:
        flag, eq, value = a.partition('=')
        name = a.removeprefix('tests/').removesuffix('.py')
        if flag in given or name in names:
            error(f'{a} given twice; give it once')
        if a == '--fast':
            given[a] = True
        elif flag == '--repeat':
            given[flag] = value if eq else next(args, '')
            if not re.fullmatch('[0-9]{1,4}', given[flag]) or not 1 <= int(given[flag]) <= 1000:
                error(f'--repeat takes a whole number of runs from 1 to 1000, not {given[flag]!r}')
        elif a.startswith('-'):
            error(f'unknown option {a!r}')
        elif name not in known:
            error(f'no test module {a} in tests/ (have: {", ".join(known)})')
        else:
            names.append(name)
    return '--fast' in given, int(given.get('--repeat', 0)) or None, names


def run_pytest(fast, names, out=None, *more):
    """pytest on the modules `names` (none: all) in a process group of its own, its output to the file `out`
    (None: ours); then every process it left is stopped (SIGKILL, each with its group), those whose parent
    died too (they came to this process, their subreaper) -> pytest's exit code."""
    if sys.platform.startswith('linux'):
        import ctypes
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)        # PR_SET_CHILD_SUBREAPER: the tests' orphans come here
    n = 2 if len(names) != 1 and (os.cpu_count() or 1) > 1 else 0
    p = subprocess.Popen([sys.executable, '-m', 'pytest', *[f'tests/{m}.py' for m in names], '-n', str(n),
                          '--durations=10', '--continue-on-collection-errors', *(['--fast'] if fast else []),
                          *more], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out, stderr=out, process_group=0)
    try:
        os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)    # ended, not reaped: its group id is still its
    finally:
        with deferred_interrupt():                      # a second Ctrl-C waits until every process is stopped
            pids = [p.pid]
            while pids:
                for pid, send in [(pid, send) for pid in pids for send in (os.killpg, os.kill)]:
                    with contextlib.suppress(OSError):
                        send(pid, signal.SIGKILL)
                for pid in pids:
                    with contextlib.suppress(ChildProcessError):
                        p.wait() if pid == p.pid else os.waitpid(pid, 0)
                try:
                    with open(f'/proc/{os.getpid()}/task/{os.getpid()}/children') as f:
                        pids = [int(pid) for pid in f.read().split()]
                except OSError:                         # not Linux: no subreaper, nothing came here
                    pids = []
    return p.returncode


def repeat(runs, fast, names):
    """pytest `runs` times, a failed run's output printed; then 'K of N  test id' and the first message of
    each test that failed in any run, the most failures first, and a count -> 1 if any failed, else 0."""
    fails, messages, tests = {}, {}, set()
    for k in range(1, runs + 1):
        with tempfile.TemporaryDirectory(prefix='test_mixer_') as tmp, open(f'{tmp}/out', 'w+') as out:
            code = run_pytest(fast, names, out, '--outcomes', f'{tmp}/outcomes.json')
            out.seek(0)
            print(out.read() if code else '', end='')
            try:
                with open(f'{tmp}/outcomes.json') as f:
                    got = json.load(f)
            except (OSError, ValueError):
                got = {'outcomes': {f'(pytest ended with exit code {code})': 'failed'}, 'messages': {}}
        failed = [t for t, outcome in got['outcomes'].items() if outcome == 'failed']
        for t in failed:
            fails[t] = fails.get(t, 0) + 1
            messages.setdefault(t, got['messages'].get(t, '(see its output above)'))
        tests.update(got['outcomes'])
        print(f'--repeat: run {k} of {runs}: {len(failed)} of {len(got["outcomes"])} failed', flush=True)
    for t in sorted(fails, key=lambda t: (-fails[t], t)):
        print(f'{fails[t]:3d} of {runs}  {t}')
        print(''.join(f'          {line}\n' for line in messages[t].splitlines()[:12]), end='')
    print(f'--repeat {runs}: {len(fails)} of {len(tests)} tests failed at least once ({runs} runs)')
    return 1 if fails else 0


def main(argv):
    """Run the suite as `argv` asks -> exit code. Its processes run one torch thread (OMP_NUM_THREADS=1 unless
    set; why: tests/common.py)."""
    if '-h' in argv or '--help' in argv:
        return print(__doc__) or 0
    fast, runs, names = parse(argv)
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    work = (lambda: repeat(runs, fast, names)) if runs else (lambda: run_pytest(fast, names))
    return run_command('test_mixer.py', work, kept='every test process stopped')


if __name__ == '__main__':
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:      # a start in the background (nohup, `&`): the
        signal.signal(signal.SIGINT, signal.default_int_handler)   # commands tested would ignore their Ctrl-C
    begin('test_mixer.py', __name__)
    sys.exit(main(sys.argv[1:]))
