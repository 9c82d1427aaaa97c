"""Faults at every entry point (issue #35): python test_mixer.py test_faults test_faults_outputs

Every entry point (train.py, sample.py, retrieval.py, data/prepare.py, python -m
experiments.claims | icl | represent | bench | mqar, test_mixer.py) meets bad input and faults
with a non-zero exit (2 for a user's mistake, 1 for a run that stopped, 130 on Ctrl-C),
no Python traceback, one line on stderr naming the cause, and every file that was there
before byte-identical afterwards (never a half-written output, nothing a user made
overwritten unless asked).

    TestBadInput         the table: one command a row, its bad input, its exit code and the
                         words its one stderr line must hold; the folders it touches hashed
                         before and after
    TestRunCommand       cli.run_command, the one Ctrl-C and closed-stdout handler of the commands
    TestInterrupt        Ctrl-C in the work of sample.py, retrieval.py, look, prepare.py and represent:
                         one line naming what is kept, exit 130, nothing half-written
    TestRunFolder        train.py's run folder: a refused start, two runs at once, --overwrite,
                         kill -9 and resume, a full disk, a file size limit, Ctrl-C (while
                         training, during a save, just after one)
    (tests/test_faults_outputs.py: the caches and outputs, two DDP ranks, icl's noise; the
    helpers and fixtures both share: tests/faults.py)

Lines that are not the one error line are allowed only where the behaviour calls for
them, and each such case says so: argparse's usage lines above its 'prog: error:' line,
and on a resume after kill -9 the warning naming the dropped log records. '.lock' (the
run folder lock, which holds the pid of the last run) is not hashed. Subprocesses run
with OMP_NUM_THREADS=1: two-thread runs of these tiny models on a shared 2-core machine
take 100 times longer.
"""

import concurrent.futures
import os
import pkgutil
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from types import SimpleNamespace
from unittest import mock

import torch

from tests.common import ROOT, run, run_in_process
from tests.faults import (ENV, TINY, Base, ckpt_step, default_sigint, error_lines, hashes, kill_session,
                          popen, records, run_copy, train)


# ----------------------------------------------------------------------------- the table

