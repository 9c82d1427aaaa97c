"""Tests of train.py: python test_mixer.py test_train

train.py's model settings are mixer.ModelConfig's fields and defaults,
resume restores the saved run's settings, a fresh run never overwrites a run,
a non-finite loss stops the run and keeps the last good checkpoint, settings are
range-checked, DDP on two CPU processes (gloo) equals one process over the same
windows, gradient accumulation equals a bigger batch, the Muon optimiser, and the
end-of-run summary. The data dir is tests.common.prepared_data() (real TinyStories
text); without it these tests skip (and fail under CI=true, see test_mixer.py).
"""

import contextlib
import dataclasses
import hashlib
import inspect
import io
import itertools
import json
import os
import platform
import re
import shutil
import socket
import tempfile
import unittest

import torch

import mixer
from harness import configurator, optim
from tests.common import finished, prepared_data, read_log, run, run_in_process, start

TINY_ARGS = ['--d_model=32', '--n_layer=1', '--n_ctx=32', '--batch_size=4', '--eval_windows=4',
             '--dtype=float32']       # float32 fixed: runs compared number for number
SUMMARY_KEYS = {'event', 'final_val_loss', 'final_val_bpb', 'final_val_acc', 'best_val_loss', 'step', 'tokens_seen',
                'epochs', 'train_seconds', 'wall_seconds', 'tokens_per_s', 'mfu', 'steady_tokens_per_s', 'steady_mfu',
                'peak_memory_gib', 'other_load'}


ONE_THREAD = {**os.environ, 'OMP_NUM_THREADS': '1'}


def here(*args):
    """A command line (python args...) in this process, one thread (tests.common.run_in_process: the
    script's __main__ code, stdout and stderr as a process prints them) -> CompletedProcess. train.py's
    command line itself runs as processes in test_train_py_learns_and_resume_equals_uninterrupted, the
    DDP tests and test_train_py_rejects_bad_settings."""
    return run_in_process(*args, env=ONE_THREAD, timeout=600)


def train(*args):
    """train.py on the prepared data with the tiny settings, in this process (here) -> CompletedProcess."""
    return here('train.py', f'--data_dir={prepared_data()}', *TINY_ARGS, *args)


def torchrun(*args, nproc=2):
    """Start train.py under torchrun --standalone on CPU (gloo) -> Popen; finished(p) waits for it."""
    return start('-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={nproc}', 'train.py',
                 f'--data_dir={prepared_data()}', *TINY_ARGS, *args)


def torchrun_nodes(*args, port):
    """Start train.py as two nodes of one machine each, as the README's multi-node command does: two
    torchrun agents (--nnodes=2, --node_rank=0 and 1, one process each: gloo on CPU) meeting at a c10d
    rendezvous on localhost:port -> [Popen, Popen]; finished(p) waits for each."""
    return [start('-m', 'torch.distributed.run', '--nnodes=2', f'--node_rank={rank}', '--nproc_per_node=1',
                  '--rdzv_backend=c10d', f'--rdzv_endpoint=localhost:{port}', 'train.py',
                  f'--data_dir={prepared_data()}', *TINY_ARGS, *args) for rank in (0, 1)]


def free_port():
    """A TCP port of localhost that nothing listens on now (the OS's choice) -> int."""
    with socket.socket() as s:
        s.bind(('localhost', 0))
        return s.getsockname()[1]


