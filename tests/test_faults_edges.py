"""The edges of every command (issue #64): python test_mixer.py test_faults_edges

    TestStart      Ctrl-C at a command's first heavy import (cli.begin), every module of experiments/ run as a file
                   (python experiments/look.py), --help to a reader that went away
    TestStdout     a reader that goes away (`| head -1`) and a full disk (`>/dev/full`) under the commands: a
                   quiet exit, or the work goes on and writes its files; one line naming a full disk
    TestSampling   sample.py at any temperature >= 0, a checkpoint of non-finite weights, a flag given twice,
                   a prompt that is not UTF-8
    TestMessages   a device as torch spells it, a damaged prepared folder, a checkpoint without a key, sizes
                   that cannot fit (train.py, bench.py's decode and generation tables)
    TestPeak       the matmul peak MFU is measured against, on a machine whose other processes take its cores

Every command runs in this process (tests.common.run_in_process), but the one test that runs each module of
experiments/ as a file, which needs a Python whose path holds no project folder.
"""

import builtins
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

import torch

from tests.common import ROOT, prepared_data, run_in_process, tiny_checkpoint
from tests.faults import ENV, TINY, error_lines

# every command and experiment a user runs, with what it prints as its name
COMMANDS = {('train.py',): 'train.py', ('sample.py',): 'sample.py', ('retrieval.py',): 'retrieval.py',
            ('data/prepare.py',): 'prepare.py',
            **{('-m', f'experiments.{m}'): f'{m}.py' for m in ('look', 'bench', 'claims', 'icl', 'mqar', 'represent',
                                                               'profiles', 'gpu_check', 'convert', 'eval_tasks',
                                                               'compare')}}
SPEED = r'^sample.py: [\d,]+ new tokens in [\d.]+ s, '     # sample.py's last line, on stderr: its tokens a second
KEEP = ('train.py', 'prepare.py', 'look.py', 'claims.py', 'icl.py', 'mqar.py', 'gpu_check.py', 'convert.py',
        'eval_tasks.py', 'compare.py')   # files


def folder(test, name):
    """A fresh folder for a test's outputs, removed after it -> its path."""
    path = tempfile.mkdtemp(prefix=f'mixer_{name}_')
    test.addCleanup(shutil.rmtree, path, ignore_errors=True)
    return path


class WithData(unittest.TestCase):
    """The prepared data (self.data) and the tiny checkpoint (self.ckpt) of tests.common, made in the class's
    setup (--fast skips a class whose setup runs past its second at once, rather than each test)."""

    @classmethod
    def setUpClass(cls):
        cls.data, cls.ckpt = prepared_data(), tiny_checkpoint()

    def assert_refused(self, r, *words):
        """r exited 2 with one line on stderr holding each of `words`, no traceback."""
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(len(error_lines(r.stderr)), 1, r.stderr)
        for w in words:
            self.assertIn(w, r.stderr)


