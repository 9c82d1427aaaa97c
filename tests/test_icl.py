"""Tests for icl.py: linear self-attention as in-context learner (Vladymyrov et al. 2024).

Part of the suite run by python test_mixer.py (or alone: python test_mixer.py test_icl).
"""
import json
import math
import os
import shutil
import tempfile
import unittest

import numpy as np
import torch

from experiments import icl
from tests.common import run

D = icl.D_X + 1
NOISE = ('0', '5', 'c13')       # the end-to-end run: every row, three columns (the mixers' two among them)


def prompts(batch=64, noise='2', seed=0):
    return icl.sample_prompts(batch, noise, torch.Generator().manual_seed(seed))


def random_lsa(L, param, seed=0, std=0.05, y_scale=1.0):
    torch.manual_seed(seed)
    return icl.LinearSelfAttention(L, param, init_std=std, y_scale=y_scale)


class TestLinearSelfAttention(unittest.TestCase):

    def test_layer_equals_a_direct_loop_over_tokens_and_context(self):
        p = prompts(4)
        for param in icl.PARAMS:
            model = random_lsa(3, param, y_scale=2.0)
            P, Q = model.matrices()
            context, query = p.tokens()
            tokens = torch.cat([context, query], 1).clone()
            for l in range(3):
                new = tokens.clone()
                for b in range(len(p)):
                    for i in range(tokens.shape[1]):
                        delta = torch.zeros(D, dtype=torch.float64)
                        for j in range(icl.N_CTX):          # context tokens only as keys and values
                            e_j = tokens[b, j]
                            delta += P[l] @ e_j * (e_j @ (Q[l] @ tokens[b, i]))
                        new[b, i] = tokens[b, i] + delta
                tokens = new
            with self.subTest(param=param):
                torch.testing.assert_close(model(p), -tokens[:, -1, -1], rtol=1e-12, atol=1e-12)

    def test_the_query_never_changes_a_context_token(self):
        p = prompts(8)
        other = icl.Prompts(p.x, p.y, p.x_q + 3 * torch.randn_like(p.x_q), p.y_q, p.sigma, p.w)
        for param in icl.PARAMS:
            model = random_lsa(4, param)
            a = model.run(*p.tokens())
            b = model.run(*other.tokens())
            with self.subTest(param=param):
                for (ca, qa), (cb, qb) in zip(a[1:], b[1:]):
                    self.assertTrue(torch.equal(ca, cb))
                    self.assertFalse(torch.equal(qa, qb))

    def test_diag_and_gdpp_have_exactly_their_structure_after_training(self):
        for param in ('diag', 'gdpp'):
            model = random_lsa(2, param, y_scale=icl.y_scale('3'))
            icl.train(model, '3', 20, 32, 1e-2, seed=0)
            P, Q = model.matrices()
            with self.subTest(param=param):
                for M in (P, Q):
                    off = M - torch.diag_embed(M.diagonal(dim1=-2, dim2=-1))
                    self.assertEqual(off.abs().max().item(), 0.0)
                    x_part = M.diagonal(dim1=-2, dim2=-1)[:, :icl.D_X]
                    self.assertTrue(torch.equal(x_part, x_part[:, :1].expand_as(x_part)))
                self.assertEqual(Q[:, -1, -1].abs().max().item() == 0.0, param == 'gdpp')
                self.assertEqual(sum(t.numel() for t in model.parameters()), 4 * 2)

    def test_one_layer_gradient_descent_construction(self):
        # von Oswald et al. 2023: Q keeps x, P writes -eta * (y-row of S Q e) into y
        eta = 0.037
        model = icl.LinearSelfAttention(1, 'full')
        with torch.no_grad():
            model.P.zero_()
            model.P[0, -1, -1] = -eta
            model.Q.copy_(torch.diag(torch.tensor([1.0] * icl.D_X + [0.0], dtype=torch.float64))[None])
        p = prompts(32, noise='3')
        alpha = (p.x * p.y[..., None]).sum(1)
        torch.testing.assert_close(model(p), eta * (alpha * p.x_q).sum(-1), rtol=1e-13, atol=1e-13)

    def test_theorem_4_1_identities_on_random_weights(self):
        p = prompts(16, noise='5')
        for param in icl.PARAMS:
            model = random_lsa(4, param, std=0.1, y_scale=3.0)
            ws = icl.implicit_weights(model, p)
            states = model.run(*p.tokens())[1:]
            with self.subTest(param=param):
                for (w, a, _), (ctx, q) in zip(ws, states):
                    scale = ctx.abs().max().item()
                    predicted = a[:, None] * p.y - (p.x * w[:, None]).sum(-1)
                    self.assertLess((ctx[..., -1] - predicted).abs().max().item(), 1e-12 * scale)
                    self.assertLess((q[:, 0, -1] + (w * p.x_q).sum(-1)).abs().max().item(), 1e-12 * scale)
                self.assertGreater(scale, 1.0)     # the stack did something non-trivial

    def test_y_scale_is_an_exact_reparameterisation(self):
        p = prompts(16, noise='7')
        scaled = random_lsa(3, 'full', y_scale=4.0)
        plain = icl.LinearSelfAttention(3, 'full')
        with torch.no_grad():
            P, Q = scaled.matrices()
            plain.P.copy_(P)
            plain.Q.copy_(Q)
        torch.testing.assert_close(plain(p), scaled(p), rtol=1e-12, atol=1e-12)
        self.assertFalse(torch.equal(scaled.P, P))


