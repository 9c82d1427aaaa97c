"""Faults at every entry point (issue #35): python test_mixer.py test_faults

Every entry point (train.py, sample.py, retrieval.py, data/prepare.py, python -m
experiments.claims | icl | represent | bench, test_mixer.py) meets bad input and faults
with a non-zero exit (2 for a user's mistake, 1 for a run that stopped, 130 on Ctrl-C),
no Python traceback, one line on stderr naming the cause, and every file that was there
before byte-identical afterwards (never a half-written output, nothing a user made
overwritten unless asked).

    TestBadInput         the table: one command a row, its bad input, its exit code and the
                         words its one stderr line must hold; the folders it touches hashed
                         before and after
    TestRunFolder        train.py's run folder: a refused start, two runs at once, --overwrite,
                         kill -9 and resume, a full disk, a file size limit, Ctrl-C (while
                         training, during a save, just after one)
    TestCachesAndOutputs prepare.py's stale temporary files, its lock and Ctrl-C; the runner's
                         damaged caches and torn logs; write_atomic; retrieval's --json failing
                         at the end and its cache failing; Ctrl-C during claims' pool
    TestDistributed      slow (about 30 s): two gloo ranks under torchrun, one stopped (SIGSTOP)
                         or with a NaN loss: the other ends with one line, nothing hangs
    TestICLNoise         icl --noise inf refused

Lines that are not the one error line are allowed only where the behaviour calls for
them, and each such case says so: argparse's usage lines above its 'prog: error:' line,
and on a resume after kill -9 the warning naming the dropped log records. '.lock' (the
run folder lock, which holds the pid of the last run) is not hashed. Subprocesses run
with OMP_NUM_THREADS=1: two-thread runs of these tiny models on a shared 2-core machine
take 100 times longer.
"""

import concurrent.futures
import contextlib
import errno
import glob
import hashlib
import io
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from types import SimpleNamespace
from unittest import mock

import numpy as np
import torch

from tests.common import ROOT, prepared_data, run, tiny_checkpoint

TINY = ['--d_model=32', '--n_layer=1', '--n_ctx=32', '--batch_size=4', '--eval_windows=4']
ENV = {**os.environ, 'OMP_NUM_THREADS': '1'}
LINUX = sys.platform.startswith('linux')