def table(f):
    """The rows: (name, argv of python, exit code, words of the one stderr line, folders or files whose
    every file must stay byte-identical, skip reason or None)."""
    fresh = tempfile.mkdtemp(dir=f.tmp, prefix='table_')   # each call its own folders: the rows run twice
    out = os.path.join(fresh, 'out')                     # fresh run folders, one a row
    t = ['train.py', *TINY]
    data = f'--data_dir={f.data}'
    no_cuda = None if not torch.cuda.is_available() else 'CUDA is available here'
    resume_other = run_copy(f, f'{os.path.basename(fresh)}/resume_other_tokenizer', stale_record=True)
    corrupt_run = os.path.dirname(f.corrupt_ckpt)
    held = run_copy(f, f'{os.path.basename(fresh)}/held')
    sample = ['sample.py', '--ckpt', f.ckpt, '--max_new_tokens', '4', '--num_samples', '1']
    ret = ['retrieval.py', '--ckpt', f.ckpt, '--data_dir', f.data, '--max_pairs', '60', '--steps', '5',
           '--cache_dir', os.path.join(fresh, 'retrieval_cache')]
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
        ('retrieval: a --cache_dir that cannot be written', given(ret, '--cache_dir', f.bad), 2,
         ['--cache_dir'], [], None),
        ('retrieval: an unknown --device', [*ret, '--device', 'tpu'], 2, ['tpu'], [], None),
        ('retrieval: token ids the tokenizer does not have',
         given(ret, '--data_dir', f.big_id), 2, ['token id 600', '512 tokens'], [f.big_id], None),
        ('retrieval: a corrupt meta.json', given(ret, '--data_dir', f.bad_meta), 2, ['meta.json', 'damaged'],
         [f.bad_meta], None),
        ("retrieval: a tokenizer that is not meta.json's", given(ret, '--data_dir', f.swapped), 2,
         [f.sha, f.other_sha], [f.swapped], None),
        # data/prepare.py
        ('prepare: an --out that cannot be written', [*prep, '--out', f.bad], 2, ['prepare.py: error:'], [], None),
        ('prepare: --vocab_size out of range', [*prep[:-1], '10', '--out', os.path.join(fresh, 'p1')], 2,
         ['--vocab_size'], [], None),
        ('prepare: an --out that holds prepared data of other settings', [*prep[:-1], '400', '--out', f.other], 2,
         ['already holds prepared data', '--overwrite'], [f.other], None),
        ('prepare: a missing --train file', ['data/prepare.py', '--train', f'{f.tmp}/nowhere.txt', '--valid',
                                             prep[4], '--out', os.path.join(fresh, 'p2')], 2, ['not found'], [], None),
        # python -m experiments.claims
        ('claims: an --out that cannot be written', [*claims, '--out', f.bad], 2, ['cannot write'], [], None),
        ('claims: a corrupt meta.json', [*given(claims, '--data_dir', f.bad_meta), '--out', os.path.join(fresh, 'c1')], 2,
         ['meta.json', 'damaged'], [f.bad_meta], None),
        ('claims: an unknown model', [*claims, '--models', 'nope', '--out', os.path.join(fresh, 'c2')], 2,
         ['nope'], [], None),
        # python -m experiments.represent
        ('represent: a --json that cannot be written', [*rep, '--json', os.path.join(f.bad, 'r.json')], 2,
         ['cannot write'], [], None),
        ('represent: --json names an existing file', [*rep, '--json', f.old_json], 2, ['exists', '--overwrite'],
         [f.old_json], None),
        ("represent: a data dir of another tokenizer than the checkpoint's", [*rep, '--data_dir', f.other], 2,
         ['another tokenizer', f.sha, f.other_sha], [f.other, f.ckpt], None),
        ('represent: --T longer than n_ctx', given(rep, '--T', '1000'), 2, ['n_ctx'], [], None),
        # python -m experiments.bench (argparse: its usage lines above the error line are allowed)
        ('bench: a negative --warmup', [*bench, '--warmup', '-1'], 2, ['--warmup'], [], None),
        ('bench: --vocab_size 0', [*bench, '--vocab_size', '0'], 2, ['error'], [], None),
        ('bench: a --d_model the heads do not divide', [*bench, '--d_model', '30'], 2, ['divisible'], [], None),
        # python -m experiments.icl
        ('icl: an --out that cannot be written', ['-m', 'experiments.icl', '--quick', '--out', f.bad], 2,
         ['cannot write'], [], None),
        ('icl: a ladder without its 1x rung', ['-m', 'experiments.icl', '--quick', '--ladder_budgets', '2,3', '--out',
                                              os.path.join(fresh, 'icl_ladder')], 2, ['ladder_budgets', 'hold 1'], [],
         None),
        # python -m experiments.mqar
        ('mqar: an --out that cannot be written', ['-m', 'experiments.mqar', '--quick', '--out', f.bad], 2,
         ['cannot write'], [], None),
        ('mqar: a cell whose pairs do not fit', ['-m', 'experiments.mqar', '--quick', '--cells', '16:5', '--out',
                                                os.path.join(fresh, 'mqar_cells')], 2, ['T=16', 'kv=5'], [], None),
        ('mqar: --device cuda without CUDA', ['-m', 'experiments.mqar', '--quick', '--device', 'cuda', '--out',
                                             os.path.join(fresh, 'mqar_cuda')], 2, ['CUDA'], [], no_cuda),
        # test_mixer.py
        ('test_mixer: an unknown option', ['test_mixer.py', '--nonsense'], 2, ['unknown option'], [], None),
        ('test_mixer: an unknown module', ['test_mixer.py', 'test_nope'], 2, ['no test module'], [], None),
    ]


