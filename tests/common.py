"""What the test modules share: paths, the real text, tiny models, prepared data and a
tiny checkpoint made once per run, and two ways to run the project's command lines: run()
in a fresh Python process, run_in_process() in this one (no interpreter start, no torch
import: a few seconds less a command).

Real text comes from $TINYSTORIES_DIR (train.txt, valid.txt), by default
../shared/data/tinystories beside the repository; tests that need it are skipped
with the reason NO_TEXT if it is absent, and with CI=true such a skip counts as a
failure (tests/conftest.py).
"""

import atexit
import contextlib
import faulthandler
import io
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
import unittest
import warnings
from types import SimpleNamespace

import numpy as np
import torch
from einops import rearrange

import mixer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository root
TEXT_DIR = os.environ.get('TINYSTORIES_DIR', os.path.join(ROOT, '..', 'shared', 'data', 'tinystories'))
HAVE_TEXT = all(os.path.isfile(os.path.join(TEXT_DIR, f)) for f in ('train.txt', 'valid.txt'))
NO_TEXT = f'no real text: set TINYSTORIES_DIR to a folder with train.txt and valid.txt (tried {TEXT_DIR})'
# One torch thread in the test process: its models are tiny, and two threads that wait for a core spin.
# Measured on the shared 2-core machine (load 5 to 7): test_represent's TestRecover took 1.1 and 1.4 s
# of CPU at one thread, 4.5 and 29.5 s at two; test_compile's test_training_tracks_float32 2.4 and
# 2.5 s against 63 and 46 s. (The scripts the tests start as processes choose their own threads.)
torch.set_num_threads(1)
os.environ.setdefault('OMP_NUM_THREADS', '1')     # and the commands run in this process: fixed, not measured

TINY = dict(vocab_size=64, n_ctx=24, d_model=32, n_layer=2, n_head=1, chunk_size=8, fft_threshold=16)


def tiny_model(name, seed=0, **kw):
    """A small random model of variant `name` whose biases and per-position vectors are
    perturbed away from their init, so that every parameter matters."""
    torch.manual_seed(seed)
    model = mixer.build_model(mixer.variant_config(name, **{**TINY, **kw})).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.split('.')[-1] in ('c', 'c2', 'v', 'w', 'W', 'W2', 'wpe', 'wpe_dec', 'bias'):
                p.add_(0.05 * torch.randn_like(p))
    return model


def heads(mixing, x):
    """A masked token mixing's heads of x float [B, T, d] (its proj_in, then split) -> [B, H, T, e]."""
    return rearrange(mixing.proj_in(x), 'b t (H e) -> b H t e', H=mixing.n_head)


def merge(mixing, y):
    """The heads y float [B, H, T, e] of a masked token mixing concatenated and projected (proj_out) -> [B, T, d]."""
    return mixing.proj_out(rearrange(y, 'b H t e -> b t (H e)'))


def encode_split(enc, stories):
    """The reference encoding of a list of stories (str), each followed by <|endoftext|>, all at once ->
    uint16 numpy array [n_tokens]: what data/prepare.py's encode_stream must write, byte for byte."""
    ids = []
    for toks in enc.encode_ordinary_batch(stories):
        ids.extend(toks)
        ids.append(enc.eot_token)
    return np.array(ids, dtype=np.uint16)


def step_pieces(model, idx, cuts, tensor_pos=False):
    """model.step over idx long [B, T] in pieces of `cuts` tokens (each a step of that many tokens after
    the ones before, on one set of buffers from model.init_state) -> the logits after each piece: float
    [B, len(cuts), vocab]. The position an int (an eager step), or with tensor_pos a 0-dim tensor (the
    compiled step's: every buffer read at n_ctx, masked)."""
    layers, pos, outs = model.init_state(idx.shape[0]), 0, []
    with torch.no_grad():
        for n in cuts:
            outs.append(model.step(idx[:, pos:pos + n], layers, torch.tensor(pos) if tensor_pos else pos))
            pos += n
    return torch.stack(outs, 1)


def assert_samples(test, stdout, prompt, count, new_tokens):
    """sample.py's output holds `count` samples, each `new_tokens` tokens past the
    prompt (the count sample.py reads off the generated tensor) and longer than it."""
    parts = stdout.split('--- sample ')[1:]
    test.assertEqual(len(parts), count, stdout)
    for part in parts:
        header, _, text = part.partition('\n')
        test.assertIn(f'{new_tokens} new tokens)', header)
        test.assertTrue(text.startswith(prompt), text[:200])
        test.assertGreater(len(text.strip()), len(prompt), text)


