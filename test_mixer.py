"""The test suite: python test_mixer.py   (prints a final line 'N passed, M failed').

Tests assert the properties themselves: a future token changes no earlier logit,
cached generation equals the full forward, the mask stays exact under training,
loss on real TinyStories text drops, resuming equals not stopping.
Real text comes from $TINYSTORIES_DIR (train.txt, valid.txt), by default
../shared/data/tinystories; tests that need it are skipped with a reason if absent.
"""

import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

import mixer

ROOT = os.path.dirname(os.path.abspath(__file__))
TEXT_DIR = os.environ.get('TINYSTORIES_DIR', os.path.join(ROOT, '..', 'shared', 'data', 'tinystories'))
HAVE_TEXT = all(os.path.isfile(os.path.join(TEXT_DIR, f)) for f in ('train.txt', 'valid.txt'))
NO_TEXT = f'no real text: set TINYSTORIES_DIR to a folder with train.txt and valid.txt (tried {TEXT_DIR})'
torch.set_num_threads(min(2, torch.get_num_threads()))

TINY = dict(vocab_size=64, n_ctx=24, d_model=32, n_layer=2, chunk_size=8, fft_threshold=16)


def tiny_model(name, seed=0, **kw):
    """A small random model of variant `name` whose biases and per-position vectors are
    perturbed away from their init, so that every parameter matters."""
    torch.manual_seed(seed)
    model = mixer.build_model(mixer.variant_config(name, **{**TINY, **kw})).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.split('.')[-1] in ('c', 'c1', 'c2', 'v', 'w', 'W1', 'W2', 'wpe', 'wpe_dec', 'bias'):
                p.add_(0.05 * torch.randn_like(p))
    return model