# train.main under faults staged by environment variables (run as a script, also under torchrun):
# NAN_AT=k (NAN_RANK=r): the k-th step's loss is NaN on rank r; KILL_AT=k: SIGKILL at the k-th step;
# PAUSE_AT=k: after the k-th step, touch PAUSE_FILE and sleep (the test then sends the signal);
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
    if at('PAUSE_AT', calls[0]):
        open(os.environ['PAUSE_FILE'], 'w').close()
        time.sleep(120)
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
    r = run('data/prepare.py', '--train', os.path.join(text, 'train.txt'), '--valid',
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
    r = train('--max_iters=2', '--eval_interval=2', '--log_interval=1', f'--out_dir={f.run}')
    assert r.returncode == 0, r.stderr
    _FIXTURES['f'] = f
    return f


def train(*args, data=None):
    """train.py on the prepared data (or `data`) with the tiny settings -> CompletedProcess."""
    return run('train.py', f'--data_dir={data or prepared_data()}', *TINY, *args, env=ENV, timeout=300)


def run_copy(f, name, stale_record=False):
    """A copy of the finished run's folder (ckpt.pt of step 2, log.jsonl) -> its path. stale_record: its
    log also holds a record of step 3, after the checkpoint (a run killed before its next save)."""
    path = os.path.join(f.tmp, 'runs', name)
    shutil.copytree(f.run, path, ignore=shutil.ignore_patterns('.lock'))
    if stale_record:
        with open(os.path.join(path, 'log.jsonl'), 'a') as fh:
            fh.write(json.dumps({'event': 'train', 'step': 3, 'loss': 6.2}) + '\n')
    return path


def tearDownModule():
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


# ----------------------------------------------------------------------------- the table

def table(f):
    """The rows: (name, argv of python, exit code, words of the one stderr line, folders or files whose
    every file must stay byte-identical, skip reason or None)."""
    out = os.path.join(f.tmp, 'out')                     # fresh run folders, one a row
    t = ['train.py', *TINY]
    data = f'--data_dir={f.data}'
    no_cuda = None if not torch.cuda.is_available() else 'CUDA is available here'
    resume_other = run_copy(f, 'resume_other_tokenizer', stale_record=True)
    corrupt_run = os.path.dirname(f.corrupt_ckpt)
    held = run_copy(f, 'held')
    sample = ['sample.py', '--ckpt', f.ckpt, '--max_new_tokens', '4', '--num_samples', '1']
    ret = ['retrieval.py', '--ckpt', f.ckpt, '--data_dir', f.data, '--max_pairs', '60', '--steps', '5',
           '--cache_dir', os.path.join(f.tmp, 'retrieval_cache')]
    prep = ['data/prepare.py', '--train', os.path.join(os.path.dirname(f.data), 'train.txt'),
            '--valid', os.path.join(os.path.dirname(f.data), 'valid.txt'), '--vocab_size', '300']
    claims = ['-m', 'experiments.claims', '--quick', '--data_dir', f.data]
    rep = ['-m', 'experiments.represent', '--variants', '', '--ckpt', f.ckpt, '--T', '8', '--steps', '2',
           '--windows', '1', '--positions', '2']
    bench = ['-m', 'experiments.bench', '--quick', '--device', 'cpu', '--tables', 'train']
    return [
        # train.py: settings
        ('train: a config file with a syntax error', [*t, f.syntax_cfg, data, f'--out_dir={out}/a'], 2,
         ['syntax.py', 'line 2'], [f.syntax_cfg], None),
        ("train: grad_clip = float('nan') in a config file", [*t, f.nan_cfg, data, f'--out_dir={out}/b'], 2,
         ['grad_clip', 'finite'], [f.nan_cfg], None),
        ('train: an empty --out_dir=', [*t, data, '--out_dir='], 2, ['out_dir'], [], None),
        ('train: an unknown setting', [*t, data, '--nonsense=1', f'--out_dir={out}/c'], 2, ['nonsense'], [], None),
        ('train: an unknown --device', [*t, data, '--device=tpu', f'--out_dir={out}/d'], 2, ['tpu'], [], None),
        ('train: --device=cuda without CUDA', [*t, data, '--device=cuda', f'--out_dir={out}/e'], 2, ['CUDA'], [],
         no_cuda),
        ('train: an --out_dir that cannot be written', [*t, data, f'--out_dir={f.bad}'], 2,
         ['cannot write', f.bad], [], None),
        ('train: a fresh run on a folder that holds a run', [*t, data, f'--out_dir={held}'], 2,
         ['already holds a run', '--overwrite=True'], [held], None),
        # train.py: data
        ('train: a missing --data_dir', [*t, f'--data_dir={f.tmp}/nowhere', f'--out_dir={out}/f'], 2,
         ['not found', 'prepare.py'], [], None),
        ('train: an empty train.bin', [*t, f'--data_dir={f.empty_train}', f'--out_dir={out}/g'], 2,
         ['train.bin', '0 bytes'], [f.empty_train], None),
        ('train: an odd-sized val.bin', [*t, f'--data_dir={f.odd_val}', f'--out_dir={out}/h'], 2,
         ['val.bin', '3 bytes'], [f.odd_val], None),
        ('train: token ids at or above vocab_size', [*t, f'--data_dir={f.big_id}', f'--out_dir={out}/i'], 2,
         ['token id 600', '512'], [f.big_id], None),
        ('train: a corrupt meta.json', [*t, f'--data_dir={f.bad_meta}', f'--out_dir={out}/j'], 2,
         ['meta.json', 'damaged'], [f.bad_meta], None),
        # train.py: resume
        ('train: the tokenizer changed under a resume',
         ['train.py', '--init_from=resume', f'--out_dir={resume_other}', f'--data_dir={f.other}', '--max_iters=4'],
         2, ['another tokenizer', f.sha[:12], f.other_sha[:12]], [resume_other, f.other], None),
        ('train: resume from a corrupt checkpoint', ['train.py', '--init_from=resume', f'--out_dir={corrupt_run}'],
         2, ['corrupt'], [corrupt_run], None),
        ('train: resume with no checkpoint', ['train.py', '--init_from=resume', f'--out_dir={out}/k'], 2,
         ['does not exist'], [], None),
        # sample.py
        ('sample: an unknown --device', [*sample, '--device', 'tpu'], 2, ['unknown device', 'tpu'], [f.ckpt], None),
        ('sample: --device cuda without CUDA', [*sample, '--device', 'cuda'], 2, ['CUDA'], [f.ckpt], no_cuda),
        ('sample: a NaN temperature', [*sample, '--temperature', 'nan'], 2, ['temperature'], [f.ckpt], None),
        ('sample: a corrupt checkpoint', ['sample.py', '--ckpt', f.corrupt_ckpt], 2, ['corrupt'], [f.corrupt_ckpt],
         None),
        ('sample: a missing checkpoint', ['sample.py', '--ckpt', f.corrupt_ckpt + '.missing'], 2, ['not found'], [],
         None),
        ('sample: a missing prompt file', [*sample, '--start', f'FILE:{f.tmp}/nowhere.txt'], 2, ['prompt file'],
         [], None),
        ('sample: an empty prompt', [*sample, '--start', ''], 2, ['prompt is empty'], [], None),
        # retrieval.py
        ('retrieval: --json names an existing file', [*ret, '--json', f.old_json], 2,
         ['exists', '--overwrite'], [f.old_json], None),
        ('retrieval: a --json that cannot be written', [*ret, '--json', os.path.join(f.bad, 'r.json')], 2,
         ['cannot write'], [], None),
        ('retrieval: a --cache_dir that cannot be written', [*ret, '--cache_dir', f.bad], 2,
         ['--cache_dir'], [], None),
        ('retrieval: an unknown --device', [*ret, '--device', 'tpu'], 2, ['tpu'], [], None),
        ('retrieval: token ids the tokenizer does not have',
         [*ret, '--data_dir', f.big_id], 2, ['token id 600', '512 tokens'], [f.big_id], None),
        ('retrieval: a corrupt meta.json', [*ret, '--data_dir', f.bad_meta], 2, ['meta.json', 'damaged'],
         [f.bad_meta], None),
        ("retrieval: a tokenizer that is not meta.json's", [*ret, '--data_dir', f.swapped], 2,
         [f.sha, f.other_sha], [f.swapped], None),
        # data/prepare.py
        ('prepare: an --out that cannot be written', [*prep, '--out', f.bad], 2, ['prepare.py: error:'], [], None),
        ('prepare: --vocab_size out of range', [*prep[:-1], '10', '--out', os.path.join(f.tmp, 'p1')], 2,
         ['--vocab_size'], [], None),
        ('prepare: a missing --train file', ['data/prepare.py', '--train', f'{f.tmp}/nowhere.txt', '--valid',
                                             prep[4], '--out', os.path.join(f.tmp, 'p2')], 2, ['not found'], [], None),
        # python -m experiments.claims
        ('claims: an --out that cannot be written', [*claims, '--out', f.bad], 2, ['cannot write'], [], None),
        ('claims: a corrupt meta.json', [*claims, '--data_dir', f.bad_meta, '--out', os.path.join(f.tmp, 'c1')], 2,
         ['meta.json', 'damaged'], [f.bad_meta], None),
        ('claims: an unknown model', [*claims, '--models', 'nope', '--out', os.path.join(f.tmp, 'c2')], 2,
         ['nope'], [], None),
        # python -m experiments.represent
        ('represent: a --json that cannot be written', [*rep, '--json', os.path.join(f.bad, 'r.json')], 2,
         ['cannot write'], [], None),
        ('represent: --json names an existing file', [*rep, '--json', f.old_json], 2, ['exists', '--overwrite'],
         [f.old_json], None),
        ("represent: a data dir of another tokenizer than the checkpoint's", [*rep, '--data_dir', f.other], 2,
         ['another tokenizer', f.sha, f.other_sha], [f.other, f.ckpt], None),
        ('represent: --T longer than n_ctx', [*rep, '--T', '1000'], 2, ['n_ctx'], [], None),
        # python -m experiments.bench (argparse: its usage lines above the error line are allowed)
        ('bench: a negative --warmup', [*bench, '--warmup', '-1'], 2, ['--warmup'], [], None),
        ('bench: --vocab_size 0', [*bench, '--vocab_size', '0'], 2, ['error'], [], None),
        ('bench: a --d_model the heads do not divide', [*bench, '--d_model', '30'], 2, ['divisible'], [], None),
        # python -m experiments.icl
        ('icl: an --out that cannot be written', ['-m', 'experiments.icl', '--quick', '--out', f.bad], 2,
         ['cannot write'], [], None),
        # test_mixer.py
        ('test_mixer: an unknown option', ['test_mixer.py', '--nonsense'], 2, ['unknown option'], [], None),
        ('test_mixer: an unknown module', ['test_mixer.py', 'test_nope'], 2, ['no test module'], [], None),
    ]


class TestBadInput(Base):
    """Each row of table(): a command meets bad input -> its exit code, no traceback, one line naming the
    cause, the files it was given byte-identical. The rows run two at a time (each its own folders)."""

    def test_every_entry_point_refuses_bad_input_in_one_line(self):
        f = self.f
        rows = table(f)
        todo = [row for row in rows if row[5] is None]
        before = hashes(f.data, f.ckpt, *{p for row in todo for p in row[4]})
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda row: run(*row[1], env=ENV, timeout=120), todo))
        after = hashes(f.data, f.ckpt, *{p for row in todo for p in row[4]})
        for (name, argv, code, words, paths, _), r in zip(todo, results):
            with self.subTest(name):
                self.assert_fault(r, code, words)
                changed = [p for p in hashes(*paths) if after.get(p) != before[p]]
                self.assertEqual(changed, [], 'files given to the refused command changed')
        changed = [p for p in before if after.get(p) != before[p]]
        self.assertEqual(changed, [], 'files given to refused commands changed')
        for name, *_, skip in rows:
            if skip:
                with self.subTest(name):
                    self.skipTest(skip)