def given(argv, flag, value):
    """argv with the value of its `flag` replaced by `value` (a flag given twice is refused)."""
    i = argv.index(flag)
    return [*argv[:i + 1], value, *argv[i + 2:]]


# the row of each entry point that also runs as a real process (test_each_command_line_...): the one that
# goes furthest into its program (checkpoint and data read, or argparse's usage lines)
PROCESS_ROWS = ('train: the tokenizer changed under a resume', 'sample: a corrupt checkpoint',
                "retrieval: a tokenizer that is not meta.json's", 'prepare: a missing --train file',
                'claims: a corrupt meta.json', "represent: a data dir of another tokenizer than the checkpoint's",
                'bench: a --d_model the heads do not divide', 'icl: a ladder without its 1x rung',
                'mqar: a cell whose pairs do not fit', 'test_mixer: an unknown module')


class TestBadInput(Base):
    """Each row of table(): a command meets bad input -> its exit code, no traceback, one line naming the
    cause, the files it was given byte-identical. Every row runs in this process (the script's __main__
    code through runpy, stdout and stderr read at their file descriptors: tests.common.run_in_process),
    which spares each row the 3 to 6 s start of a Python that imports torch; one row of each entry
    point (PROCESS_ROWS) also runs as a real process, two at a time, for what only a process shows
    (the interpreter's start, output at import, the exit status it returns)."""

    def check_rows(self, rows, runner):
        """Run the rows that are not skipped here with runner(row) -> CompletedProcess and check each."""
        f = self.f
        todo = [row for row in rows if row[5] is None]
        before = hashes(f.data, f.ckpt, *{p for row in todo for p in row[4]})
        results = runner(todo)
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

    def test_every_entry_point_refuses_bad_input_in_one_line(self):
        self.check_rows(table(self.f), lambda todo: [run_in_process(*row[1], env=ENV, timeout=600) for row in todo])

    def test_each_command_line_refuses_bad_input_in_one_line(self):
        rows = [row for row in table(self.f) if row[0] in PROCESS_ROWS]
        self.assertEqual(sorted(row[0] for row in rows), sorted(PROCESS_ROWS))
        self.assertEqual({entry_point(row[1]) for row in rows}, {entry_point(row[1]) for row in table(self.f)})

        def in_processes(todo):
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                return list(pool.map(lambda row: run(*row[1], env=ENV, timeout=600), todo))
        self.check_rows(rows, in_processes)


def entry_point(argv):
    """The program a row's argv runs: a script path, or the module of -m."""
    return argv[1] if argv[0] == '-m' else argv[0]


# ----------------------------------------------------------------------------- Ctrl-C in every command

def leftovers(folder):
    """The temporary files and folders under `folder` (names with '.tmp', or cli.written's .NAME.tmpPID and
    .NAME.oldPID: every output's, checkpoints' and prepare's among them) -> sorted list of paths."""
    from harness.cli import TEMP_NAME
    return sorted(os.path.join(d, n) for d, ds, ns in os.walk(folder) for n in ns + ds
                  if '.tmp' in n or TEMP_NAME.match(n))


