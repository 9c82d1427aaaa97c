"""Tests of look.py: a figure and a table of every kind's token mixing, the drawn matrices the model's
own, the mean lag and diagonal share as defined, and one-line errors for bad input.

Tiny random models of every variant (tests.common.tiny_model), saved with checkpoint.save_checkpoint
beside a small data folder (a byte-level tokenizer, random validation ids): nothing is trained.
"""

import base64
import hashlib
import json
import os
import tempfile
import unittest
from dataclasses import asdict
from unittest import mock

import numpy as np
import torch
from einops import rearrange

from harness import checkpoint
from experiments import look
import mixer
from attention import Attention
from tests.common import TINY, run_in_process, tiny_model

T = 16                       # --positions: fewer than TINY's n_ctx (24), so the leading block is cut
HEADS = 4                    # every variant with heads in mixer.VARIANTS has 4
# matrices a layer in the table, by variant: the count a reader expects from the README's table
ROWS = {'flat': 1, 'expanded': 2, 'multihead': HEADS, 'kernel': 3, 'toeplitz': HEADS, 'recurrent': HEADS,
        'linear_mixer': 1, 'posenc': 1, 'transformer': HEADS, 'gpt': HEADS, 'transformer_naive': HEADS,
        'hybrid': HEADS + 1, 'hybrid_parallel': 2 * HEADS, 'linear_attention': HEADS}


def make_data(folder, vocab_size=TINY['vocab_size']):
    """A data folder as data/prepare.py writes it, small: a byte-level tokenizer (the 256 single bytes),
    meta.json naming it, val.bin of random ids below vocab_size -> (tokenizer path, its sha256)."""
    os.makedirs(folder, exist_ok=True)
    text = ''.join(f'{base64.b64encode(bytes([b])).decode()} {b}\n' for b in range(256))
    tok = os.path.join(folder, 'tokenizer.tiktoken')
    with open(tok, 'w', encoding='ascii', newline='') as f:
        f.write(text)
    sha = hashlib.sha256(text.encode()).hexdigest()
    with open(os.path.join(folder, 'meta.json'), 'w') as f:
        json.dump({'vocab_size': vocab_size, 'tokenizer_sha256': sha}, f)
    np.random.default_rng(0).integers(0, vocab_size, 4000).astype(np.uint16).tofile(os.path.join(folder, 'val.bin'))
    return tok, sha


def save(model, path, tok, sha, data_dir, variant):
    """model saved as train.py saves it (checkpoint.save_checkpoint), its config naming data_dir."""
    checkpoint.save_checkpoint(path, model, asdict(model.cfg), {'variant': variant, 'data_dir': data_dir}, 1,
                               float('inf'), [], tok, sha)


def table_rows(stdout):
    """The table's rows (the lines between the header and the reference line) -> list of (layer, matrix)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('layer ') and 'mean lag' in line)
    end = next(i for i, line in enumerate(lines) if line.startswith('(a uniform causal average'))
    return [(' '.join(line.split()[:2]), line) for line in lines[start + 1:end]]


class Drawn:
    """Records what matplotlib's imshow and plot were given while look.py ran in this process."""

    def __enter__(self):
        from matplotlib.axes import Axes
        self.images, self.curves, self.scales = [], [], []
        imshow, plot = Axes.imshow, Axes.plot

        def rec_imshow(ax, X, *a, **kw):
            self.images.append(np.array(X))
            self.scales.append((kw.get('vmin'), kw.get('vmax')))
            return imshow(ax, X, *a, **kw)

        def rec_plot(ax, x, y, *a, **kw):
            self.curves.append(np.array(y))
            return plot(ax, x, y, *a, **kw)
        self.patches = [mock.patch.object(Axes, 'imshow', rec_imshow), mock.patch.object(Axes, 'plot', rec_plot)]
        for p in self.patches:
            p.start()
        return self

    def __exit__(self, *exc):
        for p in self.patches:
            p.stop()