class TestStart(unittest.TestCase):

    def test_ctrl_c_at_the_first_heavy_import_is_one_line_and_130(self):
        """SIGINT at the first import of a module that is not the standard library's (torch, numpy, the
        project) of every command: one line 'PROG: interrupted (Ctrl-C)', exit 130 (os._exit, here turned
        into SystemExit(130) so that this process lives on), no traceback."""
        real = builtins.__import__
        default = signal.signal(signal.SIGINT, signal.default_int_handler)   # a terminal's, not a background job's
        self.addCleanup(signal.signal, signal.SIGINT, default)               # (which starts with SIGINT ignored)
        for argv, prog in COMMANDS.items():
            fired = []

            def interrupting(name, globals=None, locals=None, fromlist=(), level=0):
                top = name.split('.')[0]
                if not fired and level == 0 and (globals or {}).get('__name__') == '__main__' and \
                        top not in sys.stdlib_module_names and top != 'harness':
                    fired.append(name)
                    os.kill(os.getpid(), signal.SIGINT)
                return real(name, globals, locals, fromlist, level)
            with self.subTest(prog), mock.patch('builtins.__import__', interrupting), \
                    mock.patch('os._exit', side_effect=SystemExit(130)):
                try:
                    r = run_in_process(*argv, '--help', env=ENV)
                except KeyboardInterrupt:
                    self.fail(f'{prog}: a traceback ending in KeyboardInterrupt at the import of {fired}')
                self.assertTrue(fired, 'staging: no import to interrupt')
                self.assertEqual((r.returncode, r.stderr), (130, f'{prog}: interrupted (Ctrl-C)\n'))

    def test_every_module_of_experiments_runs_as_a_file(self):
        """python experiments/NAME.py --help, for every module (in one Python whose path holds experiments/ and
        not the repository root, as a file's run has it; the project's modules imported afresh for each):
        a command prints its help (exit 0), any other module says in one line how to run what it is part of
        (exit 2); never ModuleNotFoundError."""
        names = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, 'experiments'))
                       if f.endswith('.py') and f != '__init__.py')
        script = '''
import contextlib, io, os, runpy, sys
root, names = sys.argv[1], sys.argv[2:]
here, base = os.path.join(root, 'experiments'), [p for p in sys.path if p and os.path.realpath(p) != root]
import torch
for name in names:
    for k, m in list(sys.modules.items()):
        if os.path.realpath(getattr(m, '__file__', None) or '/').startswith(root + os.sep):
            del sys.modules[k]
    sys.path[:], sys.argv = [here, *base], [os.path.join(here, name + '.py'), '--help']
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(sys.argv[0], run_name='__main__')
            code = 0
        except SystemExit as e:
            code = e.code
        except Exception as e:
            code = type(e).__name__
    print(name, code, err.getvalue().strip().replace(chr(10), ' | '), file=sys.__stdout__, flush=True)
'''
        r = subprocess.run([sys.executable, '-c', script, os.path.realpath(ROOT), *names], cwd=ROOT, env=ENV,
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        got = {line.split(' ', 1)[0]: line.split(' ', 2)[1:] for line in r.stdout.splitlines()}
        self.assertEqual(sorted(got), names, r.stdout)
        for name in names:
            with self.subTest(name):
                code, err = got[name] + [''] * (2 - len(got[name]))
                if ('-m', f'experiments.{name}') in COMMANDS:
                    self.assertEqual((code, err), ('0', ''))
                else:
                    self.assertEqual(code, '2', err)
                    self.assertRegex(err, rf'^{name}\.py: error: .*not a command: python -m experiments\.\w+')

    def test_help_to_a_reader_that_went_away_is_a_quiet_exit(self):
        """COMMAND --help | head -1 (output unbuffered, as under python -u): nothing on stderr; exit 0 where
        the command's result is a file (it goes on), else 1."""
        for argv, prog in COMMANDS.items():
            with self.subTest(prog):
                r = run_in_process(*argv, '--help', env=ENV, stdout='closed', timeout=600)
                self.assertEqual((r.returncode, r.stderr), (0 if prog in KEEP else 1, ''))


class TestStdout(WithData):

    def test_training_goes_on_and_saves_when_its_logs_reader_goes_away(self):
        out = folder(self, 'train_head')
        r = run_in_process('train.py', f'--data_dir={self.data}', *TINY, '--max_iters=4', '--eval_interval=2',
                           '--log_interval=1', f'--out_dir={out}', env=ENV, stdout='closed', timeout=300)
        self.assertEqual((r.returncode, r.stderr), (0, ''))
        self.assertEqual(torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['step'], 4)
        with open(os.path.join(out, 'log.jsonl')) as f:
            self.assertIn('"event": "summary"', f.read().splitlines()[-1])

    def test_prepare_writes_its_out_when_its_reader_goes_away(self):
        data, out = self.data, os.path.join(folder(self, 'prepare_head'), 'data')
        text = os.path.dirname(data)
        r = run_in_process('data/prepare.py', '--train', os.path.join(text, 'train.txt'), '--valid',
                           os.path.join(text, 'valid.txt'), '--tokenizer', os.path.join(data, 'tokenizer.tiktoken'),
                           '--out', out, env=ENV, stdout='closed', timeout=300)
        self.assertEqual((r.returncode, r.stderr), (0, ''))
        self.assertEqual(sorted(os.listdir(out)), ['meta.json', 'tokenizer.tiktoken', 'train.bin', 'val.bin'])
        for name in ('train.bin', 'val.bin'):
            self.assertEqual(os.path.getsize(os.path.join(out, name)), os.path.getsize(os.path.join(data, name)))

    def test_a_full_stdout_is_one_line_naming_it(self):
        """>/dev/full: exit 1, one line 'PROG: error: cannot write to stdout (No space left on device)'."""
        if not os.path.exists('/dev/full'):
            self.skipTest('no /dev/full here')
        out, ckpt = folder(self, 'full'), self.ckpt
        for argv in (['sample.py', '--ckpt', ckpt, '--max_new_tokens', '2', '--num_samples', '1'],
                     ['-m', 'experiments.look', '--ckpt', ckpt, '--no_figure'],
                     ['-m', 'experiments.bench', '--quick', '--device', 'cpu', '--tables', 'train'],
                     ['train.py', f'--data_dir={self.data}', *TINY, '--max_iters=2', f'--out_dir={out}']):
            prog = COMMANDS[tuple(argv[:2])] if argv[0] == '-m' else argv[0]
            with self.subTest(prog):
                r = run_in_process(*argv, env=ENV, stdout='/dev/full', timeout=300)
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertEqual(error_lines(r.stderr), [f'{prog}: error: cannot write to stdout (No space left on '
                                                         'device)'])


class TestSampling(WithData):

    def test_a_flag_of_one_value_given_twice_is_refused(self):
        """flags.ArgumentParser's one rule: sample.py --ckpt A --ckpt B sampled B alone; every command's flag
        of one value given twice is one line naming it (retrieval.py's repeatable --ckpt keeps its own rule:
        each checkpoint once)."""
        ckpt = self.ckpt
        for argv, flag in ((['sample.py', '--ckpt', ckpt, '--ckpt', ckpt], '--ckpt'),
                           (['sample.py', '--ckpt', ckpt, '--temp', '1', '--temperature', '0'], '--temperature'),
                           (['data/prepare.py', '--out', 'a', '--out', 'b'], '--out'),
                           (['-m', 'experiments.look', '--ckpt', ckpt, '--positions', '2', '--positions', '3'],
                            '--positions'),
                           (['-m', 'experiments.bench', '--tables', 'train', '--tables', 'decode'], '--tables'),
                           (['retrieval.py', '--ckpt', ckpt, '--ckpt', ckpt], '--ckpt')):
            with self.subTest(argv=argv[:2]):
                self.assert_refused(run_in_process(*argv, env=ENV), flag, 'give')

    def test_any_temperature_from_0_up_samples_and_near_0_is_greedy(self):
        """--temperature 1e-300, 5e-324 and 1e-45 (a traceback from torch.multinomial: inf / inf logits) sample,
        with and without top-k, the text of --temperature 0 (the limit); 1e300 samples too."""
        ckpt, texts = self.ckpt, {}
        for t in ('0', '1e-300', '5e-324', '1e-45', '1e300'):
            for top_k in ('0', '40'):
                r = run_in_process('sample.py', '--ckpt', ckpt, '--max_new_tokens', '12', '--num_samples', '2',
                                   '--temperature', t, '--top_k', top_k, env=ENV)
                with self.subTest(temperature=t, top_k=top_k):
                    self.assertEqual((r.returncode, error_lines(r.stderr, allow=(SPEED,))), (0, []), r.stderr)
                    texts[t, top_k] = r.stdout
        for t in ('1e-300', '5e-324', '1e-45'):
            self.assertEqual(texts[t, '0'], texts['0', '0'])
            self.assertEqual(texts[t, '40'], texts['0', '0'])

    def test_a_checkpoint_of_weights_that_are_not_finite_is_refused_greedy_too(self):
        """A NaN in one weight: one line naming the checkpoint and the weight (greedy printed text made
        from NaN logits, exit 0; sampling ended in torch.multinomial's traceback); the same for look."""
        state = torch.load(self.ckpt, weights_only=True)
        name = next(k for k in state['model'] if k.endswith('mixing.W'))
        state['model'][name].view(-1)[0] = float('nan')        # W[0, 0]: the first token's own weight
        path = os.path.join(folder(self, 'nan'), 'nan.pt')
        torch.save(state, path)
        for argv in (['sample.py', '--ckpt', path, '--temperature', '0'], ['sample.py', '--ckpt', path],
                     ['-m', 'experiments.look', '--ckpt', path, '--no_figure']):
            with self.subTest(argv=argv):
                self.assert_refused(run_in_process(*argv, '--max_new_tokens', '3', env=ENV)
                                    if argv[0] == 'sample.py' else run_in_process(*argv, env=ENV),
                                    path, 'not finite', name)

    def test_a_prompt_that_is_not_utf8_is_refused(self):
        """--start with the byte 0xe9 (Python's argv holds it as the surrogate U+DCE9): refused as FILE: with
        the same byte is, not sampled after a U+FFFD."""
        r = run_in_process('sample.py', '--ckpt', self.ckpt, '--start', 'caf\udce9', '--max_new_tokens', '2',
                           env=ENV)
        self.assert_refused(r, '--start', 'UTF-8')


class TestMessages(WithData):

    def test_a_device_as_torch_spells_it(self):
        """--device cpu:0 (torch's own spelling; train.py takes it) samples and retrieves: it read 'checkpoint ...
        is corrupt or not from train.py' (torch.load's map_location knows no 'cpu:0')."""
        ckpt = self.ckpt
        r = run_in_process('sample.py', '--ckpt', ckpt, '--device', 'cpu:0', '--max_new_tokens', '2', env=ENV)
        self.assertEqual((r.returncode, error_lines(r.stderr, allow=(SPEED,))), (0, []), r.stderr)
        r = run_in_process('retrieval.py', '--ckpt', ckpt, '--device', 'cpu:0', '--data_dir', self.data,
                           '--max_pairs', '40', '--steps', '2', '--n_candidates', '2', '--eval_rounds', '1',
                           '--no_cache', env=ENV)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_a_damaged_prepared_folder_is_called_damaged_naming_the_file(self):
        """prepare.py on an --out of the same text and settings whose val.bin is gone, or whose meta.json or
        train.bin is cut short: 'damaged', the file named (it read 'prepared data of other settings or text')."""
        data, tmp = self.data, folder(self, 'damaged')
        text = os.path.dirname(data)

        def cut(path, keep):
            with open(path, 'r+b') as f:
                f.truncate(keep)
        cases = {'val.bin is missing': lambda d: os.remove(os.path.join(d, 'val.bin')),
                 'meta.json': lambda d: cut(os.path.join(d, 'meta.json'), 40),
                 'train.bin holds 1000 bytes': lambda d: cut(os.path.join(d, 'train.bin'), 1000)}
        for words, damage in cases.items():
            out = os.path.join(tmp, str(len(os.listdir(tmp))))
            shutil.copytree(data, out)
            damage(out)
            with self.subTest(words):
                r = run_in_process('data/prepare.py', '--train', os.path.join(text, 'train.txt'), '--valid',
                                   os.path.join(text, 'valid.txt'), '--vocab_size', '512', '--out', out, env=ENV)
                self.assert_refused(r, out, 'damaged', words, '--overwrite')

    def test_a_checkpoint_without_a_key_names_it(self):
        """A hand-made checkpoint without 'step' or 'config' (a KeyError traceback from sample.py's header), and a
        resume from one without 'rng': one line naming the key."""
        state, tmp = torch.load(self.ckpt, weights_only=True), folder(self, 'keys')
        for key, argv in (('step', ['sample.py', '--max_new_tokens', '2']), ('config', ['sample.py']),
                          ('config', ['-m', 'experiments.look', '--no_figure'])):
            path = os.path.join(tmp, f'no_{key}.pt')
            torch.save({k: v for k, v in state.items() if k != key}, path)
            with self.subTest(key=key, argv=argv[:2]):
                self.assert_refused(run_in_process(*argv, '--ckpt', path, env=ENV), path, f"no '{key}'")
        os.makedirs(os.path.join(tmp, 'run'))
        torch.save({k: v for k, v in state.items() if k != 'rng'}, os.path.join(tmp, 'run', 'ckpt.pt'))
        r = run_in_process('train.py', f'--data_dir={self.data}', '--init_from=resume',
                           f'--out_dir={os.path.join(tmp, "run")}', env=ENV)
        self.assert_refused(r, 'ckpt.pt', "no 'rng'")

    def test_sizes_that_cannot_fit_are_one_line_before_anything_is_allocated(self):
        """train.py --d_model=10000000 and bench.py's decode and generation tables at 10,000,000 tokens: one line
        saying what it would need (the allocator's traceback, 'you tried to allocate ...', before)."""
        out = folder(self, 'sizes')
        for argv, words in ((['train.py', f'--data_dir={self.data}', '--d_model=10000000', f'--out_dir={out}'],
                             ['parameters', 'would need', 'GiB', 'cpu has']),
                            (['-m', 'experiments.bench', '--device', 'cpu', '--tables', 'decode', '--decode_n_ctx',
                              '10000000'], ['n_ctx 10000000', 'would need']),
                            (['-m', 'experiments.bench', '--device', 'cpu', '--tables', 'generation', '--prompts',
                              '10000000'], ['n_ctx 10000256', 'would need'])):
            with self.subTest(argv=argv[:2]):
                self.assert_refused(run_in_process(*argv, env=ENV, timeout=600), *words)


class TestPeak(unittest.TestCase):

    def test_the_cpu_peak_holds_when_other_processes_take_the_cores(self):
        """machine.measure_matmul_flops on a wall clock that runs 3 times as fast as the products do (other
        processes take two thirds of the core, as on a shared 2-core machine): the peak is the one measured on
        an honest clock (within measurement noise), not a third of it; the threads it ran on are torch's again
        after. (Timed by the wall clock, the peak came out below what training achieved: 'MFU n/a'.)"""
        from harness import machine
        threads, real = torch.get_num_threads(), time.perf_counter
        start = real()
        slow = lambda: start + 3 * (real() - start)        # noqa: E731
        honest, loaded = [], []
        for _ in range(3):          # in turns, the best of each: the other processes' share moves the same for both
            honest.append(machine.measure_matmul_flops('cpu', torch.float32, n=256, seconds=0.05))
            with mock.patch('time.perf_counter', slow):
                loaded.append(machine.measure_matmul_flops('cpu', torch.float32, n=256, seconds=0.05))
        honest, loaded = max(honest), max(loaded)
        self.assertGreater(loaded / honest, 0.7, f'{loaded / 1e9:.1f} against {honest / 1e9:.1f} GFLOP/s')
        self.assertEqual(torch.get_num_threads(), threads)
