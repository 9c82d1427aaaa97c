"""What the fault tests share (tests/test_faults.py, tests/test_faults_outputs.py, issue #35).

The tiny settings, train.main under staged faults (WRAPPER: a NaN, SIGKILL, a pause, a full disk,
Ctrl-C in and after a save, each set by an environment variable), the fixtures made once a suite
(prepared data, damaged copies of it, a data dir of another tokenizer, a finished 2-step run; made
in this process, as staging, not as the commands under test; removed at exit), file hashes, the
one-error-line reader, process helpers, and Base.assert_fault: a fault ends with its exit code, no
traceback and one line on stderr naming the cause.
"""

import atexit
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from types import SimpleNamespace

import numpy as np
import torch

from tests.common import ROOT, prepared_data, run, run_in_process, tiny_checkpoint


TINY = ['--d_model=32', '--n_layer=1', '--n_ctx=32', '--batch_size=4', '--eval_windows=4', '--dtype=float32']
ENV = {**os.environ, 'OMP_NUM_THREADS': '1'}
LINUX = sys.platform.startswith('linux')

# train.main under faults staged by environment variables (run as a script, also under torchrun):
# NAN_AT=k (NAN_RANK=r): the k-th step's loss is NaN on rank r; KILL_AT=k: SIGKILL at the k-th step;
# PAUSE_AT=k: after the k-th step, touch PAUSE_FILE and wait up to 120 s for the signal the test sends;
# SAVE_FAIL_AT=k: the k-th torch.save writes 1000 bytes and fails with ENOSPC, as on a full disk;
# SIGINT_IN_SAVE=k: Ctrl-C once the k-th torch.save has written its temporary file;
# SIGINT_AFTER_SAVE=k: Ctrl-C as soon as the k-th checkpoint is in place (just after its os.replace).
WRAPPER = '''
import errno, os, signal, sys, time
sys.path.insert(0, os.getcwd())
import torch
import train
rank, calls, saves, replaces = int(os.environ.get('RANK', 0)), [0], [0], [0]
real_step, real_save, real_replace = train.train_step, torch.save, os.replace


def at(name, count):
    return count == int(os.environ.get(name, 0))


def step(*a, **k):
    loss = real_step(*a, **k)
    calls[0] += 1
    if at('NAN_AT', calls[0]) and rank == int(os.environ.get('NAN_RANK', 0)):
        return loss * float('nan')
    if at('KILL_AT', calls[0]):
        os.kill(os.getpid(), signal.SIGKILL)
    if at('PAUSE_AT', calls[0]):           # until a signal train.py's loop handles (its StopRequests) comes
        requests, t = getattr(signal.getsignal(signal.SIGINT), '__self__', None), time.time()
        open(os.environ['PAUSE_FILE'], 'w').close()
        while time.time() - t < 120 and not (requests and requests.requested):
            time.sleep(0.02)
    return loss


def save(obj, f, *a, **k):
    saves[0] += 1
    if at('SAVE_FAIL_AT', saves[0]):
        with open(f, 'wb') as fh:
            fh.write(bytes(1000))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    real_save(obj, f, *a, **k)
    if at('SIGINT_IN_SAVE', saves[0]):
        os.kill(os.getpid(), signal.SIGINT)


def replace(src, dst, *a, **k):
    real_replace(src, dst, *a, **k)
    if os.path.basename(dst) == 'ckpt.pt':
        replaces[0] += 1
        if at('SIGINT_AFTER_SAVE', replaces[0]):
            os.kill(os.getpid(), signal.SIGINT)


train.train_step, torch.save, os.replace = step, save, replace
train.main(sys.argv[1:])
'''

_FIXTURES = {}


# ----------------------------------------------------------------------------- helpers