# ----------------------------------------------------------------------------- train.py's run folder

class TestRunFolder(Base):
    """A run folder holds one run's files, whole, whatever stops the run."""

    def folder(self, name):
        """A fresh folder path for a test's run."""
        return os.path.join(self.f.tmp, 'folders', name)

    def test_a_refused_start_leaves_no_run_behind(self):
        """A start refused after the folder was locked (an unknown device, bad data) leaves no log.jsonl
        or ckpt.pt: else the corrected command would meet 'already holds a run'."""
        for name, args in (('device', ['--device=tpu']), ('data', [f'--data_dir={self.f.empty_train}'])):
            with self.subTest(name):
                out = self.folder(f'refused_{name}')
                self.assert_fault(train(f'--out_dir={out}', *args), 2, [])
                left = sorted(set(os.listdir(out)) - {'.lock'}) if os.path.isdir(out) else []
                self.assertEqual(left, [], 'a refused start left files that make the folder "hold a run"')

    def test_two_runs_on_one_folder_started_together(self):
        """The second exits 2 naming the first's pid; the folder ends with the first run's files alone."""
        out = self.folder('two')
        argv = ['train.py', f'--data_dir={self.f.data}', *TINY, '--max_iters=100000', '--eval_interval=20',
                '--log_interval=10', f'--out_dir={out}']
        a, b = popen(argv), popen(argv)
        try:
            t0 = time.time()
            while a.poll() is None and b.poll() is None and time.time() - t0 < 120:
                time.sleep(0.1)
            loser, winner = (a, b) if a.poll() is not None else (b, a)
            _, err = loser.communicate(timeout=30)
            r = SimpleNamespace(returncode=loser.returncode, stdout='', stderr=err)
            self.assert_fault(r, 2, ['in use by another run', f'pid {winner.pid}'])
            while not os.path.exists(os.path.join(out, 'ckpt.pt')) and winner.poll() is None:
                time.sleep(0.1)
            os.killpg(winner.pid, signal.SIGINT)
            _, err = winner.communicate(timeout=60)
            self.assert_fault(SimpleNamespace(returncode=winner.returncode, stdout='', stderr=err), 130,
                              ['interrupted'])
        finally:
            kill_session(a)
            kill_session(b)
        log = records(os.path.join(out, 'log.jsonl'))
        self.assertEqual([r['event'] for r in log].count('config'), 1, 'the log holds two runs')
        self.assertEqual(sorted(set(os.listdir(out)) - {'.lock'}), ['ckpt.pt', 'log.jsonl'])

    def test_overwrite_that_fails_before_its_first_save(self):
        """--overwrite=True on an old run, stopped (a NaN) before its first save: no old ckpt.pt is left
        beside the new log, and the line says no checkpoint was written."""
        out = run_copy(self.f, 'overwrite')
        r = run(self.f.wrapper, f'--data_dir={self.f.data}', *TINY, '--overwrite=True', '--max_iters=50',
                '--eval_interval=1000', f'--out_dir={out}', env={**ENV, 'NAN_AT': '2'}, timeout=120)
        self.assert_fault(r, 1, ['non-finite', 'at step 2', 'no checkpoint was written'])
        self.assertFalse(os.path.exists(os.path.join(out, 'ckpt.pt')), "the old run's checkpoint is left")
        configs = [x['config'] for x in records(os.path.join(out, 'log.jsonl')) if x['event'] == 'config']
        self.assertEqual([c['max_iters'] for c in configs], [50], 'the log is not the new run alone')

    def test_resume_after_kill_9_repeats_no_step(self):
        """kill -9 after a checkpoint (step 10) and two more log lines; the resumed run's log holds every
        step once. Its stderr: the warning naming the dropped records (allowed: the behaviour calls for it)."""
        out = self.folder('kill9')
        r = run(self.f.wrapper, f'--data_dir={self.f.data}', *TINY, '--max_iters=20', '--eval_interval=5',
                '--log_interval=1', f'--out_dir={out}', env={**ENV, 'KILL_AT': '13'}, timeout=120)
        self.assertEqual(r.returncode, -signal.SIGKILL, r.stderr[-2000:])
        self.assertEqual(ckpt_step(os.path.join(out, 'ckpt.pt')), 10)
        steps = [x['step'] for x in records(os.path.join(out, 'log.jsonl')) if x['event'] == 'train']
        self.assertEqual(max(steps), 12, 'staging: the log should go past the checkpoint')
        r = train('--init_from=resume', f'--out_dir={out}')
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertNotIn('Traceback', r.stderr)
        self.assertEqual(error_lines(r.stderr, allow=[r'warning: .*dropped 2 records after step 10']), [])
        log = records(os.path.join(out, 'log.jsonl'))
        for event, want in (('train', list(range(1, 21))), ('eval', [0, 5, 10, 15, 20])):
            self.assertEqual([x['step'] for x in log if x['event'] == event], want, event)

    def stopped_run(self, name):
        """A run folder holding a checkpoint of step 5 -> (folder, hashes of its files)."""
        out = self.folder(name)
        r = train('--max_iters=5', '--eval_interval=5', '--log_interval=5', f'--out_dir={out}')
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        return out, hashes(os.path.join(out, 'ckpt.pt'))

    def assert_save_failed(self, r, out, before, words):
        """A resumed run whose save at step 10 failed: one line (words), exit 1; ckpt.pt is the step-5
        one, byte-identical; no ckpt.pt.tmp; the log parses."""
        line = self.assert_fault(r, 1, ['could not write', 'holds step 5', 'resume: python train.py', *words])
        self.assertIn('at step 10', line)
        self.assertEqual(hashes(os.path.join(out, 'ckpt.pt')), before)
        self.assertFalse(os.path.exists(os.path.join(out, 'ckpt.pt.tmp')))
        records(os.path.join(out, 'log.jsonl'))

    def test_disk_full_during_a_save(self):
        """torch.save meets a full disk (ENOSPC, staged by the wrapper): the line says so."""
        out, before = self.stopped_run('enospc')
        r = run(self.f.wrapper, f'--data_dir={self.f.data}', '--init_from=resume', '--max_iters=10',
                f'--out_dir={out}', env={**ENV, 'SAVE_FAIL_AT': '1'}, timeout=120)
        self.assert_save_failed(r, out, before, ['no space left on device'])

    def test_a_file_size_limit_during_a_save(self):
        """A real failing write, without root: RLIMIT_FSIZE below the checkpoint's size (SIGXFSZ ignored,
        so the write fails with EFBIG)."""
        out, before = self.stopped_run('fsize')

        def limit():
            default_sigint()
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
        r = subprocess.run([sys.executable, 'train.py', f'--data_dir={self.f.data}', '--init_from=resume',
                            '--max_iters=10', f'--out_dir={out}'], cwd=ROOT, env=ENV, capture_output=True,
                           text=True, timeout=120, preexec_fn=limit)
        self.assert_save_failed(r, out, before, [])

    def interrupted(self, out, line):
        """A Ctrl-C'd run's line names the step reached and the step ckpt.pt holds (checked against the
        file) and the resume command; no temporary file is left, the log parses -> (reached, held)."""
        self.assertIn('interrupted', line)
        self.assertIn(f'resume: python train.py --init_from=resume --out_dir={out}', line)
        m = re.search(r'at step (\d+); \S+ holds step (\d+)', line)
        self.assertIsNotNone(m, line)
        self.assertEqual(int(m.group(2)), ckpt_step(os.path.join(out, 'ckpt.pt')),
                         'the line and ckpt.pt disagree on the step it holds')
        self.assertEqual(sorted(set(os.listdir(out)) - {'.lock'}), ['ckpt.pt', 'log.jsonl'])
        records(os.path.join(out, 'log.jsonl'))
        return int(m.group(1)), int(m.group(2))

    def test_ctrl_c_after_the_first_checkpoint(self):
        """SIGINT to the process group of a run (paused by the wrapper at step 8, its checkpoint of step 5
        written): exit 130, one line naming the step reached, the step the checkpoint holds and the resume
        command."""
        out = self.folder('ctrl_c')
        pause = os.path.join(self.f.tmp, 'ctrl_c.paused')
        p = popen([self.f.wrapper, f'--data_dir={self.f.data}', *TINY, '--max_iters=1000', '--eval_interval=5',
                   '--log_interval=1', f'--out_dir={out}'], env={**ENV, 'PAUSE_AT': '8', 'PAUSE_FILE': pause})
        try:
            t0 = time.time()
            while not os.path.exists(pause) and p.poll() is None and time.time() - t0 < 120:
                time.sleep(0.05)
            os.killpg(p.pid, signal.SIGINT)
            _, err = p.communicate(timeout=60)
        finally:
            kill_session(p)
        line = self.assert_fault(SimpleNamespace(returncode=p.returncode, stdout='', stderr=err), 130, [])
        self.assertEqual(self.interrupted(out, line), (7, 5))

    def test_ctrl_c_during_a_save(self):
        """Ctrl-C while the second checkpoint (step 10) is being written: no ckpt.pt.tmp is left, and the
        line says which step ckpt.pt holds, as it does (5, or 10 if the save was let finish first)."""
        out = self.folder('ctrl_c_in_save')
        r = run(self.f.wrapper, f'--data_dir={self.f.data}', *TINY, '--max_iters=1000', '--eval_interval=5',
                f'--out_dir={out}', env={**ENV, 'SIGINT_IN_SAVE': '2'}, timeout=120)
        line = self.assert_fault(r, 130, [])
        self.assertIn(self.interrupted(out, line)[1], (5, 10))

    def test_ctrl_c_just_after_a_save(self):
        """Ctrl-C just after the second checkpoint (step 10) is in place: the line says ckpt.pt holds
        step 10, as it does."""
        out = self.folder('ctrl_c_after_save')
        r = run(self.f.wrapper, f'--data_dir={self.f.data}', *TINY, '--max_iters=1000', '--eval_interval=5',
                f'--out_dir={out}', env={**ENV, 'SIGINT_AFTER_SAVE': '2'}, timeout=120)
        line = self.assert_fault(r, 130, [])
        self.assertEqual(self.interrupted(out, line)[1], 10)