class TestRunCommand(unittest.TestCase):
    """cli.run_command, the one handler every command's main goes through (sample.py, retrieval.py,
    experiments.look, data/prepare.py, experiments.represent)."""

    def run_work(self, work, kept=None, exits=False):
        """run_command('prog.py', work, kept=kept, exits=exits), stdout and stderr captured -> (status,
        stdout, stderr)."""
        from tests.common import captured_output
        from harness.cli import run_command
        try:
            with captured_output() as got:
                code = run_command('prog.py', work, kept=kept, exits=exits)
        except KeyboardInterrupt:
            self.fail('KeyboardInterrupt escaped run_command')     # (the test runner would stop on it)
        return code, got.stdout, got.stderr

    def test_the_status_and_a_bad_inputs_exit_go_through(self):
        from harness import cli
        self.assertEqual(self.run_work(lambda: None)[0], 0)
        self.assertEqual(self.run_work(lambda: 3)[0], 3)
        with self.assertRaises(SystemExit) as stop:
            self.run_work(lambda: cli.fail('bad', 'prog.py'))
        self.assertEqual(stop.exception.code, 2)

    def test_ctrl_c_is_one_line_naming_what_is_kept_and_130(self):
        def work():
            print('half a table')
            raise KeyboardInterrupt
        code, out, err = self.run_work(work, kept='what finished is cached')
        self.assertEqual((code, out), (130, 'half a table\n'))
        self.assertEqual(err, 'prog.py: interrupted (Ctrl-C); what finished is cached\n')
        self.assertEqual(self.run_work(work)[2], 'prog.py: interrupted (Ctrl-C)\n')

    def test_a_real_sigint_and_a_second_one_while_the_work_cleans_up(self):
        """SIGINT at Python's default handler: the first raises KeyboardInterrupt in the work, a second one
        while the work's finally cleans up is ignored (the cleanup runs to its end), then one line, 130;
        the SIGINT handler is Python's default again afterwards."""
        cleaned = []

        def work():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)                               # never reached: the signal stops the work
            finally:
                os.kill(os.getpid(), signal.SIGINT)         # a second Ctrl-C while stopping
                time.sleep(0.05)
                cleaned.append(True)
        before = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            code, _, err = self.run_work(work)
            after = signal.getsignal(signal.SIGINT)
        finally:
            signal.signal(signal.SIGINT, before)
        self.assertEqual((code, err, cleaned), (130, 'prog.py: interrupted (Ctrl-C)\n', [True]))
        self.assertIs(after, signal.default_int_handler)

    def test_a_command_that_exits_keeps_sigint_ignored_after_a_ctrl_c(self):
        """exits=True (an experiment's command, runner.command): after a real Ctrl-C SIGINT stays ignored,
        so a second one while its pool's finalizers run at exit is no traceback (it was, one run in a few
        of test_faults_experiments' two-SIGINT test); after work that ended well the handler is restored."""
        def stopped():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)                                   # never reached: the signal stops the work
        before = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            code = self.run_work(stopped, exits=True)[0]
            after_stop = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.run_work(lambda: None, exits=True)
            after_ok = signal.getsignal(signal.SIGINT)
        finally:
            signal.signal(signal.SIGINT, before)
        self.assertEqual(code, 130)
        self.assertEqual(after_stop, signal.SIG_IGN)
        self.assertIs(after_ok, signal.default_int_handler)

    def test_a_closed_stdout_is_a_quiet_exit_1(self):
        """A print to a reader that went away, on the stdout of a command cli.begin started: exit 1, quietly."""
        from harness import cli

        def work():
            sys.stdout = cli._Stream(sys.stdout, 'prog.py', keep=False)      # (captured_output puts it back)
            r, w = os.pipe()
            os.close(r)
            os.dup2(w, sys.stdout.fileno())                                  # (and fd 1)
            os.close(w)
            print('a line nobody reads', flush=True)
            raise AssertionError('the work went on')
        with self.assertRaises(SystemExit) as stop:
            self.run_work(work)
        self.assertEqual(stop.exception.code, 1)