def run(*args, **kw):
    """Run a project script with the current Python -> CompletedProcess (text)."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, **kw)


# ----------------------------------------------------------------------------- causality and caches

class TestCausality(unittest.TestCase):
    """For every variant: no logit depends on a later token."""

    def test_perturbing_a_token_changes_no_earlier_logit(self):
        g = torch.Generator().manual_seed(1)
        for name in mixer.VARIANTS:
            model = tiny_model(name)
            for T in (7, 16, TINY['n_ctx']):          # T = 16, 24 take the Toeplitz FFT path
                idx = torch.randint(0, 64, (2, T), generator=g)
                logits, _ = model(idx)
                for j in (0, T // 2, T - 1):
                    idx2 = idx.clone()
                    idx2[:, j] = (idx2[:, j] + 1) % 64
                    logits2, _ = model(idx2)
                    with self.subTest(variant=name, T=T, j=j):
                        if name == 'toeplitz' and T >= TINY['fft_threshold']:   # FFT rounding, not leakage
                            torch.testing.assert_close(logits2[:, :j], logits[:, :j], atol=1e-5, rtol=0)
                        else:
                            self.assertTrue(torch.equal(logits2[:, :j], logits[:, :j]))
                        self.assertGreater((logits2[:, j:] - logits[:, j:]).abs().max().item(), 1e-6)

    def test_gradient_of_logit_wrt_later_embeddings_is_zero(self):
        for name in mixer.VARIANTS:
            model = tiny_model(name, fft_threshold=10 ** 6)
            for T in (9, TINY['n_ctx']):
                idx = torch.randint(0, 64, (1, T))
                emb = {}
                hook = model.wte.register_forward_hook(
                    lambda m, i, out: emb.setdefault('x', out.detach().requires_grad_()))
                logits, _ = model(idx)
                hook.remove()
                i = T // 2
                (grad,) = torch.autograd.grad(logits[0, i].sum(), emb['x'])
                with self.subTest(variant=name, T=T):
                    self.assertTrue(torch.all(grad[0, i + 1:] == 0))
                    self.assertGreater(grad[0, :i + 1].abs().sum(dim=-1).min().item(), 0)

    def test_short_input_equals_prefix_of_long_input(self):
        for name in mixer.VARIANTS:
            model = tiny_model(name, fft_threshold=10 ** 6)
            idx = torch.randint(0, 64, (2, TINY['n_ctx']))
            full, _ = model(idx)
            for T in (1, 5, 13):
                with self.subTest(variant=name, T=T):
                    self.assertTrue(torch.allclose(model(idx[:, :T])[0], full[:, :T], atol=1e-6, rtol=0))

    def test_mask_stays_exact_under_training(self):
        model = mixer.build_model(mixer.ModelConfig(**TINY)).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        mixing = model.blocks[0].mixing
        upper = ~torch.ones(24, 24, dtype=torch.bool).tril()
        with torch.no_grad():
            mixing.W1.add_(0.1 * torch.randn_like(mixing.W1))   # non-zero raw weights above the diagonal
        for _ in range(5):
            idx = torch.randint(0, 64, (4, 24))
            _, loss = model(idx[:, :-1], idx[:, 1:])
            opt.zero_grad()
            loss.backward()
            self.assertTrue(torch.all(mixing.W1.grad[0, 0][upper] == 0))
            self.assertGreater(mixing.W1.grad[0, 0][~upper].abs().sum().item(), 0)
            opt.step()
        self.assertTrue(torch.all(mixing.matrix(24)[0, 0][upper] == 0))
        self.assertTrue(torch.equal(mixing.matrix(24)[0, 0], mixing.W1[0, 0] * ~upper))
        self.assertGreater(mixing.W1[0, 0][upper].abs().sum().item(), 0)   # the mask does the work


class TestIncremental(unittest.TestCase):
    """Cached / recurrent decoding gives the logits of the full forward pass."""

    def test_decode_in_pieces_equals_forward(self):
        for name in mixer.VARIANTS:
            model = tiny_model(name)
            idx = torch.randint(0, 64, (2, TINY['n_ctx']))
            full, _ = model(idx)
            for cuts in ((1,) * 24, (5, 1, 1, 10, 7), (24,)):
                cache, outs, pos = mixer.Cache(TINY['n_layer']), [], 0
                for n in cuts:
                    outs.append(model.decode(idx[:, pos:pos + n], cache))
                    pos += n
                with self.subTest(variant=name, cuts=cuts):
                    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-4, rtol=0)

    def test_generate_matches_greedy_full_forward(self):
        for name in mixer.VARIANTS:
            model = tiny_model(name)
            prompt = torch.randint(0, 64, (1, 5))
            out = model.generate(prompt, 12, temperature=0)
            seq = prompt
            for _ in range(12):   # the slow reference: a full forward per token
                seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], 1)
            with self.subTest(variant=name):
                self.assertTrue(torch.equal(out, seq))

    def test_generation_past_n_ctx_slides_the_window(self):
        for name in ('flat', 'transformer', 'recurrent', 'linear_attention'):
            model = tiny_model(name)
            out = model.generate(torch.randint(0, 64, (2, 20)), 40, temperature=1.0, top_k=5)
            with self.subTest(variant=name):
                self.assertEqual(out.shape, (2, 60))
                self.assertTrue(((out >= 0) & (out < 64)).all())
        with self.assertRaises(ValueError):
            tiny_model('flat').generate(torch.zeros(1, 25, dtype=torch.long), 1)


# ----------------------------------------------------------------------------- variants

class TestVariants(unittest.TestCase):

    def test_toeplitz_fft_equals_materialised_and_definition(self):
        layer = mixer.ToeplitzMixing(n_ctx=64, d_model=8, n_head=2)
        with torch.no_grad():
            layer.w.normal_()
            layer.c.normal_()
        for T in (1, 17, 64):
            z = torch.randn(3, 2, T, 4)
            torch.testing.assert_close(layer.mix(z, use_fft=True), layer.mix(z, use_fft=False), atol=1e-4, rtol=0)
        M = layer.matrix(slice(0, 64), 64)
        for i, j in ((0, 0), (5, 2), (63, 0), (40, 39)):
            self.assertEqual(M[1, i, j].item(), layer.w[1, i - j].item())
        self.assertTrue(torch.all(M[:, ~torch.ones(64, 64, dtype=torch.bool).tril()] == 0))

    def test_every_head_of_the_multihead_mixer_is_live(self):
        model = tiny_model('multihead')
        idx = torch.randint(0, 64, (2, 24))
        base, _ = model(idx)
        mixing = model.blocks[0].mixing
        self.assertEqual(mixing.W1.shape[0], 4)
        for h in range(4):
            with torch.no_grad():
                mixing.W1[h, 0, 10, 3] += 1.0
                changed = (model(idx)[0] - base).abs().max().item()
                mixing.W1[h, 0, 10, 3] -= 1.0
            self.assertGreater(changed, 1e-4, f'head {h} has no effect')

    def test_expanded_and_kernel_shapes(self):
        self.assertEqual(tiny_model('expanded').blocks[0].mixing.W1.shape, (1, 1, 48, 24))
        self.assertEqual(tiny_model('kernel').blocks[0].mixing.W1.shape, (1, 3, 24, 24))
        with self.assertRaises(ValueError):
            mixer.ModelConfig(expansion=2, kernel=3)

    def test_linear_mixer_is_linear_in_the_embeddings(self):
        model = tiny_model('linear')
        self.assertFalse(any(isinstance(m, (torch.nn.LayerNorm, torch.nn.GELU)) for m in model.modules()))
        h = model.blocks
        x1, x2 = torch.randn(2, 1, 24, 32).unbind(0)

        def trunk(x):
            for b in h:
                x = b(x)
            return x
        zero = trunk(torch.zeros_like(x1))     # the affine part (biases)
        torch.testing.assert_close(trunk(x1 + 2 * x2) - zero, (trunk(x1) - zero) + 2 * (trunk(x2) - zero),
                                   atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- recurrent mixer

class TestRecurrent(unittest.TestCase):

    def layer(self, form, decays, n_ctx=40, chunk_size=16):
        layer = mixer.RecurrentMixing(n_ctx, d_model=12, n_head=len(decays), form=form, chunk_size=chunk_size)
        with torch.no_grad():
            layer.decay_logit.copy_(torch.logit(torch.tensor(decays)))
            layer.v.normal_()
            layer.c.normal_()
        return layer

    def test_parallel_equals_recurrence_and_definition(self):
        for form in ('column', 'row', 'mixed'):
            for decays in ([1e-3, 0.5, 0.999], [0.9999, 0.9, 0.01]):
                layer = self.layer(form, decays)
                for T in (1, 15, 16, 40):
                    z = torch.randn(2, 3, T, 4)
                    y_par = layer.mix(z)
                    # reference recurrence, token by token, written from the definition
                    a = torch.tensor(decays)[:, None]
                    h = torch.zeros(2, 3, 4)
                    ys = []
                    for t in range(T):
                        v = layer.v[:, t, None]
                        col = layer.column[:, :, 0]
                        h = a * h + torch.where(col, z[:, :, t], v * z[:, :, t])
                        ys.append(torch.where(col, v * h, h) + layer.c[:, t])
                    with self.subTest(form=form, decays=decays, T=T):
                        torch.testing.assert_close(y_par, torch.stack(ys, 2), atol=1e-4, rtol=1e-4)
                        M = layer.matrix(T)
                        ref = torch.stack([(M[hh] @ z[:, hh]) for hh in range(3)], 1) + layer.c[:, :T]
                        torch.testing.assert_close(y_par, ref, atol=1e-4, rtol=1e-4)
                i, j = 30, 7
                M = layer.matrix(40)
                for hh in range(3):
                    vi = layer.v[hh, i] if layer.column[hh] else layer.v[hh, j]
                    self.assertAlmostEqual(M[hh, i, j].item(), (vi * decays[hh] ** (i - j)).item(), places=5)
                    self.assertEqual(M[hh, j, i].item(), 0.0)

    def test_state_size_does_not_grow(self):
        model = tiny_model('recurrent', n_ctx=4096)
        cache = mixer.Cache(TINY['n_layer'])
        model.decode(torch.randint(0, 64, (1, 8)), cache)
        shapes = [tuple(s['h'].shape) for s in cache.layers]
        nbytes = cache.nbytes()
        for _ in range(200):
            model.decode(torch.randint(0, 64, (1, 1)), cache)
        self.assertEqual(cache.pos, 208)
        self.assertEqual([tuple(s['h'].shape) for s in cache.layers], shapes)
        self.assertEqual(cache.nbytes(), nbytes)
        self.assertEqual(shapes[0], (1, 4, 8))       # one vector of d / H per head per layer

    def test_long_context_is_finite_in_fp32_and_bf16(self):
        layer = self.layer('mixed', [1e-4, 0.5, 0.99999, 0.999], n_ctx=8192, chunk_size=1024)
        z = torch.randn(1, 4, 8192, 3)
        for dtype in (torch.float32, torch.bfloat16):
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                y = layer.mix(z.to(dtype))
            self.assertTrue(torch.isfinite(y).all(), dtype)
        self.assertTrue(torch.isfinite(layer.powers(8192)).all())


# ----------------------------------------------------------------------------- real data, train.py, sample.py

_DATA = {}


def prepared_data():
    """A data dir prepared once by data/prepare.py from slices of the real text
    (400 kB train, 100 kB valid, 512-token BPE): train.bin, val.bin, meta.json."""
    if not HAVE_TEXT:
        raise unittest.SkipTest(NO_TEXT)
    if 'dir' not in _DATA:
        tmp = tempfile.mkdtemp(prefix='mixer_test_')
        for name, size in (('train.txt', 400_000), ('valid.txt', 100_000)):
            with open(os.path.join(TEXT_DIR, name), encoding='utf-8') as f:
                text = f.read(size)
            with open(os.path.join(tmp, name), 'w', encoding='utf-8') as f:
                f.write(text[:text.rindex('<|endoftext|>')])
        out = os.path.join(tmp, 'data')
        r = run('data/prepare.py', '--train', os.path.join(tmp, 'train.txt'),
                '--valid', os.path.join(tmp, 'valid.txt'), '--out', out, '--vocab_size', '512')
        assert r.returncode == 0, r.stderr
        _DATA['dir'] = out
    return _DATA['dir']


def read_log(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


REAL_TEXT_STEPS = 80


class TestTrainingOnRealText(unittest.TestCase):

    def test_every_variant_learns_real_text(self):
        """A few dozen steps take every variant below the unigram cross entropy of
        the validation text: it predicts from context, not only token frequencies."""
        data = prepared_data()
        train = torch.from_numpy(np.fromfile(os.path.join(data, 'train.bin'), dtype=np.uint16).astype(np.int64))
        val = torch.from_numpy(np.fromfile(os.path.join(data, 'val.bin'), dtype=np.uint16).astype(np.int64))
        counts = torch.bincount(train, minlength=512).double() + 1
        unigram = -torch.log(counts / counts.sum())[val].mean().item()          # nats/token
        T = 64
        val_x = torch.stack([val[s:s + T + 1] for s in range(0, 64 * 200, 200)])
        for name in mixer.VARIANTS:
            torch.manual_seed(0)
            cfg = mixer.variant_config(name, vocab_size=512, n_ctx=T, d_model=64, n_layer=2, chunk_size=32)
            model = mixer.build_model(cfg)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
            g = torch.Generator().manual_seed(0)
            for _ in range(REAL_TEXT_STEPS):
                starts = torch.randint(0, len(train) - T - 1, (16,), generator=g)
                batch = torch.stack([train[s:s + T + 1] for s in starts])
                _, loss = model(batch[:, :-1], batch[:, 1:])
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            with torch.no_grad():
                after = model(val_x[:, :-1], val_x[:, 1:])[1].item()
            with self.subTest(variant=name):
                self.assertLess(after, unigram - 0.25, f'{name}: val loss {after:.3f}, unigram {unigram:.3f}')

    def test_train_py_learns_and_resume_equals_uninterrupted(self):
        data = prepared_data()
        tmp = tempfile.mkdtemp(prefix='mixer_train_')
        common = [f'--data_dir={data}', '--d_model=48', '--n_layer=2', '--n_ctx=48', '--batch_size=8',
                  '--eval_interval=10', '--eval_windows=16', '--log_interval=1', '--lr_decay_iters=20',
                  '--warmup_iters=5', '--learning_rate=3e-3']
        full, part = os.path.join(tmp, 'full'), os.path.join(tmp, 'part')
        r = run('train.py', *common, '--max_iters=20', f'--out_dir={full}')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('bits/byte', r.stdout)
        r = run('train.py', *common, '--max_iters=10', f'--out_dir={part}')
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run('train.py', *common, '--max_iters=20', f'--out_dir={part}', '--init_from=resume')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('resumed', r.stdout)
        a = {e['step']: e['loss'] for e in read_log(full) if e['event'] == 'train'}
        b = {e['step']: e['loss'] for e in read_log(part) if e['event'] == 'train'}
        self.assertEqual(sorted(b), list(range(1, 21)))
        for step in range(11, 21):
            self.assertAlmostEqual(a[step], b[step], places=5, msg=f'step {step}')
        evals = [e['val_loss'] for e in read_log(full) if e['event'] == 'eval']
        self.assertLess(evals[-1], evals[0] - 0.5)
        _DATA['ckpt'] = os.path.join(full, 'ckpt.pt')

    def test_torchrun_two_processes_on_cpu(self):
        data = prepared_data()
        out = tempfile.mkdtemp(prefix='mixer_ddp_')
        r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
                            'train.py', f'--data_dir={data}', '--d_model=48', '--n_layer=2', '--n_ctx=48',
                            '--batch_size=8', '--max_iters=16', '--eval_interval=16', '--log_interval=4',
                            '--learning_rate=3e-3', '--warmup_iters=4', f'--out_dir={out}'],
                           cwd=ROOT, capture_output=True, text=True, env={**os.environ, 'OMP_NUM_THREADS': '1'})
        self.assertEqual(r.returncode, 0, r.stderr[:3000] + '\n...\n' + r.stderr[-1000:])  # a rank's own error comes first
        log = read_log(out)
        self.assertEqual(log[0]['world_size'], 2)
        losses = [e['loss'] for e in log if e['event'] == 'train']
        self.assertEqual(len(losses), 4)
        self.assertLess(losses[-1], losses[0] - 0.3)

    def test_mixing_lr_mult_scales_only_the_token_mixing(self):
        """param_groups puts each parameter in one group; only the mixings' W and c
        (not the multi-head projections) get mixing_lr_mult, and c is not decayed.
        With mixing_lr_mult = 0, train.py leaves the mixing matrices untouched."""
        import train
        model = mixer.build_model(mixer.variant_config('multihead', vocab_size=64, n_ctx=8, d_model=16, n_layer=2))
        groups = train.param_groups(model, {'mixing_lr_mult': 0.5, 'weight_decay': 0.1})
        ids = [id(p) for g in groups for p in g['params']]
        self.assertEqual(sorted(ids), sorted(id(p) for p in model.parameters()))
        group_of = {id(p): g for g in groups for p in g['params']}
        for name, p in model.named_parameters():
            with self.subTest(name=name):
                is_mixing = name.endswith(('mixing.W1', 'mixing.c1'))
                self.assertEqual(group_of[id(p)]['lr_mult'], 0.5 if is_mixing else 1.0)
                decayed = p.dim() >= 2 and not name.endswith('c1')
                self.assertEqual(group_of[id(p)]['weight_decay'], 0.1 if decayed else 0.0)
        out = tempfile.mkdtemp(prefix='mixer_lrmult_')
        r = run('train.py', f'--data_dir={prepared_data()}', '--d_model=32', '--n_layer=1', '--n_ctx=32',
                '--batch_size=4', '--max_iters=3', '--eval_interval=3', '--eval_windows=4',
                '--warmup_iters=0', '--mixing_lr_mult=0', f'--out_dir={out}')
        self.assertEqual(r.returncode, 0, r.stderr)
        trained = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['model']
        torch.manual_seed(1337)                    # train.py's seed: the same init
        cfg = mixer.variant_config('flat', vocab_size=trained['wte.weight'].shape[0], d_model=32, n_layer=1, n_ctx=32)
        init = mixer.build_model(cfg).state_dict()
        self.assertTrue(torch.equal(trained['blocks.0.mixing.W1'], init['blocks.0.mixing.W1']))
        self.assertFalse(torch.equal(trained['blocks.0.ff.fc.weight'], init['blocks.0.ff.fc.weight']))

    def test_train_py_rejects_bad_settings(self):
        for args, msg in ((['--no_such_key=1'], 'unknown setting'), (['--d_model=big'], 'must be int'),
                          (['--variant=nope'], 'unknown variant'), (['missing_config.py'], 'not found'),
                          (['--n_head=3'], 'divisible')):
            r = run('train.py', *args, '--data_dir=' + prepared_data(), '--out_dir=' + tempfile.mkdtemp())
            with self.subTest(args=args):
                self.assertEqual(r.returncode, 2)
                self.assertIn(msg, r.stderr)
                self.assertNotIn('Traceback', r.stderr)


class TestMachine(unittest.TestCase):

    @unittest.skipUnless(platform.libc_ver()[0] == 'glibc', 'keep_freed_memory needs glibc')
    def test_keep_freed_memory_stops_page_faults_on_large_tensors(self):
        """A 48 MiB tensor made and freed 5 times page-faults its memory in every time
        under glibc's defaults, and (once the heap has settled) about never after
        keep_freed_memory() is applied."""
        code = ("import resource, torch, mixer\n"
                "def faults():\n"
                "    torch.zeros(12 << 20)\n"
                "    f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
                "    for _ in range(5): torch.zeros(12 << 20)\n"
                "    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f\n"
                "before = faults(); applied = mixer.keep_freed_memory()\n"
                "print(before, applied, min(faults() for _ in range(3)))\n")     # once the heap has settled
        r = run('-c', code)
        self.assertEqual(r.returncode, 0, r.stderr)
        before, applied, after = r.stdout.split()
        self.assertEqual(applied, 'True')
        self.assertGreater(int(before), 5 * 1000)      # 48 MiB is 12288 pages of 4 KiB (fewer with huge pages)
        self.assertLess(int(after), int(before) / 20)


class TestSample(unittest.TestCase):

    def checkpoint(self):
        if 'ckpt' not in _DATA:
            TestTrainingOnRealText('test_train_py_learns_and_resume_equals_uninterrupted').debug()
        return _DATA['ckpt']

    def test_sample_prints_stories(self):
        r = run('sample.py', '--ckpt', self.checkpoint(), '--start', 'Once upon a time', '--num_samples', '2',
                '--max_new_tokens', '30')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.count('--- sample'), 2)
        self.assertIn('Once upon a time', r.stdout)

    def test_sample_bad_inputs(self):
        bad = os.path.join(tempfile.mkdtemp(), 'bad.pt')
        with open(bad, 'wb') as f:
            f.write(b'not a checkpoint')
        cases = ((['--ckpt', bad], 'corrupt'), (['--ckpt', bad + '.missing'], 'not found'),
                 (['--ckpt', self.checkpoint(), '--start', 'word ' * 200], 'longer than'))
        for args, msg in cases:
            r = run('sample.py', *args)
            with self.subTest(args=args[:2]):
                self.assertEqual(r.returncode, 2)
                self.assertIn(msg, r.stderr)
                self.assertNotIn('Traceback', r.stderr)


# ----------------------------------------------------------------------------- autoencoder

class TestAutoencoder(unittest.TestCase):

    def test_decoder_sees_only_the_embedding(self):
        for name in ('flat', 'transformer'):
            model = tiny_model(name, task='autoencode')
            idx = torch.randint(0, 64, (2, 16))
            idx2 = idx.clone()
            idx2[:, 3] = (idx2[:, 3] + 1) % 64
            e, e2 = model.encode(idx), model.encode(idx2)
            with self.subTest(variant=name):
                self.assertGreater((e - e2).abs().max().item(), 1e-6)   # a token changes the embedding
                # same embedding -> same reconstruction, whatever the tokens were
                torch.testing.assert_close(model.decode_embedding(e, 16), model(idx)[0])
                logits, loss = model(idx, idx)
                self.assertEqual(logits.shape, (2, 16, 64))
                self.assertTrue(math.isfinite(loss.item()))


if __name__ == '__main__':
    import test_bench
    import test_prepare
    import test_retrieval
    modules = [sys.modules[__name__], test_prepare, test_retrieval, test_bench]
    suite = unittest.TestSuite([unittest.defaultTestLoader.loadTestsFromModule(m) for m in modules])
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    print(f'{result.testsRun - failed - len(result.skipped)} passed, {failed} failed, {len(result.skipped)} skipped')
    sys.exit(1 if failed else 0)