def write(path, data):
    """Write str or bytes `data` to path (folders made) -> path."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return path


def hashes(*paths):
    """{file: sha256} of every file under `paths` (folders, or files), '.lock' excepted (the run
    folder lock holds the pid of the last run that took it)."""
    out = {}
    for top in paths:
        files = [top] if os.path.isfile(top) else [os.path.join(d, n) for d, _, ns in os.walk(top) for n in ns]
        for p in files:
            if os.path.basename(p) != '.lock':
                with open(p, 'rb') as f:
                    out[p] = hashlib.sha256(f.read()).hexdigest()
    return out


def error_lines(stderr, allow=()):
    """The non-empty lines of stderr, less argparse's usage block above its 'prog: error:' line
    and lines matching a regex of `allow` (warnings the behaviour calls for)."""
    lines = [l for l in stderr.splitlines() if l.strip()]
    if lines and lines[0].startswith('usage: '):
        lines = [l for l in lines if not (l.startswith('usage: ') or l.startswith(' '))]
    return [l for l in lines if not any(re.search(a, l) for a in allow)]


def unwritable(tmp):
    """A folder path under which nothing can be written: inside a read-only folder (chmod 0o500), or,
    for root, whom permissions do not stop (tests run as root on some machines), under a regular file."""
    ro = os.path.join(tmp, 'readonly')
    os.makedirs(ro)
    os.chmod(ro, 0o500)
    try:
        with tempfile.TemporaryFile(dir=ro):
            pass
    except OSError:
        return os.path.join(ro, 'sub')
    return os.path.join(write(os.path.join(tmp, 'afile'), 'a regular file\n'), 'sub')


def popen(args, **kw):
    """Start python args... from the repository root in a session of its own (a process group to
    signal), Ctrl-C at its default however the test runner was started -> Popen (text)."""
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=kw.pop('env', ENV), text=True,
                            stdout=kw.pop('stdout', subprocess.PIPE), stderr=kw.pop('stderr', subprocess.PIPE),
                            start_new_session=True, preexec_fn=kw.pop('preexec_fn', default_sigint), **kw)


def default_sigint():
    """In a child before it starts: SIGINT at its default (a runner started in the background ignores it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def session_alive(sid):
    """Pids of the processes of session `sid` still running (zombies excepted); Linux /proc."""
    out = []
    for d in os.listdir('/proc'):
        if d.isdigit():
            try:
                with open(f'/proc/{d}/stat') as f:
                    fields = f.read().rsplit(')', 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != 'Z':
                out.append(int(d))
    return out


def alive(pid):
    """True if process `pid` runs (a zombie does not); Linux /proc."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def kill_session(p):
    """SIGKILL every process of Popen p's session (the test's cleanup: nothing left running)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        p.communicate(timeout=30)


# python -c EXIT_RACE MODULE ARGS... runs `python -m MODULE ARGS...` with the race of concurrent.futures' exit
# hook stretched (Python 3.11's _python_exit wakes every pool manager thread still registered, without its lock):
# a manager thread closes its wake-up pipe 0.5 s late, and the hook waits 0.7 s between its check of the pipe
# and its write, as a loaded machine may schedule them. A pool still stopping at exit then trips the hook every
# time ('Exception ignored in ... OSError'), where unstretched it did once in hundreds of runs.
EXIT_RACE = """
import concurrent.futures.process as cfp, runpy, sys, time
close, wakeup = cfp._ThreadWakeup.close, cfp._ThreadWakeup.wakeup
def late_close(self):
    time.sleep(0.5)
    close(self)
def slow_wakeup(self):
    if cfp._global_shutdown and not self._closed:
        time.sleep(0.7)
        self._writer.send_bytes(b'')
    else:
        wakeup(self)
cfp._ThreadWakeup.close, cfp._ThreadWakeup.wakeup = late_close, slow_wakeup
runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)
"""


def exit_race(module, *args):
    """The arguments of python that run `python -m module args...` under EXIT_RACE -> list of str."""
    return ['-c', EXIT_RACE, module, *args]


# the lines an experiment prints as it goes (runner.py's progress), which may reach the test's reader after it
# marked the moment of its signal although the command wrote them before
PROGRESS = (r'^  \[\d+/\d+\] ', r'^[\w ,]+: \d+ (runs|commands)\b', r': \d+ of \d+ runs cached$')


def interrupt(args, ready, settle=0.0, sigints=1, env=None, merged=False):
    """Start python args in a session of its own, wait until `ready` (str: a line of its stderr holds it; or a
    function of the Popen and the lines read so far -> bool, e.g. a file it writes exists), wait `settle`
    seconds, then send SIGINT to its group `sigints` times 50 ms apart (`timeout -s INT` signals the process
    and then its group: two); wait for its end and for every process of its session -> SimpleNamespace(rc,
    lines: its stderr lines (merged: its stdout's too, in one pipe), mark: how many had been read when the
    first signal went, came: whether `ready` came (else the signal went when it ended, or after 600 s), left:
    pids of its session still running 120 s after its end)."""
    p = popen(args, env=env or ENV, stderr=subprocess.STDOUT if merged else subprocess.PIPE)
    lines, stream = [], p.stdout if merged else p.stderr
    reader = threading.Thread(target=lambda: lines.extend(stream), daemon=True)
    reader.start()
    came = ready if callable(ready) else lambda p, lines: any(ready in l for l in lines)
    try:
        t0 = time.time()
        while not came(p, lines) and p.poll() is None and time.time() - t0 < 600:
            time.sleep(0.01)
        time.sleep(settle)
        ok, mark = came(p, lines), len(lines)
        for i in range(sigints):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGINT)
            time.sleep(0.05)
        p.wait(timeout=600)
        reader.join(60)
        t1 = time.time()
        while session_alive(p.pid) and time.time() - t1 < 120:
            time.sleep(0.2)
        left = session_alive(p.pid)
    finally:
        kill_session(p)
    return SimpleNamespace(rc=p.returncode, lines=lines, mark=mark, came=ok, left=left)