class TestInterrupt(Base):
    """Ctrl-C in the work of each command that is not an experiment of experiments/runner.py (those:
    tests/test_faults_outputs.py): a KeyboardInterrupt raised by a call inside the work, as SIGINT raises
    it in the main thread -> exit 130, no traceback, one line 'PROG: interrupted (Ctrl-C)' naming what is
    kept, and nothing half-written: no new output, the old ones byte-identical, no temporary file."""

    def interrupt(self, argv, target, after=1, half=None, allow=()):
        """Run python argv (in this process) with `target` ('module.attr') raising KeyboardInterrupt on its
        `after`-th call, after half(*args) (a write cut short) when given -> the line (assert_fault)."""
        calls, real = [], pkgutil.resolve_name(target)

        def stop(*a, **kw):
            calls.append(1)
            if len(calls) < after:
                return real(*a, **kw)
            if half:
                half(*a)
            raise KeyboardInterrupt
        with mock.patch(target, stop):
            try:
                r = run_in_process(*argv, env=ENV, timeout=300)
            except KeyboardInterrupt:
                self.fail(f'KeyboardInterrupt escaped {entry_point(argv)}')
        self.assertGreaterEqual(len(calls), after, f'staging: {target} was not called {after} times')
        return self.assert_fault(r, 130, [], allow=allow)

    def folder(self, name):
        """A fresh folder for a test's outputs -> its path."""
        return tempfile.mkdtemp(dir=self.f.tmp, prefix=f'{name}_')

    def test_sample(self):
        line = self.interrupt(['sample.py', '--ckpt', self.f.ckpt, '--max_new_tokens', '20', '--num_samples', '1',
                               '--temperature', '1'], 'torch.multinomial', after=3)
        self.assertEqual(line, 'sample.py: interrupted (Ctrl-C)')

    def test_retrieval(self):
        """While embedding the texts: the line names the cache folder (what is kept); no --json, no
        temporary file in the cache."""
        out = self.folder('retrieval_ctrl_c')
        cache, result = os.path.join(out, 'cache'), os.path.join(out, 'r.json')
        line = self.interrupt(['retrieval.py', '--ckpt', self.f.ckpt, '--data_dir', self.f.data, '--max_pairs', '60',
                               '--steps', '5', '--cache_dir', cache, '--json', result], 'mixer.LanguageModel.hidden',
                              allow=[r': \d+ pairs, \d+ train / \d+ test'])
        self.assertEqual(line, f'retrieval.py: interrupted (Ctrl-C); the embeddings computed so far are cached in '
                               f'{cache}')
        self.assertFalse(os.path.exists(result))
        self.assertEqual(leftovers(out), [])

    def test_look(self):
        """While the figure is being written (half of it on disk): no figure, no temporary file."""
        out = self.folder('look_ctrl_c')
        figure = os.path.join(out, 'look.png')

        def half(fig, path, *a):
            with open(path, 'wb') as fh:
                fh.write(b'\x89PNG half')
        line = self.interrupt(['-m', 'experiments.look', '--ckpt', self.f.ckpt, '--out', figure],
                              'matplotlib.figure.Figure.savefig', half=half)
        self.assertEqual(line, 'look.py: interrupted (Ctrl-C)')
        self.assertEqual(os.listdir(out), [])

    def test_prepare(self):
        """While meta.json, the last output, is written (every other output in its temporary file): --out
        byte-identical to before, no temporary file; the line says so."""
        out = os.path.join(self.folder('prepare_ctrl_c'), 'data')
        shutil.copytree(self.f.other, out)
        before = hashes(out)
        text = os.path.dirname(self.f.data)

        def half(obj, fh, *a):
            fh.write('{"vocab_size": ')
        line = self.interrupt(['data/prepare.py', '--train', os.path.join(text, 'train.txt'), '--valid',
                               os.path.join(text, 'valid.txt'), '--tokenizer',
                               os.path.join(self.f.other, 'tokenizer.tiktoken'), '--out', out, '--overwrite'],
                              'json.dump', half=half)
        self.assertEqual(line, 'prepare.py: interrupted (Ctrl-C); --out is as it was: run the same command again')
        self.assertEqual(hashes(out), before)
        self.assertEqual(leftovers(out), [])

    def test_represent(self):
        """In the middle of a recovery: no --json."""
        out = self.folder('represent_ctrl_c')
        line = self.interrupt(['-m', 'experiments.represent', '--quick', '--variants', 'flat', '--steps', '20',
                               '--json', os.path.join(out, 'r.json')], 'torch.Tensor.backward', after=3)
        self.assertEqual(line, 'represent.py: interrupted (Ctrl-C)')
        self.assertEqual(os.listdir(out), [])


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
                self.assert_fault(train(f'--out_dir={out}', *args, in_process=True), 2, [])
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
            while a.poll() is None and b.poll() is None and time.time() - t0 < 600:
                time.sleep(0.1)
            loser, winner = (a, b) if a.poll() is not None else (b, a)
            _, err = loser.communicate(timeout=600)
            r = SimpleNamespace(returncode=loser.returncode, stdout='', stderr=err)
            self.assert_fault(r, 2, ['in use by another run', f'pid {winner.pid}'])
            while not os.path.exists(os.path.join(out, 'ckpt.pt')) and winner.poll() is None:
                time.sleep(0.1)
            os.killpg(winner.pid, signal.SIGINT)
            _, err = winner.communicate(timeout=300)
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
                '--eval_interval=1000', f'--out_dir={out}', env={**ENV, 'NAN_AT': '2'}, timeout=600)
        self.assert_fault(r, 1, ['non-finite', 'at step 2', 'no checkpoint was written'])
        self.assertFalse(os.path.exists(os.path.join(out, 'ckpt.pt')), "the old run's checkpoint is left")
        configs = [x['config'] for x in records(os.path.join(out, 'log.jsonl')) if x['event'] == 'config']
        self.assertEqual([c['max_iters'] for c in configs], [50], 'the log is not the new run alone')

    def test_resume_after_kill_9_repeats_no_step(self):
        """kill -9 after a checkpoint (step 10) and two more log lines; the resumed run's log holds every
        step once. Its stderr: the warning naming the dropped records (allowed: the behaviour calls for it)."""
        out = self.folder('kill9')
        r = run(self.f.wrapper, f'--data_dir={self.f.data}', *TINY, '--max_iters=20', '--eval_interval=5',
                '--log_interval=1', f'--out_dir={out}', env={**ENV, 'KILL_AT': '13'}, timeout=600)
        self.assertEqual(r.returncode, -signal.SIGKILL, r.stderr[-2000:])
        self.assertEqual(ckpt_step(os.path.join(out, 'ckpt.pt')), 10)
        steps = [x['step'] for x in records(os.path.join(out, 'log.jsonl')) if x['event'] == 'train']
        self.assertEqual(max(steps), 12, 'staging: the log should go past the checkpoint')
        r = train('--init_from=resume', f'--out_dir={out}', in_process=True)      # the resume: in this process
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertNotIn('Traceback', r.stderr)
        self.assertEqual(error_lines(r.stderr, allow=[r'warning: .*dropped 2 records after step 10']), [])
        log = records(os.path.join(out, 'log.jsonl'))
        for event, want in (('train', list(range(1, 21))), ('eval', [0, 5, 10, 15, 20])):
            self.assertEqual([x['step'] for x in log if x['event'] == event], want, event)

    def stopped_run(self, name):
        """A run folder holding a checkpoint of step 5 -> (folder, hashes of its files)."""
        out = self.folder(name)
        r = train('--max_iters=5', '--eval_interval=5', '--log_interval=5', f'--out_dir={out}', in_process=True)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        return out, hashes(os.path.join(out, 'ckpt.pt'))

    def assert_save_failed(self, r, out, before, words):
        """A resumed run whose save at step 10 failed: one line (words), exit 1; ckpt.pt is the step-5
        one, byte-identical; no temporary file (cli.written's .ckpt.pt.tmpPID); the log parses."""
        line = self.assert_fault(r, 1, ['could not write', 'holds step 5', 'resume: python train.py', *words])
        self.assertIn('at step 10', line)
        self.assertEqual(hashes(os.path.join(out, 'ckpt.pt')), before)
        self.assertEqual(leftovers(out), [])
        records(os.path.join(out, 'log.jsonl'))

    def test_disk_full_during_a_save(self):
        """torch.save meets a full disk (ENOSPC, staged by the wrapper): the line says so."""
        out, before = self.stopped_run('enospc')
        r = run(self.f.wrapper, f'--data_dir={self.f.data}', '--init_from=resume', '--max_iters=10',
                f'--out_dir={out}', env={**ENV, 'SAVE_FAIL_AT': '1'}, timeout=600)
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
                           text=True, timeout=600, preexec_fn=limit)
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

    def test_ctrl_c_between_checkpoints_keeps_the_step_reached(self):
        """SIGINT to the process group of a run paused by the wrapper in step 8 (its checkpoint of step 5
        written, the next due at 10): the run ends the step, saves it, exits 130 with one line naming the step
        reached, the step the checkpoint holds (8: nothing lost) and the resume command. Resumed, it trains to
        the losses of a run never stopped."""
        out, whole = self.folder('ctrl_c'), self.folder('ctrl_c_whole')
        pause = os.path.join(self.f.tmp, 'ctrl_c.paused')
        args = ['--eval_interval=5', '--save_interval=0', '--log_interval=1', '--lr_decay_iters=1000']
        p = popen([self.f.wrapper, f'--data_dir={self.f.data}', *TINY, *args, '--max_iters=1000', f'--out_dir={out}'],
                  env={**ENV, 'PAUSE_AT': '8', 'PAUSE_FILE': pause})
        try:
            t0 = time.time()
            while not os.path.exists(pause) and p.poll() is None and time.time() - t0 < 600:
                time.sleep(0.05)
            os.killpg(p.pid, signal.SIGINT)
            _, err = p.communicate(timeout=300)
        finally:
            kill_session(p)
        line = self.assert_fault(SimpleNamespace(returncode=p.returncode, stdout='', stderr=err), 130, [])
        self.assertEqual(self.interrupted(out, line), (8, 8))
        r = train('--init_from=resume', '--max_iters=12', f'--out_dir={out}', data=self.f.data, in_process=True)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        r = train(*args, '--max_iters=12', f'--out_dir={whole}', data=self.f.data, in_process=True)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        losses = [{x['step']: x['loss'] for x in records(os.path.join(d, 'log.jsonl')) if x['event'] == 'train'}
                  for d in (out, whole)]
        self.assertEqual(sorted(losses[0]), list(range(1, 13)))
        for step in range(1, 13):
            self.assertAlmostEqual(losses[0][step], losses[1][step], places=5, msg=f'step {step}')

    def test_ctrl_c_during_a_save(self):
        """Ctrl-C while the second checkpoint (step 10) is being written: no temporary file is left, and the
        line says which step ckpt.pt holds, as it does (5, or 10 if the save was let finish first)."""
        out = self.folder('ctrl_c_in_save')
        r = run(self.f.wrapper, f'--data_dir={self.f.data}', *TINY, '--max_iters=1000', '--eval_interval=5',
                f'--out_dir={out}', env={**ENV, 'SIGINT_IN_SAVE': '2'}, timeout=600)
        line = self.assert_fault(r, 130, [])
        self.assertIn(self.interrupted(out, line)[1], (5, 10))

    def test_ctrl_c_just_after_a_save(self):
        """Ctrl-C just after the second checkpoint (step 10) is in place: the line says ckpt.pt holds
        step 10, as it does."""
        out = self.folder('ctrl_c_after_save')
        r = run(self.f.wrapper, f'--data_dir={self.f.data}', *TINY, '--max_iters=1000', '--eval_interval=5',
                f'--out_dir={out}', env={**ENV, 'SIGINT_AFTER_SAVE': '2'}, timeout=600)
        line = self.assert_fault(r, 130, [])
        self.assertEqual(self.interrupted(out, line)[1], 10)


if __name__ == '__main__':
    unittest.main()