def sha(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def params(out_dir):
    return torch.load(os.path.join(out_dir, 'ckpt.pt'), weights_only=True)['model']


def in_process(*args):
    """train.main(args) in this process for settings it rejects -> (exit code, stderr)."""
    import contextlib
    import io
    import train as train_py
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            train_py.main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code
    return code, err.getvalue()


class Base(unittest.TestCase):
    """Assertions shared by the train.py tests."""

    def assert_same_update(self, out_a, out_b):
        """The parameters of two runs from the same init agree to 1e-3 of the update's
        size, tensor by tensor (fp32 sums in another order; Adam amplifies rounding of
        near-zero gradients, so an absolute tolerance would be too tight or too loose)."""
        a, b = params(out_a), params(out_b)
        cfg = torch.load(os.path.join(out_a, 'ckpt.pt'), weights_only=True)['model_config']
        torch.manual_seed(1337)                    # train.py's seed (rank 0, whose init DDP broadcasts)
        init = mixer.build_model(mixer.ModelConfig(**cfg)).state_dict()
        for k in a:
            update = (b[k] - init[k]).norm().item()
            self.assertGreater(update, 0, k)
            self.assertLess((a[k] - b[k]).norm().item(), 1e-3 * update, k)

    def assert_ok(self, r):
        self.assertEqual(r.returncode, 0, r.stderr[:3000] + '\n...\n' + r.stderr[-1000:])

    def assert_one_line_error(self, r, code, msg):
        self.assertEqual(r.returncode, code, r.stdout[-500:] + r.stderr[-2000:])
        self.assertIn(msg, r.stderr)
        self.assertNotIn('Traceback', r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


class TestSettings(unittest.TestCase):

    def test_model_settings_are_model_configs_fields_with_their_help(self):
        """Every model setting has one home: the sizes (n_ctx, d_model, n_layer, n_head: no default in
        mixer.ModelConfig) are train.py's settings, with their comments; every other field but vocab_size
        (meta.json's) is listed by train.py --help with ModelConfig's default (fft_threshold and chunk_size:
        None, the device's tuning) and the field's own comment as its help."""
        import train as train_py
        out = io.StringIO()
        with contextlib.redirect_stdout(out), self.assertRaises(SystemExit):
            configurator.parse_overrides(['--help'], train_py.DEFAULTS, train_py.__doc__, train_py)
        lines = {line.split('=')[0].strip(): line for line in out.getvalue().splitlines() if line.startswith('  --')}
        source = inspect.getsource(mixer.ModelConfig)
        for f in dataclasses.fields(mixer.ModelConfig):
            if f.name == 'vocab_size':
                continue
            with self.subTest(field=f.name):
                own = f.name in vars(train_py)          # the sizes: train.py's settings block is their one home
                self.assertEqual(own, f.default is dataclasses.MISSING)
                want = vars(train_py)[f.name] if own else None if f.name in configurator.TUNING_KEYS else f.default
                self.assertEqual(train_py.DEFAULTS[f.name], want)
                help_text = re.search(rf'^{f.name} = .*?  # (.*)$' if own else rf'^    {f.name}: .*?  # (.*)$',
                                      inspect.getsource(train_py) if own else source, re.M)
                self.assertTrue(lines[f'--{f.name}'].startswith(f'  --{f.name}={want!r}'))
                if help_text:
                    self.assertIn(help_text.group(1).strip(), lines[f'--{f.name}'])
        self.assertIn('windows per micro-step per process', lines['--batch_size'])      # train.py's own comment


class TestTrainPy(Base):

    def test_train_py_learns_and_resume_equals_uninterrupted(self):
        """Resuming with only --init_from=resume and a larger max_iters restores every
        saved setting (data_dir, learning rate, schedule, ...) and reproduces the losses
        of the uninterrupted run."""
        data = prepared_data()
        tmp = tempfile.mkdtemp(prefix='mixer_train_')
        common = [f'--data_dir={data}', '--d_model=48', '--n_layer=2', '--n_ctx=48', '--batch_size=8',
                  '--eval_interval=10', '--eval_windows=16', '--log_interval=1', '--lr_decay_iters=20',
                  '--warmup_iters=5', '--learning_rate=3e-3', '--dtype=float32']
        full, part = os.path.join(tmp, 'full'), os.path.join(tmp, 'part')
        a, b = start('train.py', *common, '--max_iters=20', f'--out_dir={full}'), \
            start('train.py', *common, '--max_iters=10', f'--out_dir={part}')         # side by side, one thread each
        r = finished(a)
        self.assert_ok(r)
        self.assertIn('bits/byte', r.stdout)
        self.assert_ok(finished(b))
        r = run('train.py', '--max_iters=20', f'--out_dir={part}', '--init_from=resume',    # nothing else given
                env=ONE_THREAD)
        self.assert_ok(r)
        self.assertIn('resumed', r.stdout)
        self.assertIn('changed on resume: max_iters = 20 (saved run: 10)', r.stdout)
        a = {e['step']: e['loss'] for e in read_log(full) if e['event'] == 'train'}
        b = {e['step']: e['loss'] for e in read_log(part) if e['event'] == 'train'}
        self.assertEqual(sorted(b), list(range(1, 21)))
        for step in range(11, 21):
            self.assertAlmostEqual(a[step], b[step], places=5, msg=f'step {step}')
        evals = [e['val_loss'] for e in read_log(full) if e['event'] == 'eval']
        self.assertLess(evals[-1], evals[0] - 0.5)

    def test_resume_restores_settings_and_overrides_win(self):
        """The saved settings come back on resume (not the defaults); an override is
        printed and wins, also over the hyperparameters stored in the optimiser state;
        the extended schedule is written to the log."""
        out = tempfile.mkdtemp(prefix='mixer_resume_')
        saved = ['--learning_rate=3e-3', '--min_lr=1e-4', '--warmup_iters=2', '--weight_decay=0.05', '--beta2=0.9',
                 '--eval_interval=4', '--log_interval=2', '--seed=7']
        self.assert_ok(train(*saved, '--max_iters=4', f'--out_dir={out}'))
        r = here('train.py', f'--out_dir={out}', '--init_from=resume', '--max_iters=6', '--weight_decay=0.02')
        self.assert_ok(r)
        self.assertIn('changed on resume: weight_decay = 0.02 (saved run: 0.05)', r.stdout)
        self.assertNotIn('changed on resume: learning_rate', r.stdout)
        configs = [e['config'] for e in read_log(out) if e['event'] == 'config']
        self.assertEqual(len(configs), 2)
        for key, value in (('learning_rate', 3e-3), ('min_lr', 1e-4), ('warmup_iters', 2), ('beta2', 0.9),
                           ('eval_interval', 4), ('log_interval', 2), ('seed', 7), ('d_model', 32),
                           ('batch_size', 4), ('max_iters', 6), ('weight_decay', 0.02)):
            self.assertEqual(configs[1][key], value, key)
        groups = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['optimizer']['param_groups']
        self.assertEqual(sorted({g['weight_decay'] for g in groups}), [0.0, 0.02])
        self.assertEqual({tuple(g['betas']) for g in groups}, {(0.9, 0.9)})
        schedules = [e for e in read_log(out) if e['event'] == 'schedule']
        self.assertEqual((schedules[-1]['from_step'], schedules[-1]['max_iters'], schedules[-1]['lr_decay_iters']),
                         (4, 6, 6))
        self.assertEqual([e['step'] for e in read_log(out) if e['event'] == 'train'], [2, 4, 6])
        # the architecture cannot change
        r = here('train.py', f'--out_dir={out}', '--init_from=resume', '--d_model=64')
        self.assert_one_line_error(r, 2, 'd_model cannot change on resume')

    def test_fresh_run_refuses_an_out_dir_that_holds_a_run(self):
        out = tempfile.mkdtemp(prefix='mixer_refuse_')
        self.assert_ok(train('--max_iters=2', '--eval_interval=2', f'--out_dir={out}'))
        before = sha(os.path.join(out, 'ckpt.pt')), sha(os.path.join(out, 'log.jsonl'))
        r = train('--max_iters=2', '--eval_interval=2', f'--out_dir={out}')
        self.assert_one_line_error(r, 2, 'already holds a run')
        self.assertEqual((sha(os.path.join(out, 'ckpt.pt')), sha(os.path.join(out, 'log.jsonl'))), before)
        self.assert_ok(train('--max_iters=3', '--eval_interval=3', f'--out_dir={out}', '--overwrite=True'))
        log = read_log(out)
        self.assertEqual([e['event'] for e in log].count('config'), 1)     # a new log, not appended
        self.assertEqual(torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['step'], 3)

    def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(self):
        out = tempfile.mkdtemp(prefix='mixer_nan_')
        self.assert_ok(train('--max_iters=2', '--eval_interval=2', '--warmup_iters=0', f'--out_dir={out}'))
        good = sha(os.path.join(out, 'ckpt.pt'))
        # an absurd learning rate overflows the weights: the loss becomes inf / nan
        r = here('train.py', f'--out_dir={out}', '--init_from=resume', '--max_iters=8', '--learning_rate=1e38',
                 '--grad_clip=0')
        self.assert_one_line_error(r, 1, 'non-finite train loss')
        self.assertRegex(r.stderr, r'at step [3-8]\b')
        self.assertEqual(sha(os.path.join(out, 'ckpt.pt')), good)
        self.assertEqual(torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['step'], 2)

    def test_checkpoint_with_a_compile_prefix_loads_and_a_corrupt_one_is_one_line(self):
        """harness/checkpoint.py: a state dict saved from a torch.compile'd model ('_orig_mod.'
        keys) loads in load_checkpoint, sample.py and --init_from=resume; an unreadable
        ckpt.pt on resume is one line and exit 2, not a traceback."""
        from harness import loading
        out = tempfile.mkdtemp(prefix='mixer_ckpt_')
        self.assert_ok(train('--max_iters=2', '--eval_interval=2', f'--out_dir={out}'))
        path = os.path.join(out, 'ckpt.pt')
        plain, _, _ = loading.load_checkpoint(path)
        ckpt = torch.load(path, weights_only=True)
        ckpt['model'] = {'_orig_mod.' + k: v for k, v in ckpt['model'].items()}
        torch.save(ckpt, path)
        model, _, _ = loading.load_checkpoint(path)
        idx = torch.randint(0, 100, (1, 16))
        self.assertTrue(torch.equal(model(idx)[0], plain(idx)[0]))
        self.assert_ok(here('sample.py', '--ckpt', path, '--max_new_tokens', '2', '--num_samples', '1'))
        self.assert_ok(here('train.py', f'--out_dir={out}', '--init_from=resume', '--max_iters=3'))
        with open(path, 'wb') as f:
            f.write(b'not a checkpoint')
        r = here('train.py', f'--out_dir={out}', '--init_from=resume', '--max_iters=4')
        self.assert_one_line_error(r, 2, 'corrupt or not from train.py')

    def test_train_py_rejects_bad_settings(self):
        out = tempfile.mkdtemp()
        cases = ((['--no_such_key=1'], 'unknown setting'), (['--eval_interval=0'], 'eval_interval'))
        procs = [start('train.py', *args, '--data_dir=' + prepared_data(), '--out_dir=' + out) for args, _ in cases]
        for (args, msg), p in zip(cases, procs):            # as processes, side by side
            r = finished(p)
            with self.subTest(args=args):
                self.assert_one_line_error(r, 2, msg)
        for args, msg in ((['--no_such_key=1'], 'unknown setting'), (['--d_model=big'], 'must be int'),
                          (['--variant=nope'], 'unknown variant'), (['missing_config.py'], 'not found'),
                          (['--n_head=3'], 'divisible'), (['--eval_interval=0'], 'eval_interval must be >= 1'),
                          (['--log_interval=0'], 'log_interval'), (['--batch_size=0'], 'batch_size'),
                          (['--grad_accum=0'], 'grad_accum'), (['--learning_rate=-1.0'], 'learning_rate'),
                          (['--beta2=1.0'], 'beta2'), (['--max_iters=-1'], 'max_iters'),
                          (['--lr_decay_iters=0'], 'lr_decay_iters'), (['--optimizer=sgd'], 'optimizer'),
                          (['--init_from=nope'], 'init_from'), (['--task=nope'], 'task'),
                          (['--mixing_weight_decay=-0.5'], 'mixing_weight_decay'),
                          (['--mixing_weight_decay=big'], 'mixing_weight_decay'),
                          (['--init_from=resume'], 'does not exist')):
            code, err = in_process(*args, '--data_dir=' + prepared_data(), '--out_dir=' + out)
            with self.subTest(args=args):
                self.assertEqual(code, 2, err)
                self.assertIn(msg, err)
                self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_mixing_lr_mult_scales_only_the_token_mixing(self):
        """param_groups puts each parameter in one group; only the mixings' own parameters (W, W2, w, v,
        the decay rates, the biases c, c2; not the multi-head projections, nor attention's) get
        mixing_lr_mult, and the biases and decay rates are not decayed, for each kind of mixing.
        With mixing_lr_mult = 0, train.py leaves the mixing matrices untouched."""
        for variant, mixing_wd in itertools.product(('multihead', 'expanded', 'toeplitz', 'recurrent', 'hybrid'),
                                                    (None, 2.0)):      # None: the mixing matrices at weight_decay too
            cfg = mixer.variant_config(variant, vocab_size=64, n_ctx=8, d_model=16, n_layer=2, n_head=1)
            model = mixer.build_model(cfg)
            groups = optim.param_groups(model, {'mixing_lr_mult': 0.5, 'weight_decay': 0.1,
                                                'mixing_weight_decay': mixing_wd})
            ids = [id(p) for g in groups for p in g['params']]
            self.assertEqual(sorted(ids), sorted(id(p) for p in model.parameters()))
            group_of = {id(p): g for g in groups for p in g['params']}
            for name, p in model.named_parameters():
                with self.subTest(variant=variant, name=name, mixing_weight_decay=mixing_wd):
                    is_mixing = re.search(r'mixing\.(mix\.)?(W|W2|c|c2|w|v|a_logit)$', name) is not None
                    self.assertEqual(group_of[id(p)]['lr_mult'], 0.5 if is_mixing else 1.0)
                    decayed = p.dim() >= 2 and not name.endswith(('mixing.c', 'mix.c', 'mixing.c2'))
                    wd = mixing_wd if mixing_wd is not None and is_mixing else 0.1
                    self.assertEqual(group_of[id(p)]['weight_decay'], wd if decayed else 0.0)
        out = tempfile.mkdtemp(prefix='mixer_lrmult_')
        r = train('--max_iters=3', '--eval_interval=3', '--warmup_iters=0', '--mixing_lr_mult=0', f'--out_dir={out}')
        self.assert_ok(r)
        trained = params(out)
        torch.manual_seed(1337)                    # train.py's seed: the same init
        cfg = mixer.variant_config('flat', vocab_size=trained['wte.weight'].shape[0], d_model=32, n_layer=1,
                                   n_ctx=32, n_head=1)
        init = mixer.build_model(cfg).state_dict()
        self.assertTrue(torch.equal(trained['blocks.0.mixing.W'], init['blocks.0.mixing.W']))
        self.assertFalse(torch.equal(trained['blocks.0.ff.fc.weight'], init['blocks.0.ff.fc.weight']))

    def test_summary_line_and_record(self):
        """The end of a run prints a summary and writes {"event": "summary"} with the keys
        claims.py reads; its numbers agree with the run's own records."""
        out = tempfile.mkdtemp(prefix='mixer_summary_')
        r = train('--max_iters=6', '--eval_interval=3', '--log_interval=2', f'--out_dir={out}')
        self.assert_ok(r)
        for line in r.stdout.splitlines():
            if line.startswith('step '):
                self.assertRegex(line, r'^step +\d+/6 \|.*\| ETA ')
        self.assertIn(f'checkpoint {os.path.join(out, "ckpt.pt")}', r.stdout.splitlines()[-1])
        self.assertTrue(r.stdout.splitlines()[-1].startswith('summary: final val loss'))
        log = read_log(out)
        s = log[-1]
        self.assertEqual(set(s), SUMMARY_KEYS)
        evals = [e for e in log if e['event'] == 'eval']
        n_train = os.path.getsize(os.path.join(prepared_data(), 'train.bin')) // 2
        self.assertEqual(s['step'], 6)
        self.assertEqual(s['final_val_loss'], evals[-1]['val_loss'])
        self.assertEqual(s['final_val_bpb'], evals[-1]['val_bpb'])
        self.assertEqual(s['best_val_loss'], min(e['val_loss'] for e in evals))
        self.assertEqual(s['tokens_seen'], 6 * 4 * 32)
        self.assertAlmostEqual(s['epochs'], 6 * 4 * 32 / n_train)
        self.assertGreater(s['train_seconds'], 0)
        self.assertLess(s['train_seconds'], s['wall_seconds'])
        self.assertAlmostEqual(s['tokens_per_s'], 6 * 4 * 32 / s['train_seconds'], delta=1e-6 * s['tokens_per_s'])
        self.assertGreater(s['mfu'], 0)

    def test_eval_train_reads_fixed_training_windows(self):
        """--eval_train=True logs the loss on fixed windows of train.bin beside val's: equal
        to the val loss when val.bin is a copy of train.bin, different on the real split."""
        data = tempfile.mkdtemp(prefix='mixer_same_split_')
        for f in os.listdir(prepared_data()):
            shutil.copy(os.path.join(prepared_data(), f), data)
        shutil.copy(os.path.join(data, 'train.bin'), os.path.join(data, 'val.bin'))
        with open(os.path.join(data, 'meta.json')) as f:
            meta = json.load(f)
        meta['val']['tokens'] = meta['train']['tokens']                 # val.bin is train.bin's copy: its count
        with open(os.path.join(data, 'meta.json'), 'w') as f:
            json.dump(meta, f)
        for data_dir, same in ((data, True), (prepared_data(), False)):
            out = tempfile.mkdtemp(prefix='mixer_eval_train_')
            r = here('train.py', f'--data_dir={data_dir}', *TINY_ARGS, '--max_iters=4', '--eval_interval=2',
                    '--eval_train=True', f'--out_dir={out}')
            self.assert_ok(r)
            self.assertIn('train windows ', r.stdout)
            log = read_log(out)
            evals = [e for e in log if e['event'] == 'eval']
            self.assertEqual(len(evals), 3)
            for e in evals:
                with self.subTest(same=same, step=e['step']):
                    self.assertEqual(e['train_windows_loss'] == e['val_loss'], same)
            self.assertEqual(log[-1]['final_train_windows_loss'], evals[-1]['train_windows_loss'])


class TestDistributed(Base):
    """DDP proven: torchrun on two CPU processes against one process with the same
    global batch (train.draw_windows gives both the same windows)."""

    def test_windows_depend_on_the_global_batch_only(self):
        import train as train_py
        draw = [train_py.draw_windows(torch.Generator().manual_seed(3), 10_000, 32, b, k, w)
                for b, k, w in ((8, 1, 1), (4, 1, 2), (4, 2, 1), (2, 2, 2))]
        for d in draw[1:]:
            self.assertTrue(torch.equal(d.flatten(), draw[0].flatten()))
        two_ranks = draw[1]
        self.assertEqual(tuple(two_ranks.shape), (2, 1, 4))
        self.assertFalse(set(two_ranks[0].flatten().tolist()) & set(two_ranks[1].flatten().tolist()))
        many = train_py.draw_windows(torch.Generator().manual_seed(0), 100, 32, 1000, 1, 1)
        self.assertEqual((many.min().item(), many.max().item()), (0, 100 - 32 - 2))   # every window fits

    def check_against_one_process(self, args, grad_accum, launch=lambda *a: [torchrun(*a)]):
        """torchrun (2 ranks, batch 4, grad_accum k; `launch` starts them -> its Popens) vs one process
        with batch 8 and grad_accum k: the same parameters and final validation loss, and the logged
        loss is the mean over the ranks (the one-process loss), not rank 0's."""
        tmp = tempfile.mkdtemp(prefix='mixer_ddp_')
        ddp, one = os.path.join(tmp, 'ddp'), os.path.join(tmp, 'one')
        common = [*args, '--variant=multihead', '--max_iters=3', '--eval_interval=3', '--log_interval=1',
                  '--warmup_iters=1', '--learning_rate=1e-2', f'--grad_accum={grad_accum}']
        procs = launch(*common, f'--out_dir={ddp}')
        one_process = train(*common, '--batch_size=8', f'--out_dir={one}')    # here, while the ranks run
        for p in procs:
            r = finished(p)
            self.assertEqual(r.returncode, 0, r.stderr[:3000] + '\n...\n' + r.stderr[-1000:])
        self.assertEqual(read_log(ddp)[0]['world_size'], 2)
        self.assertEqual(one_process.returncode, 0, one_process.stderr)
        self.assert_same_update(ddp, one)
        logged = [e['loss'] for e in read_log(ddp) if e['event'] == 'train']
        single = [e['loss'] for e in read_log(one) if e['event'] == 'train']
        self.assertEqual(len(logged), 3)
        for step in range(3):
            self.assertAlmostEqual(logged[step], single[step], places=5)
        final = [read_log(d)[-1]['final_val_loss'] for d in (ddp, one)]
        self.assertAlmostEqual(final[0], final[1], delta=1e-5 * final[1])

    def test_two_ranks_equal_one_process_with_twice_the_batch(self):
        self.check_against_one_process([], grad_accum=1)

    def test_two_ranks_with_grad_accum_equal_one_big_batch(self):
        """grad_accum 2 under DDP (no_sync on the first micro-step) = one step of batch 16."""
        self.check_against_one_process([], grad_accum=2)

    def test_two_nodes_equal_one_process_with_the_global_batch(self):
        """The README's multi-node command: two torchrun agents (--nnodes=2, a c10d rendezvous on a free
        port of localhost), one process each, end where one process with their global batch ends."""
        self.check_against_one_process([], grad_accum=1, launch=lambda *a: torchrun_nodes(*a, port=free_port()))

    def test_grad_accum_equals_a_bigger_batch_on_one_process(self):
        tmp = tempfile.mkdtemp(prefix='mixer_accum_')
        common = ['--variant=multihead', '--max_iters=3', '--eval_interval=3', '--log_interval=1',
                  '--warmup_iters=1', '--learning_rate=1e-2']
        acc, big = os.path.join(tmp, 'acc'), os.path.join(tmp, 'big')
        r = train(*common, '--grad_accum=3', f'--out_dir={acc}')
        self.assertEqual(r.returncode, 0, r.stderr)
        r = train(*common, '--batch_size=12', f'--out_dir={big}')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_same_update(acc, big)


class TestMuon(unittest.TestCase):

    def test_muon_gets_exactly_the_blocks_linear_weights(self):
        for name in ('flat', 'multihead', 'toeplitz', 'recurrent', 'transformer', 'hybrid', 'linear_attention'):
            for task in ('lm', 'autoencode'):
                model = mixer.build_model(mixer.variant_config(name, vocab_size=64, n_ctx=8, d_model=16, n_layer=2,
                                                               n_head=1, embed_proj=True, task=task))
                # by name: 2-D '.weight' of the blocks (linear layers); not the mixings' W / w / v,
                # not wte / lm_head / embed_proj / norms / biases
                expected = {n for n, p in model.named_parameters()
                            if n.split('.')[0] in ('blocks', 'encoder', 'decoder') and n.endswith('.weight')
                            and p.dim() == 2}
                got = {n for n, p in model.named_parameters() if id(p) in optim.muon_params(model)}
                with self.subTest(variant=name, task=task):
                    self.assertEqual(got, expected)
                    self.assertTrue(any('ff.fc' in n for n in got))
                    self.assertFalse(any(n.endswith(('.W', 'W2', '.w', '.v')) or 'wte' in n for n in got))
        cfg = mixer.variant_config('multihead', vocab_size=64, n_ctx=8, d_model=16, n_layer=1, n_head=1)
        model = mixer.build_model(cfg)
        got = {n for n, p in model.named_parameters() if id(p) in optim.muon_params(model)}
        self.assertEqual(got, {'blocks.0.mixing.proj_in.weight', 'blocks.0.mixing.proj_out.weight',
                               'blocks.0.ff.fc.weight', 'blocks.0.ff.proj_out.weight'})

    def test_muon_trains_and_resumes(self):
        tmp = tempfile.mkdtemp(prefix='mixer_muon_')
        full, part = os.path.join(tmp, 'full'), os.path.join(tmp, 'part')
        common = ['--optimizer=muon', '--variant=multihead', '--eval_interval=6', '--log_interval=1',
                  '--warmup_iters=1', '--learning_rate=1e-2', '--lr_decay_iters=12']
        r = train(*common, '--max_iters=12', f'--out_dir={full}')
        self.assertEqual(r.returncode, 0, r.stderr)
        evals = [e['val_loss'] for e in read_log(full) if e['event'] == 'eval']
        self.assertLess(evals[-1], evals[0] - 0.5)
        ckpt = torch.load(os.path.join(full, 'ckpt.pt'), weights_only=True)
        self.assertEqual(len(ckpt['optimizer_muon']['state']), 4)      # proj_in, proj_out, fc, ff proj_out
        self.assertTrue(all('momentum_buffer' in s for s in ckpt['optimizer_muon']['state'].values()))
        n_tensors = len(mixer.build_model(mixer.ModelConfig(**ckpt["model_config"])).state_dict()) - 1
        self.assertEqual(len(ckpt['optimizer']['state']), n_tensors - 4)   # AdamW: the rest (lm_head is wte)
        self.assertEqual(train(*common, '--max_iters=6', f'--out_dir={part}').returncode, 0)
        r = here('train.py', '--init_from=resume', f'--out_dir={part}', '--max_iters=12')
        self.assertEqual(r.returncode, 0, r.stderr)
        a = {e['step']: e['loss'] for e in read_log(full) if e['event'] == 'train'}
        b = {e['step']: e['loss'] for e in read_log(part) if e['event'] == 'train'}
        for step in range(7, 13):
            self.assertAlmostEqual(a[step], b[step], places=5, msg=f'step {step}')


@unittest.skipUnless(torch.cuda.is_available(), 'needs CUDA')
class TestCuda(unittest.TestCase):

    def test_cuda_rng_state_is_checkpointed(self):
        """With dropout on the GPU (the CUDA generator), resume equals the uninterrupted run."""
        tmp = tempfile.mkdtemp(prefix='mixer_cuda_')
        full, part = os.path.join(tmp, 'full'), os.path.join(tmp, 'part')
        common = ['--device=cuda', '--dtype=float32', '--dropout=0.2', '--eval_interval=4', '--log_interval=1',
                  '--lr_decay_iters=8']
        self.assertEqual(train(*common, '--max_iters=8', f'--out_dir={full}').returncode, 0)
        self.assertEqual(train(*common, '--max_iters=4', f'--out_dir={part}').returncode, 0)
        r = here('train.py', '--init_from=resume', f'--out_dir={part}', '--max_iters=8')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIsNotNone(torch.load(os.path.join(part, 'ckpt.pt'), weights_only=True)['rng'][0]['cuda'])
        a = {e['step']: e['loss'] for e in read_log(full) if e['event'] == 'train'}
        b = {e['step']: e['loss'] for e in read_log(part) if e['event'] == 'train'}
        for step in range(5, 9):
            self.assertAlmostEqual(a[step], b[step], places=4, msg=f'step {step}')


class TestMachine(unittest.TestCase):

    @unittest.skipUnless(platform.libc_ver()[0] == 'glibc', 'keep_freed_memory needs glibc')
    def test_keep_freed_memory_stops_page_faults_on_large_tensors(self):
        """A 48 MiB tensor made and freed 5 times page-faults its memory in every time
        under glibc's defaults, and (once the heap has settled) about never after
        keep_freed_memory() is applied."""
        code = ("import resource, torch\nfrom harness import machine\n"
                "def faults():\n"
                "    torch.zeros(12 << 20)\n"
                "    f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
                "    for _ in range(5): torch.zeros(12 << 20)\n"
                "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f\n"
                "before = faults(); applied = machine.keep_freed_memory()\n"
                "print(before, applied, min(faults() for _ in range(3)))\n")     # once the heap has settled
        r = run('-c', code)
        self.assertEqual(r.returncode, 0, r.stderr)
        before, applied, after = r.stdout.split()
        self.assertEqual(applied, 'True')
        self.assertGreater(int(before), 5 * 1000)      # 48 MiB is 12288 pages of 4 KiB (fewer with huge pages)
        self.assertLess(int(after), int(before) / 20)


if __name__ == '__main__':
    unittest.main()