def effective(name, model, T):
    """The matrices a layer of `model` applies over T positions, a list a layer, built here from the
    parameters (W * tril, w[i - j], v a^(i - j)) as the README writes them, in look.py's panel order."""
    out = []
    pos = torch.arange(T)
    causal = (pos[:, None] >= pos[None, :]).float()
    for block in model.blocks:
        m, mats = block.mixing, []
        if name == 'expanded':
            hid = torch.arange(2 * T) // 2
            mats += [m.W[0, :2 * T, :T] * (hid[:, None] >= pos[None, :]),
                     m.W2[0, :T, :2 * T] * (pos[:, None] >= hid[None, :])]
        elif name in ('flat', 'multihead', 'kernel', 'linear_mixer', 'posenc'):
            W = m.W if name == 'kernel' else m.W[:, None]                  # [H, k, n_ctx, n_ctx]
            mats += [W[h, u, :T, :T] * causal for h in range(W.shape[0]) for u in range(W.shape[1])]
        elif name == 'toeplitz':
            lag = (pos[:, None] - pos[None, :]).clamp(min=0)
            mats += [m.w[h, lag] * causal for h in range(HEADS)]
        elif name == 'recurrent':
            a = torch.sigmoid(m.a_logit)
            for h in range(HEADS):
                power = a[h] ** (pos[:, None] - pos[None, :]).clamp(min=0).float() * causal
                v = m.v[h, :T]
                mats.append(power * (v[:, None] if h % 2 == 0 else v[None, :]))     # 'mixed': even heads column
        out.append([x.detach() for x in mats])
    return out