class TestBaselines(unittest.TestCase):

    def test_ridge_matches_numpy_and_the_grid(self):
        p = prompts(8, noise='3')
        lam = torch.rand(8, dtype=torch.float64)
        got = icl.ridge(p, lam)
        for b in range(8):
            X, y = p.x[b].numpy(), p.y[b].numpy()
            w = np.linalg.solve(X.T @ X + lam[b].item() * np.eye(icl.D_X), X.T @ y)
            self.assertAlmostEqual(got[b].item(), float(w @ p.x_q[b].numpy()), places=10)
        grid = icl.ridge_grid(p, torch.stack([lam, 2 * lam]))
        torch.testing.assert_close(grid[0], got)
        torch.testing.assert_close(grid[1], icl.ridge(p, 2 * lam))

    def test_oracle_at_zero_noise_is_ols_and_exact(self):
        p = prompts(8, noise='0')
        ols = np.stack([np.linalg.lstsq(p.x[b].numpy(), p.y[b].numpy(), rcond=None)[0] for b in range(8)])
        np.testing.assert_allclose(icl.oracle(p).numpy(), (ols * p.x_q.numpy()).sum(-1), rtol=1e-9, atol=1e-9)
        self.assertLess(icl.half_sq(icl.oracle(p), p.y_q).max().item(), 1e-18)

    def test_adarr_noise_estimate_is_the_ols_residual_variance(self):
        p = prompts(4, noise='4')
        for b in range(4):
            X, y = p.x[b].numpy(), p.y[b].numpy()
            r = y - X @ np.linalg.lstsq(X, y, rcond=None)[0]
            self.assertAlmostEqual(icl.noise_estimate(p)[b].item(), float(r @ r) / (icl.N_CTX - icl.D_X), places=10)

    def test_tuned_baselines_beat_ols_and_the_oracle_is_best(self):
        tune, ev = icl.fixed_prompts('3', 2000, 'sweep'), icl.fixed_prompts('3', 4000, 'eval')
        fitted = icl.tune_baselines(tune)
        loss = {k: icl.half_sq(f(ev), ev.y_q).mean().item()
                for k, f in {**fitted, 'ORACLE': icl.oracle, 'ADARR': icl.adarr,
                             'OLS': lambda p: icl.ridge(p, 0.0)}.items()}
        self.assertLess(loss['ORACLE'], min(loss['CONSTRR'], loss['TUNEDRR'], loss['ADARR']))
        self.assertLess(loss['CONSTRR'], loss['OLS'])
        self.assertLess(loss['TUNEDRR'], loss['CONSTRR'])