def assert_interrupted(test, got, ready, allow=PROGRESS):
    """The Ctrl-C contract of a command interrupted by interrupt(): exit 130, no traceback from the main process,
    a worker or Python's exit ('Exception ignored'), and after the signal one line, saying 'interrupted' (the
    progress lines `allow` matches excepted: written before the signal, they may be read after it), no process
    of its session left."""
    err = ''.join(got.lines)
    test.assertTrue(got.came, f'staging: {ready!r} never came')
    test.assertEqual(got.rc, 130, err[-3000:])
    test.assertNotIn('Traceback', err)
    test.assertNotIn('Exception ignored', err)
    after = [l for l in got.lines[got.mark:] if l.strip() and not any(re.search(a, l) for a in allow)]
    test.assertEqual(len(after), 1, err[-3000:])
    test.assertIn('interrupted', after[0])
    test.assertEqual(got.left, [], 'processes of the interrupted run are still running')


def interrupt_pool(test, args, ready, sigints=1, settle=0.0):
    """interrupt() then assert_interrupted(): the Ctrl-C contract of the command line python args, signalled
    `settle` seconds after its stderr said `ready` (its pool has started)."""
    assert_interrupted(test, interrupt(args, ready, settle, sigints), ready)


def records(path):
    """Every line of a JSON-lines log, parsed (a line that does not parse fails the test)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_json(path):
    """The JSON content of a file."""
    with open(path) as f:
        return json.load(f)


def ckpt_step(path):
    """The step a checkpoint holds."""
    return torch.load(path, map_location='cpu', weights_only=True)['step']


def fixtures():
    """What the tests share, made once: the prepared data and the tiny checkpoint (tests.common),
    damaged copies of the data, a data dir of another tokenizer, a finished 2-step run, config
    files, an unwritable path -> SimpleNamespace."""
    if 'f' in _FIXTURES:
        return _FIXTURES['f']
    data, ckpt = prepared_data(), tiny_checkpoint()
    tmp = tempfile.mkdtemp(prefix='mixer_faults_')
    f = SimpleNamespace(tmp=tmp, data=data, ckpt=ckpt, bad=unwritable(tmp))
    f.wrapper = write(os.path.join(tmp, 'wrapper.py'), WRAPPER)
    f.syntax_cfg = write(os.path.join(tmp, 'cfg', 'syntax.py'), 'n_layer = 2\nd_model = (32,\n')
    f.nan_cfg = write(os.path.join(tmp, 'cfg', 'nan.py'), "grad_clip = float('nan')\n")
    f.corrupt_ckpt = write(os.path.join(tmp, 'corrupt', 'ckpt.pt'), b'not a checkpoint')
    f.old_json = write(os.path.join(tmp, 'results', 'old.json'), '{"made by": "a user"}\n')
    text = os.path.dirname(data)                                 # prepared_data's slices of the text
    f.other = os.path.join(tmp, 'other_tokenizer')               # the same text, a 300-token BPE
    r = run_in_process('data/prepare.py', '--train', os.path.join(text, 'train.txt'), '--valid',
                       os.path.join(text, 'valid.txt'), '--out', f.other, '--vocab_size', '300')
    assert r.returncode == 0, r.stderr
    f.sha, f.other_sha = (read_json(os.path.join(d, 'meta.json'))['tokenizer_sha256'] for d in (data, f.other))

    def damaged(name, change):
        path = os.path.join(tmp, name)
        shutil.copytree(data, path)
        change(path)
        return path
    f.empty_train = damaged('empty_train', lambda d: write(os.path.join(d, 'train.bin'), b''))
    f.odd_val = damaged('odd_val', lambda d: write(os.path.join(d, 'val.bin'), b'abc'))

    def big_id(d):
        ids = np.memmap(os.path.join(d, 'val.bin'), dtype=np.uint16, mode='r+')
        ids[5] = 600                                             # the vocabulary has 512 tokens
        ids.flush()
    f.big_id = damaged('big_id', big_id)
    f.bad_meta = damaged('bad_meta', lambda d: write(os.path.join(d, 'meta.json'), '{"vocab_size": 5'))
    f.swapped = damaged('swapped_tokenizer', lambda d: shutil.copy(os.path.join(f.other, 'tokenizer.tiktoken'),
                                                                    os.path.join(d, 'tokenizer.tiktoken')))
    f.run = os.path.join(tmp, 'run')                             # a finished run: ckpt.pt (step 2), log.jsonl
    r = run_in_process('train.py', f'--data_dir={data}', *TINY, '--max_iters=2', '--eval_interval=2',
                       '--log_interval=1', f'--out_dir={f.run}', env=ENV)
    assert r.returncode == 0, r.stderr
    _FIXTURES['f'] = f
    atexit.register(remove_fixtures)
    return f


def train(*args, data=None, in_process=False):
    """train.py on the prepared data (or `data`) with the tiny settings, as a process (or in this one:
    tests.common.run_in_process) -> CompletedProcess."""
    return (run_in_process if in_process else run)('train.py', f'--data_dir={data or prepared_data()}', *TINY, *args,
                                                   env=ENV, timeout=300)


def run_copy(f, name, stale_record=False):
    """A copy of the finished run's folder (ckpt.pt of step 2, log.jsonl) -> its path. stale_record: its
    log also holds a record of step 3, after the checkpoint (a run killed before its next save)."""
    path = os.path.join(f.tmp, 'runs', name)
    shutil.copytree(f.run, path, ignore=shutil.ignore_patterns('.lock'))
    if stale_record:
        with open(os.path.join(path, 'log.jsonl'), 'a') as fh:
            fh.write(json.dumps({'event': 'train', 'step': 3, 'loss': 6.2}) + '\n')
    return path


def remove_fixtures():
    """Remove the fixtures' folder (the read-only folder made writable first)."""
    f = _FIXTURES.pop('f', None)
    if f is not None:
        for d, _, _ in os.walk(f.tmp):
            with contextlib.suppress(OSError):
                os.chmod(d, 0o700)
        shutil.rmtree(f.tmp, ignore_errors=True)


class Base(unittest.TestCase):
    """The assertion every fault shares."""

    @classmethod
    def setUpClass(cls):
        cls.f = fixtures()

    def assert_fault(self, r, code, words, allow=()):
        """CompletedProcess r exited `code`, printed no traceback and exactly one error line on
        stderr (error_lines: `allow` names the warnings the behaviour calls for) holding each of
        `words` -> that line."""
        self.assertEqual(r.returncode, code, f'stdout: {r.stdout[-800:]}\nstderr: {r.stderr[-2500:]}')
        self.assertNotIn('Traceback', r.stderr)
        lines = error_lines(r.stderr, allow)
        self.assertEqual(len(lines), 1, f'expected one line on stderr, got:\n{r.stderr[-2500:]}')
        for w in words:
            self.assertIn(w, lines[0])
        return lines[0]