def run(*args, **kw):
    """Run a project script with the current Python -> CompletedProcess (text)."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, **kw)


def start(*args, env=None):
    """Start a project script with the current Python, one torch thread (OMP_NUM_THREADS=1) unless
    `env` says otherwise, stdout and stderr to temporary files (a pipe nobody reads could fill and
    stop it) -> Popen; finished(p) waits for it. For command lines that run side by side."""
    out, err = tempfile.TemporaryFile('w+'), tempfile.TemporaryFile('w+')
    p = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=out, stderr=err, text=True,
                         env=env or {**os.environ, 'OMP_NUM_THREADS': '1'})
    p.files = out, err
    return p


def finished(p):
    """Popen p (from start) waited for -> CompletedProcess (text); the same one on a second call
    (a test reads it, the class's tearDown waits for it again)."""
    if not hasattr(p, 'result'):
        p.wait()
        texts = []
        for f in p.files:
            f.seek(0)
            texts.append(f.read())
            f.close()
        p.result = subprocess.CompletedProcess(p.args, p.returncode, *texts)
    return p.result


# the warning filters a Python process starts with (ResourceWarning ignored, ...): unittest's runner shows
# every warning, but run_in_process shows what the command shows (at import, before the runner runs)
PROCESS_WARNING_FILTERS = list(warnings.filters)


@contextlib.contextmanager
def captured_output():
    """stdout and stderr captured at their file descriptors (what C code writes counts too) and
    at sys.stdout / sys.stderr -> a namespace whose .stdout and .stderr (str) are set on exit."""
    got = SimpleNamespace(stdout='', stderr='')
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            stream.flush()
    files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    saved = [os.dup(1), os.dup(2)]
    streams = sys.stdout, sys.stderr
    os.dup2(files[0].fileno(), 1)
    os.dup2(files[1].fileno(), 2)
    sys.stdout, sys.stderr = (io.TextIOWrapper(open(fd, 'wb', buffering=0, closefd=False), write_through=True)
                              for fd in (1, 2))
    try:
        yield got
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = streams
        for fd, old in zip((1, 2), saved):
            os.dup2(old, fd)
            os.close(old)
        for f, name in zip(files, ('stdout', 'stderr')):
            f.seek(0)
            setattr(got, name, f.read().decode('utf-8', errors='replace'))
            f.close()


def run_in_process(*args, env=None, timeout=None, stdout=None):
    """Run a project command line (python args..., as run() takes it: a script path or -m
    module, then its arguments) in this process: the script's own __main__ code through
    runpy, with sys.argv, sys.path[0], the working directory (ROOT) and `env` as the
    interpreter would set them (and torch's threads from env's OMP_NUM_THREADS and the warning
    filters, as a process would have them), stdout and stderr captured at their file descriptors. An
    exception that escapes is printed as the interpreter prints it (a traceback, exit 1);
    SystemExit gives the exit code as the interpreter does. The working directory, the
    environment, sys.argv, sys.path, torch's thread count and the SIGINT / SIGTERM handlers
    are put back afterwards. timeout: seconds after which the whole test process is stopped
    with every thread's traceback (a hang must not hang the suite). stdout: where the command's stdout
    goes instead of the capture (its .stdout then ''), unbuffered as under python -u: 'closed', a pipe whose
    reader has gone (`| head -1` after its line), or a file's path ('/dev/full') -> CompletedProcess (text).
    Under --fast, a Python process the command starts (a pool's) stops the test, as run() would (SkipTest)."""
    if args[0] == '-m':
        target, argv, path0 = args[1], list(args[2:]), ROOT
    else:
        target, argv = os.path.join(ROOT, args[0]), list(args[1:])
        path0 = os.path.dirname(target)
    state = (os.getcwd(), dict(os.environ), sys.argv, list(sys.path), torch.get_num_threads(),
             signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    refused = refused_python_processes()
    if timeout:
        faulthandler.dump_traceback_later(timeout, exit=True)
    try:
        os.chdir(ROOT)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
            if env.get('OMP_NUM_THREADS', '').isdigit():      # what a process started with it would use
                torch.set_num_threads(int(env['OMP_NUM_THREADS']))
        sys.argv = [args[0] if args[0] != '-m' else target, *argv]     # -m: runpy sets the module's path
        sys.path.insert(0, path0)
        with captured_output() as got, warnings.catch_warnings():
            warnings.filters[:] = PROCESS_WARNING_FILTERS
            if stdout is not None:
                fds = os.pipe() if stdout == 'closed' else (None, os.open(stdout, os.O_WRONLY))
                if fds[0] is not None:
                    os.close(fds[0])
                os.dup2(fds[1], 1)                  # captured_output puts fd 1 back
                os.close(fds[1])
            try:
                if args[0] == '-m':         # a module the tests imported: out of sys.modules for the run, as
                    imported = sys.modules.pop(target, None)     # in a fresh process (runpy warns otherwise)
                    try:
                        runpy.run_module(target, run_name='__main__', alter_sys=True)
                    finally:
                        if imported is not None:
                            sys.modules[target] = imported
                else:
                    runpy.run_path(target, run_name='__main__')
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if not isinstance(e.code, int) and e.code is not None:
                    print(e.code, file=sys.stderr)
            except (KeyboardInterrupt, unittest.SkipTest):     # Ctrl-C; --fast stopping the test
                raise
            except BaseException:
                traceback.print_exc()
                code = 1
    finally:
        if timeout:
            faulthandler.cancel_dump_traceback_later()
        cwd, environ, sys.argv, sys.path[:], threads, sigint, sigterm = state
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)
        signal.signal(signal.SIGINT, sigint)
        signal.signal(signal.SIGTERM, sigterm)
    if refused_python_processes() > refused:       # --fast refused a pool's process, and the command caught that
        raise unittest.SkipTest(FAST_SKIP)
    return subprocess.CompletedProcess(['python', *args], code, got.stdout, got.stderr)


def run_experiment(name, *args):
    """python -m experiments.`name` args... --workers 1 in this process (run_in_process) -> CompletedProcess: an
    experiment's rows, numbers and cache, on one pool process. Each process costs 3.5 s of CPU (torch's and
    torch._dynamo's imports); the commands as processes with pools of two, and their Ctrl-C, are test_faults_ctrl_c's
    and test_faults_experiments'."""
    return run_in_process('-m', f'experiments.{name}', *args, '--workers', '1')


# ----------------------------------------------------------------------------- --fast (tests/conftest.py)

FAST_SKIP = '--fast: starts a Python process (python test_mixer.py runs it)'


def is_python(prog):
    """True if `prog` (a path or command name) is a Python interpreter."""
    prog = os.fsdecode(prog)
    return os.path.basename(prog).startswith('python') or os.path.realpath(prog) == os.path.realpath(sys.executable)


_REFUSED = [0]          # Python processes python_processes_forbidden() refused so far


def refused_python_processes():
    """How many Python processes python_processes_forbidden() has refused to start so far: a test
    (or class setup) during which this grew tried to start one, and whatever error followed is
    that (tests/conftest.py reports it as --fast's skip)."""
    return _REFUSED[0]


@contextlib.contextmanager
def python_processes_forbidden():
    """--fast (tests/conftest.py): inside, a test that starts a Python process (a project script, torchrun, a
    spawned pool process, inductor's compiler probes and workers) is stopped at that moment by
    unittest.SkipTest(FAST_SKIP), and counted (refused_python_processes): the edit loop runs what runs
    in this process, and no test needs marking (a new module's tests sort themselves). Other
    programs (git, true) still start."""
    import multiprocessing.util
    popen_init, spawn = subprocess.Popen.__init__, multiprocessing.util.spawnv_passfds

    def refuse():
        _REFUSED[0] += 1
        raise unittest.SkipTest(FAST_SKIP)

    def guarded_popen(self, args, *a, **kw):
        prog = args if isinstance(args, (str, bytes, os.PathLike)) else args[0]
        if is_python(prog.split()[0] if isinstance(prog, str) and kw.get('shell') else prog):
            refuse()
        popen_init(self, args, *a, **kw)

    def guarded_spawn(path, args, passfds):
        if is_python(path):
            refuse()
        return spawn(path, args, passfds)
    subprocess.Popen.__init__, multiprocessing.util.spawnv_passfds = guarded_popen, guarded_spawn
    try:
        yield
    finally:
        subprocess.Popen.__init__, multiprocessing.util.spawnv_passfds = popen_init, spawn


_DATA = {}
SHARED_ENV = 'TEST_MIXER_FIXTURES'     # where shared_fixtures() made prepared_data() and tiny_checkpoint()


def shared_fixtures():
    """prepared_data() and tiny_checkpoint() made once, in this process, for every process of a parallel run
    (tests/conftest.py, before pytest-xdist starts its workers), where each process made its own (a few CPU
    seconds each): their folder put in $TEST_MIXER_FIXTURES, which the workers inherit, and removed at this
    process's exit -> that folder; None without the real text or when making them failed (each process then
    makes its own, and fails there)."""
    try:
        root = os.path.dirname(prepared_data())
        tiny_checkpoint()
    except (unittest.SkipTest, AssertionError) as e:
        print(f'tests: the shared fixtures were not made ({str(e).strip()[-300:] or type(e).__name__}); '
              'each process makes its own', file=sys.stderr)
        return None
    os.environ[SHARED_ENV] = root
    return root


def shared_fixture(*parts):
    """The path under $TEST_MIXER_FIXTURES of a fixture made once before every test process started
    (shared_fixtures: read only, as every fixture here), or None where there is none."""
    root = os.environ.get(SHARED_ENV)
    path = os.path.join(root, *parts) if root else None
    return path if path and os.path.exists(path) else None


def prepared_data(whole=False):
    """The tests' data dir, prepared once by data/prepare.py (in this process, or once for every process
    of a parallel run: shared_fixtures; 512-token BPE): from slices of the real text (400 kB
    train.txt and 100 kB valid.txt, beside the dir), or with whole=True from all of it (claims.py's retrieval
    rows need its 1,841 validation stories). -> path of a dir with train.bin, val.bin, meta.json,
    tokenizer.tiktoken."""
    if not HAVE_TEXT:
        raise unittest.SkipTest(NO_TEXT)
    key = 'whole' if whole else 'dir'
    if key == 'dir' and key not in _DATA and shared_fixture('data', 'meta.json'):
        _DATA[key] = shared_fixture('data')
    if key not in _DATA:
        tmp = tempfile.mkdtemp(prefix='mixer_test_')
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)      # a run leaves nothing behind in /tmp
        src = {name: os.path.join(TEXT_DIR if whole else tmp, name) for name in ('train.txt', 'valid.txt')}
        for name, size in (('train.txt', 400_000), ('valid.txt', 100_000)) if not whole else ():
            with open(os.path.join(TEXT_DIR, name), encoding='utf-8') as f:
                text = f.read(size)
            with open(src[name], 'w', encoding='utf-8') as f:
                f.write(text[:text.rindex('<|endoftext|>')])
        out = os.path.join(tmp, 'data')
        from data import prepare            # in this process: a fixture, not prepare.py's command line
        with captured_output() as got:
            code = prepare.main(['--train', src['train.txt'], '--valid', src['valid.txt'], '--out', out,
                                 '--vocab_size', '512'])
        assert code == 0, got.stderr
        _DATA[key] = out
    return _DATA[key]