# ----------------------------------------------------------------------------- caches and outputs

def cached_job(argv, run_dir):
    """A Runner job (run in a pool process): -> {'rc': 0, 'line', 'ran': argv, 'sigint': whether the pool
    process ignores Ctrl-C}."""
    return {'rc': 0, 'line': 'ran', 'ran': argv, 'sigint_ignored': signal.getsignal(signal.SIGINT) == signal.SIG_IGN}


class TestCachesAndOutputs(Base):
    """prepare.py's temporary files and lock, the experiments' caches, Ctrl-C during a pool."""

    def test_prepare_removes_stale_temporary_files_and_keeps_live_ones(self):
        """A killed run's .NAME.tmpPID files (its pid gone) are removed with a note; a live run's are kept."""
        out = os.path.join(self.f.tmp, 'prep_stale')
        dead = subprocess.Popen(['true'])
        dead.wait()
        stale = write(os.path.join(out, f'.train.bin.tmp{dead.pid}'), b'\0' * 10)
        live = write(os.path.join(out, f'.val.bin.tmp{os.getpid()}'), b'\0' * 10)
        text = os.path.dirname(self.f.data)
        r = run('data/prepare.py', '--train', os.path.join(text, 'train.txt'), '--valid',
                os.path.join(text, 'valid.txt'), '--vocab_size', '300', '--out', out, env=ENV, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(error_lines(r.stderr), [f'prepare.py: note: removed 1 temporary files left in {out} by a '
                                                 f'run that stopped: {os.path.basename(stale)}'])
        self.assertFalse(os.path.exists(stale))
        self.assertTrue(os.path.exists(live))
        made, other = (hashes(os.path.join(d, 'train.bin')).popitem()[1] for d in (out, self.f.other))
        self.assertEqual(made, other)

    def test_prepare_refuses_a_folder_another_run_writes(self):
        """A second prepare.py on an --out that a live run holds: exit 2 naming its pid, the folder as it was."""
        import fcntl
        out = os.path.join(self.f.tmp, 'prep_locked')
        write(os.path.join(out, f'.train.bin.tmp{os.getpid()}'), b'\0' * 10)
        before = hashes(out)
        fd = os.open(out, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            r = run('data/prepare.py', '--train', 'x', '--valid', 'y', '--out', out, env=ENV, timeout=60)
        finally:
            os.close(fd)
        self.assert_fault(r, 2, ['another prepare.py', f'pid {os.getpid()}'])
        self.assertEqual(hashes(out), before)

    def test_runner_reruns_a_job_whose_cached_result_is_damaged(self):
        """A torn result.json: one warning line, the job runs again and its result is cached whole. (The pool
        process ignores Ctrl-C: the main process handles it, test_ctrl_c_during_the_claims_pool.)"""
        from experiments.runner import Runner
        out = os.path.join(self.f.tmp, 'runner')
        job = write(os.path.join(out, 'job', 'result.json'), '{"argv": ["a"], "rc"')
        runner = Runner(out, 1, 1)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                res = runner.map(cached_job, [(os.path.dirname(job), ['a'], 1.0, None)], 'test')
        finally:
            runner.pool.shutdown()
        self.assertEqual(res[0]['ran'], ['a'])
        self.assertTrue(res[0]['sigint_ignored'])
        warnings = [l for l in err.getvalue().splitlines() if 'warning' in l]
        self.assertEqual(len(warnings), 1, err.getvalue())
        self.assertIn('result.json', warnings[0])
        with open(job) as fh:
            self.assertEqual(json.load(fh)['ran'], ['a'])

    def test_claims_recalibrates_over_a_damaged_calibration_json(self):
        """A torn calibration.json: one warning line, the step times measured again (a fake runner)."""
        from experiments import claims
        out = os.path.join(self.f.tmp, 'calibration')
        path = write(os.path.join(out, 'calibration.json'), '{"flat": {"s_per_step": 0.0')

        class Runner:
            def train_batch(self, jobs, what):
                for run_dir, *_ in jobs:
                    write(os.path.join(run_dir, 'log.jsonl'), ''.join(
                        json.dumps({'event': 'train', 'step': s, 'ms_per_step': 20.0}) + '\n' for s in (5, 10)))
                return [{'rc': 0} for _ in jobs]
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            step_s = claims.calibrate(Runner(), out, ['flat'], {'lm': [], 'ae': []}, 10, False)
        self.assertEqual(step_s, {'flat': 0.02})
        warnings = [l for l in err.getvalue().splitlines() if 'warning' in l]
        self.assertEqual(len(warnings), 1, err.getvalue())
        self.assertIn('calibration.json', warnings[0])
        with open(path) as fh:
            self.assertEqual(json.load(fh)['flat']['s_per_step'], 0.02)

    def test_runner_read_log_drops_a_torn_last_line(self):
        """runner.read_log reads through checkpoint.read_log: a torn last line is one warning, not a crash."""
        from experiments.runner import read_log
        path = write(os.path.join(self.f.tmp, 'torn', 'log.jsonl'),
                     json.dumps({'event': 'eval', 'step': 5, 'val_loss': 3.0, 'val_bpb': 1.0, 'val_acc': 0.1})
                     + '\n{"event": "eval", "st')
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            evals, summary = read_log(path)
        self.assertEqual((evals, summary), ([(5, 3.0, 1.0, 0.1)], None))
        self.assertEqual(len(err.getvalue().strip().splitlines()), 1, err.getvalue())

    def test_write_atomic_keeps_the_old_file_when_the_write_fails(self):
        """checkpoint.write_atomic (retrieval's and represent's outputs): a failed write leaves the old
        file byte-identical and no temporary file."""
        from checkpoint import write_atomic
        path = write(os.path.join(self.f.tmp, 'atomic', 'results.json'), '{"old": 1}\n')
        with mock.patch('os.replace', side_effect=OSError(errno.ENOSPC, 'No space left on device')), \
                self.assertRaises(OSError):
            write_atomic(path, '{"new": 2}\n')
        self.assertEqual(os.listdir(os.path.dirname(path)), ['results.json'])
        with open(path) as fh:
            self.assertEqual(fh.read(), '{"old": 1}\n')

    def test_prepare_interrupted_leaves_its_out_folder_as_it_was(self):
        """Ctrl-C (KeyboardInterrupt, staged in the second split's encoding): exit 130, one line, --out as
        it was (the previous outputs byte-identical, no temporary file)."""
        from data import prepare
        out = os.path.join(self.f.tmp, 'prep_ctrl_c')
        shutil.copytree(self.f.other, out)
        before = hashes(out)
        text = os.path.dirname(self.f.data)
        calls = []

        def interrupted(enc, stream, fh, **kw):
            calls.append(1)
            if len(calls) == 2:
                fh.write(bytes(6))
                raise KeyboardInterrupt
            return real(enc, stream, fh, **kw)
        real = prepare.encode_stream
        err = io.StringIO()
        with mock.patch.object(prepare, 'encode_stream', interrupted), contextlib.redirect_stderr(err), \
                contextlib.redirect_stdout(io.StringIO()):
            try:
                code = prepare.main(['--train', os.path.join(text, 'train.txt'), '--valid',
                                     os.path.join(text, 'valid.txt'), '--vocab_size', '300', '--out', out])
            except KeyboardInterrupt:
                code = 'KeyboardInterrupt escaped prepare.main'
        self.assertEqual(code, 130)
        self.assert_fault(SimpleNamespace(returncode=code, stdout='', stderr=err.getvalue()), 130, ['interrupted'])
        self.assertEqual(hashes(out), before)

    def test_retrieval_json_that_fails_at_the_end_keeps_the_printed_results(self):
        """--json passes the check before the work but its write fails at the end (a full disk): the
        tables are on stdout, one line names the failure, exit 1, the old --json byte-identical. And an
        embedding cache that cannot be written is a warning, not a crash (the cache only saves time)."""
        import retrieval
        out = {'source': 'src', 'train_pairs': 1, 'val_pairs': 0, 'test_pairs': 1, 'train_n': 2, 'eval_trials': 1,
               'ns': [2], 'notes': [], 'results': []}
        path = write(os.path.join(self.f.tmp, 'retrieval_end', 'res.json'), '{"old": 1}\n')
        err, stdout = io.StringIO(), io.StringIO()
        with mock.patch.object(retrieval, 'run', return_value=out), \
                mock.patch.object(retrieval, 'write_atomic', side_effect=OSError(errno.ENOSPC, 'No space left')), \
                contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout), \
                self.assertRaises(SystemExit) as stop:
            retrieval.main(['--ckpt', self.f.ckpt, '--json', path, '--overwrite'])
        self.assert_fault(SimpleNamespace(returncode=stop.exception.code, stdout='', stderr=err.getvalue()), 1,
                          ['could not write', path, 'tables above'])
        self.assertIn('| (chance) | 1/N | 0.500 |', stdout.getvalue())
        with open(path) as fh:
            self.assertEqual(fh.read(), '{"old": 1}\n')
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            retrieval.save_cache(os.path.join(self.f.bad, 'cache', 'x.pt'), {'query': torch.zeros(1)})
        self.assertEqual(len(error_lines(err.getvalue())), 1, err.getvalue())
        self.assertIn('going on without it', err.getvalue())

    @unittest.skipUnless(LINUX, 'reads /proc')
    def test_ctrl_c_during_the_claims_pool(self):
        """SIGINT to the group while claims --quick calibrates on its pool: exit 130 and one line after the
        interrupt (the progress lines before it are claims' own), no traceback from any worker, the
        runs stopped (not left to finish: a full run's would take minutes) and no process left."""
        out = os.path.join(self.f.tmp, 'claims_ctrl_c')
        p = popen(['-m', 'experiments.claims', '--quick', '--models', 'flat', '--data_dir', self.f.data,
                   '--out', out])
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True)
        reader.start()
        try:
            t0 = time.time()
            while not any('runs, about' in l for l in lines) and p.poll() is None and time.time() - t0 < 120:
                time.sleep(0.1)
            time.sleep(0.2)                                   # the workers are starting
            mark = len(lines)
            os.killpg(p.pid, signal.SIGINT)
            p.wait(timeout=60)
            reader.join(30)
            t1 = time.time()
            while session_alive(p.pid) and time.time() - t1 < 10:
                time.sleep(0.2)
            left = session_alive(p.pid)
        finally:
            kill_session(p)
        err = ''.join(lines)
        self.assertGreater(mark, 0, 'staging: claims never reached its pool')
        self.assertEqual(p.returncode, 130, err[-3000:])
        self.assertNotIn('Traceback', err)
        after = [l for l in lines[mark:] if l.strip()]
        self.assertEqual(len(after), 1, err[-3000:])
        self.assertIn('interrupted', after[0])
        self.assertEqual(left, [], 'processes of the interrupted run are still running')
        finished = [d for d in glob.glob(os.path.join(out, 'calibration', '*', 'log.jsonl'))
                    if any(x.get('event') == 'summary' for x in records(d))]
        self.assertEqual(finished, [], 'the pool was left to finish its runs after Ctrl-C, not stopped')