class TestTraining(unittest.TestCase):

    def test_two_layer_diag_learns_below_the_one_layer_optimum(self):
        # one layer is one gradient-descent step at best: 0.5 d (1 - n / (n + d + 1)) = 1.77
        best_one_layer = 0.5 * icl.D_X * (1 - icl.N_CTX / (icl.N_CTX + icl.D_X + 1))
        model = icl.build(dict(model='lsa', param='diag', n_layer=2, noise='0', seed=0))
        _, rollbacks, finished = icl.train(model, '0', 300, 256, 1e-2, seed=0)
        loss = icl.mean_loss(model, icl.fixed_prompts('0', 4000, 'eval'))
        self.assertTrue(finished)
        self.assertLess(loss, 0.7 * best_one_layer)

    def test_rollback_recovers_from_a_non_finite_loss(self):
        model = icl.LinearSelfAttention(2, 'diag')
        calls = {'n': 0}
        forward = model.forward

        def flaky(p):
            calls['n'] += 1
            out = forward(p)
            return out * math.inf if calls['n'] == 15 else out
        model.forward = flaky
        curve, rollbacks, finished = icl.train(model, '1', 30, 16, 1e-2, seed=0, snapshot_every=10)
        self.assertEqual((rollbacks, finished), (1, True))
        self.assertTrue(all(math.isfinite(x) for _, x in curve))


class TestCommandLine(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.out = tempfile.mkdtemp()
        cls.first = run('-m', 'experiments.icl', '--quick', '--mixers', '--noise', ','.join(NOISE), '--out', cls.out)
        cls.stamps = {f: os.path.getmtime(f) for f in cls.results()}
        cls.second = run('-m', 'experiments.icl', '--quick', '--mixers', '--noise', ','.join(NOISE), '--out', cls.out)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.out, ignore_errors=True)

    @classmethod
    def results(cls):
        return [os.path.join(d, 'result.json') for d, _, files in os.walk(cls.out) if 'result.json' in files]

    def test_quick_run_has_every_row_finite_and_a_plot(self):
        self.assertEqual(self.first.returncode, 0, self.first.stderr[-2000:])
        table = self.first.stdout
        for L, param in icl.PAPER_MODELS:
            self.assertIn(f'| {L}L {icl.PARAM_NAMES[param]} |', table)
        for name in ('CONSTRR', 'ADARR', 'TUNEDRR', '2L flat', '4L toeplitz', '2L transformer', '4L recurrent',
                     '2L linear_attention'):
            self.assertIn(f'| {name}', table)
        self.assertNotIn('nan', table)
        for f in self.results():
            res = json.load(open(f))
            self.assertTrue(math.isfinite(res['sweep']), f)
        self.assertEqual(len(self.results()), len(icl.PAPER_MODELS) * len(NOISE) + len(icl.MIXER_NOISE)
                         * len(icl.MIXER_VARIANTS) * len(icl.MIXER_LAYERS) * len(icl.SETTINGS['quick']['mixer_lrs']))
        self.assertGreater(os.path.getsize(os.path.join(self.out, 'icl.png')), 10000)
        self.assertGreater(table.count('| agree') + table.count('| disagree'), 5)

    def test_rerun_reuses_every_job_and_prints_the_same_report(self):
        self.assertEqual(self.second.returncode, 0, self.second.stderr[-2000:])
        self.assertEqual({f: os.path.getmtime(f) for f in self.results()}, self.stamps)
        self.assertEqual(self.second.stdout, self.first.stdout)

    def test_bad_arguments_give_one_line_and_exit_2(self):
        for args in (['--noise', '0,9x'], ['--params', 'dense'], ['--layers', 'two'], ['--iters', '0'],
                     ['--noise', '=2'], ['--device', 'cuda']):
            r = run('-m', 'experiments.icl', *args, '--out', self.out)
            with self.subTest(args=args):
                self.assertEqual(r.returncode, 2)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertTrue(r.stderr.startswith('icl.py: error:'))


if __name__ == '__main__':
    unittest.main()