def tiny_checkpoint():
    """A checkpoint made once by train.py (in this process) on prepared_data(): a flat mixer, d_model 32,
    2 layers, n_ctx 128, after 2 steps (still in the learning-rate warm-up, so close to
    its init, whose uniform causal mixing makes the last token's vector a bag of the
    text's words: a small but clear retrieval signal); made once for every process of a parallel run where
    shared_fixtures made it. -> path of ckpt.pt"""
    if 'tiny_ckpt' not in _DATA and shared_fixture('tiny_ckpt', 'ckpt.pt'):
        _DATA['tiny_ckpt'] = shared_fixture('tiny_ckpt', 'ckpt.pt')
    if 'tiny_ckpt' not in _DATA:
        beside = os.path.dirname(prepared_data())
        if prepared_data() == shared_fixture('data'):      # not in the shared folder: its own
            beside = tempfile.mkdtemp(prefix='mixer_test_')
            atexit.register(shutil.rmtree, beside, ignore_errors=True)
        out = os.path.join(beside, 'tiny_ckpt')
        r = run_in_process('train.py', f'--data_dir={prepared_data()}', '--d_model=32', '--n_layer=2', '--n_ctx=128',
                '--batch_size=8', '--max_iters=2', '--eval_interval=2', '--eval_windows=4', '--log_interval=2',
                f'--out_dir={out}', '--overwrite=True')     # its own folder: one --fast's clock stopped is made again
        assert r.returncode == 0, r.stderr
        _DATA['tiny_ckpt'] = os.path.join(out, 'ckpt.pt')
    return _DATA['tiny_ckpt']


def read_log(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


def cached_results(out):
    """The result.json of every job an experiment's runner cached under folder `out` -> list of paths."""
    return [os.path.join(d, 'result.json') for d, _, files in os.walk(out) if 'result.json' in files]