# ----------------------------------------------------------------------------- two ranks (slow)

@unittest.skipUnless(LINUX, 'reads /proc')
class TestDistributed(Base):
    """Slow (about 30 s in all, run in every suite): two gloo ranks under torchrun, each rank's stderr in
    its own file (torchrun --log-dir -r 3: torchrun's own report of a failed worker is torchrun's, not
    train.py's). A stalled rank or a NaN on one rank ends the run with one line, and nothing hangs."""

    def torchrun(self, script, out, *args, **kw):
        """Start torchrun --standalone --nproc_per_node=2 on `script` -> (Popen, its log folder)."""
        logs = os.path.join(self.f.tmp, 'torchrun_logs', os.path.basename(out))
        p = popen(['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', '--log-dir', logs,
                   '--redirects', '3', script, f'--data_dir={self.f.data}', *TINY, f'--out_dir={out}', *args], **kw)
        return p, logs

    def rank_stderr(self, logs, rank):
        """Rank `rank`'s stderr as torchrun saved it."""
        files = glob.glob(os.path.join(logs, '**', 'attempt_0', str(rank), 'stderr.log'), recursive=True)
        self.assertEqual(len(files), 1, files)
        with open(files[0]) as fh:
            return fh.read()

    def workers(self, pid):
        """{rank: pid} of torchrun `pid`'s worker processes."""
        out = {}
        for d in os.listdir('/proc'):
            if d.isdigit():
                try:
                    with open(f'/proc/{d}/stat') as fh:
                        ppid = int(fh.read().rsplit(')', 1)[1].split()[1])
                    if ppid == pid:
                        with open(f'/proc/{d}/environ', 'rb') as fh:
                            env = dict(e.split(b'=', 1) for e in fh.read().split(b'\0') if b'=' in e)
                        out[int(env[b'RANK'])] = int(d)
                except (OSError, KeyError, ValueError):
                    continue
        return out

    def test_a_stalled_rank_ends_the_run_within_the_timeout(self):
        """Rank 1 stopped (SIGSTOP) once it trains: rank 0 ends within ddp_timeout + 30 s with one line
        naming the timeout and the rank, the checkpoint kept; then rank 1 is killed and torchrun ends."""
        out = os.path.join(self.f.tmp, 'ddp_stall')
        p, logs = self.torchrun('train.py', out, '--max_iters=1000000', '--eval_interval=5', '--log_interval=1',
                                '--ddp_timeout=10', stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ranks = {}
        try:
            t0 = time.time()
            while not os.path.exists(os.path.join(out, 'ckpt.pt')) and p.poll() is None and time.time() - t0 < 60:
                time.sleep(0.1)
            ranks = self.workers(p.pid)
            self.assertEqual(sorted(ranks), [0, 1], 'staging: two workers')
            os.kill(ranks[1], signal.SIGSTOP)
            stopped = time.time()
            while alive(ranks[0]) and time.time() - stopped < 60:
                time.sleep(0.2)
            waited = time.time() - stopped
            os.kill(ranks[1], signal.SIGKILL)
            p.wait(timeout=60)
        finally:
            for pid in ranks.values():                    # torchrun starts each worker in a session of its own
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            kill_session(p)
        self.assertLess(waited, 10 + 30, 'rank 0 did not end within ddp_timeout + 30 s')
        self.assertNotEqual(p.returncode, 0)
        line = self.assert_fault(SimpleNamespace(returncode=1, stdout='', stderr=self.rank_stderr(logs, 0)), 1,
                                 ['ddp_timeout=10', 'rank 0', 'holds step'])
        held = int(re.search(r'holds step (\d+)', line).group(1))
        self.assertEqual(ckpt_step(os.path.join(out, 'ckpt.pt')), held)

    def test_a_nan_on_one_rank_stops_every_rank(self):
        """Rank 1's loss is NaN at step 3 (the wrapper): both ranks stop at step 3, each with one line naming
        rank 1's NaN and the checkpoint of step 2 (a rank that did not save must not say there is none)."""
        out = os.path.join(self.f.tmp, 'ddp_nan')
        p, logs = self.torchrun(self.f.wrapper, out, '--max_iters=10', '--eval_interval=2', '--log_interval=1',
                                '--ddp_timeout=10', env={**ENV, 'NAN_AT': '3', 'NAN_RANK': '1'})
        try:
            _, err = p.communicate(timeout=90)
        finally:
            for pid in self.workers(p.pid).values():     # on a hang: the workers, each in its own session
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            kill_session(p)
        self.assertNotEqual(p.returncode, 0, err[-2000:])
        for rank in (0, 1):
            with self.subTest(rank=rank):
                self.assert_fault(SimpleNamespace(returncode=1, stdout='', stderr=self.rank_stderr(logs, rank)), 1,
                                  ['rank 1: non-finite train loss', 'at step 3', 'holds step 2'])


# ----------------------------------------------------------------------------- icl's noise settings

class TestICLNoise(Base):
    """A noise setting must be a finite sigma."""

    def test_icl_refuses_a_non_finite_noise(self):
        """--noise inf is refused in one line (exit 2), not run with every cell diverged and cached as
        a success (regression.check_noise requires a finite sigma)."""
        out = os.path.join(self.f.tmp, 'icl_inf')
        try:
            r = run('-m', 'experiments.icl', '--quick', '--noise', 'inf', '--layers', '1', '--params', 'diag',
                    '--iters', '4', '--eval_prompts', '50', '--workers', '1', '--out', out, env=ENV, timeout=120)
        except subprocess.TimeoutExpired:
            self.fail('icl --noise inf ran on')
        self.assert_fault(r, 2, ['noise', 'inf'])
        self.assertFalse(os.path.exists(out))


if __name__ == '__main__':
    unittest.main()