class TestLook(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix='mixer_look_')
        cls.data = os.path.join(cls.tmp, 'data')
        cls.tok, cls.sha = make_data(cls.data)
        cls.models, cls.ckpts = {}, {}
        for i, name in enumerate(mixer.VARIANTS):
            cls.models[name] = tiny_model(name, seed=i)
            cls.ckpts[name] = os.path.join(cls.tmp, f'{name}.pt')
            save(cls.models[name], cls.ckpts[name], cls.tok, cls.sha, cls.data, name)

    def test_every_kind(self):
        """For every variant: a PNG written, one table row a matrix of each layer (per head), every matrix
        on a colour scale centred at zero. What is drawn: the masked and recurrent matrices equal W * tril
        (v a^(i-j)) over the first T positions, built here from the parameters; the Toeplitz curves are
        w[0..T-1], beside its matrices w[i - j]; attention maps are row-stochastic and causal. The table's mean lags are those of the
        drawn matrices."""
        for name in mixer.VARIANTS:
            with self.subTest(variant=name):
                out = os.path.join(self.tmp, f'{name}.png')
                with Drawn() as drawn:
                    r = run_in_process('-m', 'experiments.look', '--ckpt', self.ckpts[name], '--out', out, '--positions', str(T),
                                       '--windows', '4', '--overwrite')
                self.assertEqual(r.returncode, 0, r.stderr)
                with open(out, 'rb') as f:
                    self.assertEqual(f.read(8), b'\x89PNG\r\n\x1a\n')
                rows = table_rows(r.stdout)
                self.assertEqual([layer for layer, _ in rows],
                                 [f'layer {i}' for i in range(TINY['n_layer']) for _ in range(ROWS[name])])
                for vmin, vmax in drawn.scales:
                    self.assertEqual(vmin, -vmax)
                want = [m.numpy() for layer in effective(name, self.models[name], T) for m in layer]
                if name == 'toeplitz':
                    w = [b.mixing.w[h, :T].detach().numpy() for b in self.models[name].blocks for h in range(HEADS)]
                    self.assertEqual(len(drawn.curves), len(w))
                    for got, exp in zip(drawn.curves, w):
                        np.testing.assert_allclose(got, exp, rtol=1e-6, atol=1e-7)
                if want:
                    self.assertEqual(len(drawn.images), len(want))
                    for got, exp in zip(drawn.images, want):
                        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-7)
                else:                                  # attention, averaged: the first HEADS panels of a row
                    self.assertGreaterEqual(len(drawn.images), TINY['n_layer'] * HEADS)
                    for A in drawn.images[:HEADS]:
                        np.testing.assert_allclose(A.sum(1), np.ones(T), atol=1e-4)
                        self.assertEqual(np.abs(np.triu(A, 1)).max(), 0)
                for (_, line), M in zip(rows, want):   # the table's numbers are the drawn matrices'
                    pos = [torch.arange(n) // (2 if n > T else 1) for n in M.shape]   # expanded: 2 rows a position
                    self.assertAlmostEqual(float(line.split()[-3]), look.lag_stats(torch.tensor(M), *pos)[0], places=2)

    def test_attention_drawn_is_what_the_forward_pass_applied(self):
        """The attention maps drawn are the softmax weights the naive path multiplied V by on the model's
        own forward pass over the same validation windows, averaged over them, a head each."""
        model, applied = self.models['transformer_naive'], []
        idx = look.read_windows(self.data, {'tokenizer': {'sha256': self.sha}}, TINY['vocab_size'], T, 4)
        softmax = Attention.softmax
        with torch.no_grad(), mock.patch.object(Attention, 'softmax',
                                                staticmethod(lambda *a: applied.append(softmax(*a)) or applied[-1])):
            model(idx)
        self.assertEqual(len(applied), TINY['n_layer'])
        with Drawn() as drawn:
            r = run_in_process('-m', 'experiments.look', '--ckpt', self.ckpts['transformer_naive'], '--out',
                               os.path.join(self.tmp, 'naive.png'), '--positions', str(T), '--windows', '4',
                               '--overwrite')
        self.assertEqual(r.returncode, 0, r.stderr)
        want = [A.mean(0)[h].numpy() for A in applied for h in range(HEADS)]
        self.assertEqual(len(drawn.images), len(want))
        for got, exp in zip(drawn.images, want):
            np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6)

    def test_an_autoencoders_encoder_and_decoder_are_rows(self):
        path = os.path.join(self.tmp, 'autoencoder.pt')
        save(tiny_model('linear_attention', task='autoencode'), path, self.tok, self.sha, self.data, 'linear_attention')
        r = run_in_process('-m', 'experiments.look', '--ckpt', path, '--no_figure', '--windows', '2')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([layer for layer, _ in table_rows(r.stdout)],
                         [f'{part} {i}' for part in ('encoder', 'decoder') for i in range(TINY['n_layer'])
                          for _ in range(HEADS)])

    def test_attention_weights_are_what_the_module_applies(self):
        """look.attention_weights of an Attention and of a LinearAttention, times V, projected, are the
        module's output."""
        torch.manual_seed(0)
        x = torch.randn(2, T, TINY['d_model'])
        for name in ('transformer', 'gpt', 'linear_attention'):
            m = tiny_model(name).blocks[0].mixing
            with self.subTest(variant=name), torch.no_grad():
                v = (m.project(x, slice(0, T)) if hasattr(m, 'project') else m.features(x))[2]
                y = m.proj_out(rearrange(look.attention_weights(m, x) @ v, 'b H t e -> b t (H e)'))
                torch.testing.assert_close(y, m(x), rtol=1e-4, atol=1e-5)

    def test_every_masked_mixing_class_has_a_view(self):
        """look.mixing_views draws every masked mixing class of mixer.py (each mixer.HeadMixing with its own
        __init__): the classes the variants build are all of them, and each view is a set of tensors, a
        curve [H, T] or a matrix [H, R, C] with R and C multiples of T (an expanded mixer's inner rows). A
        class it does not know is a TypeError."""
        classes = {c for c in vars(mixer).values() if isinstance(c, type) and issubclass(c, mixer.HeadMixing)
                   and '__init__' in vars(c) and c is not mixer.HeadMixing}
        self.assertGreaterEqual(len(classes), 5)
        seen = set()
        for name in mixer.VARIANTS:
            for m in tiny_model(name).modules():
                if isinstance(m, mixer.HeadMixing):
                    seen.add(type(m))
                    with self.subTest(variant=name, mixing=type(m).__name__), torch.no_grad():
                        views = look.mixing_views(m, 8)
                        self.assertTrue(views)
                        for v in views.values():
                            self.assertIn(v.dim(), (2, 3))
                            self.assertEqual(v.shape[0], m.n_head)
                            self.assertTrue(all(n % 8 == 0 for n in v.shape[1:]), v.shape)
        self.assertEqual(seen, classes)
        with self.assertRaisesRegex(TypeError, 'no view of HeadMixing'):
            look.mixing_views(mixer.HeadMixing(8, 4, 1), 8)

    def test_mean_lag_and_diagonal_share_as_defined(self):
        pos = torch.arange(8)
        prefix = mixer.prefix_mean(pos[:, None] >= pos[None, :])
        self.assertEqual(look.lag_stats(torch.eye(8), pos, pos), (0.0, 1.0))
        lag, diag = look.lag_stats(-3 * prefix, pos, pos)                   # signs do not matter, nor scale
        self.assertAlmostEqual(lag, 7 / 4)
        self.assertAlmostEqual(diag, sum(1 / (i + 1) for i in range(8)) / 8)
        for got, ref in zip((lag, diag), look.uniform_reference(8)):
            self.assertAlmostEqual(got, ref)
        below = torch.diag(torch.full((7,), -2.0), -1)                     # M[i, i-1]: row 0 is empty
        self.assertEqual(look.lag_stats(below, pos, pos), (1.0, 0.0))
        # lag fit: 1 for any function of i - j; [[1, 0], [0, 3]] by hand: lag-0 mean 2, residual 2, total
        # variance of (1, 0, 3) about 4/3 is 14/3, so 1 - 2 / (14/3) = 4/7
        toeplitz = torch.randn(8)[(pos[:, None] - pos[None, :]).clamp(min=0)] * (pos[:, None] >= pos[None, :])
        self.assertAlmostEqual(look.lag_fit(toeplitz, pos, pos), 1.0)
        self.assertAlmostEqual(look.lag_fit(torch.tensor([[1.0, 0], [0, 3]]), pos[:2], pos[:2]), 4 / 7)
        self.assertLess(look.lag_fit(prefix, pos, pos), 0.9)                 # 1/(i+1): the row, not the lag

    def test_bad_input_is_one_line_and_exit_2(self):
        garbage = os.path.join(self.tmp, 'garbage.pt')
        with open(garbage, 'wb') as f:
            f.write(b'not a checkpoint')
        old = os.path.join(self.tmp, 'old.pt')                             # a state dict of an older layout
        state = torch.load(self.ckpts['flat'], weights_only=True)
        state['model'] = {k.replace('mixing.W', 'mixing.V'): v for k, v in state['model'].items()}
        torch.save(state, old)
        taken = os.path.join(self.tmp, 'taken.png')
        open(taken, 'w').close()
        cases = ((['--ckpt', garbage + '.missing'], 'not found'), (['--ckpt', garbage], 'corrupt'),
                 (['--ckpt', old], 'does not fit'), (['--ckpt', self.ckpts['flat'], '--out', taken], 'exists'),
                 (['--ckpt', self.ckpts['transformer'], '--data_dir', garbage], 'is a file, not a folder'),
                 (['--ckpt', self.ckpts['transformer'], '--data_dir', garbage + '.missing'], 'not found'),
                 (['--ckpt', self.ckpts['transformer'], '--data_dir', ''], "--data_dir '' not found"),
                 (['--ckpt', self.ckpts['flat'], '--positions', '0'], 'positions'),
                 (['--ckpt', self.tmp], 'is a folder'),
                 (['--ckpt', self.ckpts['flat'], '--out', os.path.join(self.tmp, 'look.svg')], 'ending in .png'),
                 (['--ckpt', self.ckpts['flat'], '--out', ''], 'the figure is an empty path'),
                 (['--ckpt', self.ckpts['flat'], '--out', os.path.join(self.tmp, 'x.png'), '--no_figure'],
                  'pass one of them'))
        for args, msg in cases:
            with self.subTest(args=args):
                r = run_in_process('-m', 'experiments.look', *args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn(msg, r.stderr)
        self.assertEqual(os.path.getsize(taken), 0)

    def test_a_figure_that_cannot_be_written_is_exit_1(self):
        """The figure's write fails (a full disk): the table printed, one line naming the figure, exit 1
        (never exit 0 without the figure asked for), no file left."""
        out = os.path.join(tempfile.mkdtemp(dir=self.tmp), 'look.png')
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot                     # noqa: F401  (before the patch: it reads savefig's doc)
        from matplotlib.figure import Figure
        with mock.patch.object(Figure, 'savefig', side_effect=OSError(28, 'No space left on device')):
            r = run_in_process('-m', 'experiments.look', '--ckpt', self.ckpts['flat'], '--out', out)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(len(table_rows(r.stdout)), TINY['n_layer'])
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn(f'look.py: error: plot not written: {out}', r.stderr)
        self.assertEqual(os.listdir(os.path.dirname(out)), [])

    def test_table_prints_without_matplotlib(self):
        with mock.patch.dict('sys.modules', {'matplotlib': None}):
            r = run_in_process('-m', 'experiments.look', '--ckpt', self.ckpts['multihead'], '--out', os.path.join(self.tmp, 'none.png'))
            quiet = run_in_process('-m', 'experiments.look', '--ckpt', self.ckpts['multihead'], '--no_figure')
        self.assertEqual(r.returncode, 1)
        self.assertIn('matplotlib is not installed', r.stderr)
        self.assertEqual(len(table_rows(r.stdout)), TINY['n_layer'] * HEADS)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, 'none.png')))
        self.assertEqual(quiet.returncode, 0, quiet.stderr)
        self.assertEqual(len(table_rows(quiet.stdout)), TINY['n_layer'] * HEADS)


if __name__ == '__main__':
    unittest.main()
