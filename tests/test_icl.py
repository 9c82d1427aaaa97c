"""Tests of the in-context regression experiment (Vladymyrov et al. 2024): experiments/regression.py
(the task, linear self-attention, the ridge baselines, the single and the batched trainer),
experiments/icl_mixers.py (the sequence models and the diagnostic's features and probes),
experiments/icl_ladder.py (the mixers' budget ladder: its rungs, resumption, cache and report) and
experiments/icl.py end to end. Alone: python test_mixer.py test_icl.
"""
import contextlib
import io
import json
import math
import os
import re
import shutil
import tempfile
import unittest.mock             # and unittest

import numpy as np
import torch

from experiments import icl, icl_compute, icl_ladder, icl_mixers, icl_report
from experiments import regression as reg
from tests.common import cached_results, run_experiment, run_in_process

D = reg.D_X + 1
THREADS = []


def setUpModule():
    """One torch thread for this module's in-process training: on 2 shared cores two threads made the small
    float64 steps of TestBatchedTraining and TestTraining 4 to 10 times slower (75 and 181 s against 20 and 16 s)."""
    THREADS.append(torch.get_num_threads())
    torch.set_num_threads(1)


def tearDownModule():
    torch.set_num_threads(THREADS.pop())


NOISE = ('0', '5', 'c13')       # the end-to-end run: every row, three columns (the mixers' two among them)


def prompts(batch=64, noise='2', seed=0):
    return reg.sample_prompts(batch, noise, torch.Generator().manual_seed(seed))


def random_lsa(L, param, seed=0, std=0.05, y_scale=1.0):
    torch.manual_seed(seed)
    return reg.LinearSelfAttention(L, param, init_std=std, y_scale=y_scale)


class TestLinearSelfAttention(unittest.TestCase):

    def test_layer_equals_a_direct_loop_over_tokens_and_context(self):
        p = prompts(4)
        for param in reg.PARAMS:
            model = random_lsa(3, param, y_scale=2.0)
            P, Q = model.matrices()
            context, query = p.tokens()
            tokens = torch.cat([context, query], 1).clone()
            for l in range(3):
                new = tokens.clone()
                for b in range(len(p)):
                    for i in range(tokens.shape[1]):
                        delta = torch.zeros(D, dtype=torch.float64)
                        for j in range(reg.N_CTX):          # context tokens only as keys and values
                            e_j = tokens[b, j]
                            delta += P[l] @ e_j * (e_j @ (Q[l] @ tokens[b, i]))
                        new[b, i] = tokens[b, i] + delta
                tokens = new
            with self.subTest(param=param):
                torch.testing.assert_close(model(p), -tokens[:, -1, -1], rtol=1e-12, atol=1e-12)

    def test_the_query_never_changes_a_context_token(self):
        p = prompts(8)
        other = reg.Prompts(p.x, p.y, p.x_q + 3 * torch.randn_like(p.x_q), p.y_q, p.sigma, p.w)
        for param in reg.PARAMS:
            model = random_lsa(4, param)
            a = model.run(*p.tokens())
            b = model.run(*other.tokens())
            with self.subTest(param=param):
                for (ca, qa), (cb, qb) in zip(a[1:], b[1:]):
                    self.assertTrue(torch.equal(ca, cb))
                    self.assertFalse(torch.equal(qa, qb))

    def test_diag_and_gdpp_have_exactly_their_structure_after_training(self):
        for param in ('diag', 'gdpp'):
            model = random_lsa(2, param, y_scale=reg.y_scale('3'))
            reg.train(model, '3', 20, 32, 1e-2, seed=0)
            P, Q = model.matrices()
            with self.subTest(param=param):
                for M in (P, Q):
                    off = M - torch.diag_embed(M.diagonal(dim1=-2, dim2=-1))
                    self.assertEqual(off.abs().max().item(), 0.0)
                    x_part = M.diagonal(dim1=-2, dim2=-1)[:, :reg.D_X]
                    self.assertTrue(torch.equal(x_part, x_part[:, :1].expand_as(x_part)))
                self.assertEqual(Q[:, -1, -1].abs().max().item() == 0.0, param == 'gdpp')
                self.assertEqual(sum(t.numel() for t in model.parameters()), 4 * 2)

    def test_one_layer_gradient_descent_construction(self):
        # von Oswald et al. 2023: Q keeps x, P writes -eta * (y-row of S Q e) into y
        eta = 0.037
        model = reg.LinearSelfAttention(1, 'full')
        with torch.no_grad():
            model.P.zero_()
            model.P[0, -1, -1] = -eta
            model.Q.copy_(torch.diag(torch.tensor([1.0] * reg.D_X + [0.0], dtype=torch.float64))[None])
        p = prompts(32, noise='3')
        alpha = (p.x * p.y[..., None]).sum(1)
        torch.testing.assert_close(model(p), eta * (alpha * p.x_q).sum(-1), rtol=1e-13, atol=1e-13)

    def test_theorem_4_1_identities_on_random_weights(self):
        p = prompts(16, noise='5')
        for param in reg.PARAMS:
            model = random_lsa(4, param, std=0.1, y_scale=3.0)
            ws = reg.implicit_weights(model, p)
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
        plain = reg.LinearSelfAttention(3, 'full')
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
        got = reg.ridge(p, lam)
        for b in range(8):
            X, y = p.x[b].numpy(), p.y[b].numpy()
            w = np.linalg.solve(X.T @ X + lam[b].item() * np.eye(reg.D_X), X.T @ y)
            self.assertAlmostEqual(got[b].item(), float(w @ p.x_q[b].numpy()), places=10)
        grid = reg.ridge_grid(p, torch.stack([lam, 2 * lam]))
        torch.testing.assert_close(grid[0], got)
        torch.testing.assert_close(grid[1], reg.ridge(p, 2 * lam))

    def test_oracle_at_zero_noise_is_ols_and_exact(self):
        p = prompts(8, noise='0')
        ols = np.stack([np.linalg.lstsq(p.x[b].numpy(), p.y[b].numpy(), rcond=None)[0] for b in range(8)])
        np.testing.assert_allclose(reg.oracle(p).numpy(), (ols * p.x_q.numpy()).sum(-1), rtol=1e-9, atol=1e-9)
        self.assertLess(reg.half_sq(reg.oracle(p), p.y_q).max().item(), 1e-18)

    def test_adarr_noise_estimate_is_the_ols_residual_variance(self):
        p = prompts(4, noise='4')
        for b in range(4):
            X, y = p.x[b].numpy(), p.y[b].numpy()
            r = y - X @ np.linalg.lstsq(X, y, rcond=None)[0]
            self.assertAlmostEqual(reg.noise_estimate(p)[b].item(), float(r @ r) / (reg.N_CTX - reg.D_X), places=10)

    def test_tuned_baselines_beat_ols_and_the_oracle_is_best(self):
        tune, ev = reg.fixed_prompts('3', 2000, 'sweep'), reg.fixed_prompts('3', 4000, 'eval')
        fitted = reg.tune_baselines(tune)
        loss = {k: reg.half_sq(f(ev), ev.y_q).mean().item()
                for k, f in {**fitted, 'ORACLE': reg.oracle, 'ADARR': reg.adarr,
                             'OLS': lambda p: reg.ridge(p, 0.0)}.items()}
        self.assertLess(loss['ORACLE'], min(loss['CONSTRR'], loss['TUNEDRR'], loss['ADARR']))
        self.assertLess(loss['CONSTRR'], loss['OLS'])
        self.assertLess(loss['TUNEDRR'], loss['CONSTRR'])


class TestTraining(unittest.TestCase):

    def test_two_layer_diag_learns_below_the_one_layer_optimum(self):
        # one layer is one gradient-descent step at best: 0.5 d (1 - n / (n + d + 1)) = 1.77
        best_one_layer = 0.5 * reg.D_X * (1 - reg.N_CTX / (reg.N_CTX + reg.D_X + 1))
        model = reg.build(dict(param='diag', n_layer=2, noise='0', seed=0))
        _, rollbacks, finished = reg.train(model, '0', 300, 256, 1e-2, seed=0)
        loss = reg.mean_loss(model, reg.fixed_prompts('0', 4000, 'eval'))
        self.assertTrue(finished)
        self.assertLess(loss, 0.7 * best_one_layer)

    def test_rollback_recovers_from_a_non_finite_loss(self):
        model = reg.LinearSelfAttention(2, 'diag')
        calls = {'n': 0}
        forward = model.forward

        def flaky(p):
            calls['n'] += 1
            out = forward(p)
            return out * math.inf if calls['n'] == 15 else out
        model.forward = flaky
        curve, rollbacks, finished = reg.train(model, '1', 30, 16, 1e-2, seed=0, snapshot_every=10)
        self.assertEqual((rollbacks, finished), (1, True))
        self.assertTrue(all(math.isfinite(x) for _, x in curve))


class TestBatchedTraining(unittest.TestCase):

    def test_batched_equals_one_model_at_a_time(self):
        """train_batched on K models (their own noises and seeds) gives the parameters and curves of
        train() on each, to float64 rounding (measured: at most 3e-10 of a tensor's largest entry over
        200 Adam steps, 1.5e-13 over the 100 here; bound 1e-8), every parameterisation."""
        import copy
        for L, param in ((2, 'diag'), (3, 'full'), (2, 'gdpp')):
            noises, seeds = ['0', '3', '7', 'c13'], [0, 1, 2, 0]
            singles = [reg.build(dict(param=param, n_layer=L, noise=n, seed=s)) for n, s in zip(noises, seeds)]
            batched = [copy.deepcopy(m) for m in singles]
            fits = [reg.train(m, n, 100, 64, 1e-2, s, snapshot_every=50) for m, n, s in zip(singles, noises, seeds)]
            fits_b = reg.train_batched(batched, noises, seeds, 100, 64, 1e-2, snapshot_every=50)
            for a, b, f, fb in zip(singles, batched, fits, fits_b):
                with self.subTest(L=L, param=param):
                    self.assertEqual(f[1:], fb[1:])                        # rollbacks, finished
                    for x, y in zip(a.parameters(), b.parameters()):   # relative to the tensor's scale
                        self.assertLess(((y - x).abs().max() / x.abs().max()).item(), 1e-8)
                    self.assertEqual([c[0] for c in f[0]], [c[0] for c in fb[0]])
                    np.testing.assert_allclose([c[1] for c in fb[0]], [c[1] for c in f[0]], rtol=1e-8)

    def test_speed_times_both_trainers_on_the_same_models(self):
        """--speed: a row a trainer, and the two trainers end at the same parameters."""
        text = icl.speed(icl.SETTINGS['quick'], iters=5)
        self.assertIn('| one model at a time', text)
        self.assertIn('| all seeds as one program', text)
        self.assertLess(float(re.search(r'largest parameter difference (\S+) of', text).group(1)), 1e-10)

    def test_batched_rollback_is_per_model(self):
        """A non-finite loss in one model restores that model's snapshot alone and halves its rate:
        the other models train on as if alone."""
        import copy
        models = [reg.build(dict(param='diag', n_layer=2, noise='1', seed=s)) for s in (0, 1)]
        alone = copy.deepcopy(models[1])
        calls = {'n': 0}
        stack_forward = reg.LinearSelfAttention.forward

        def flaky(self, context, query=None):
            out = stack_forward(self, context, query)
            calls['n'] += 1
            if out.dim() == 2 and calls['n'] == 15:                      # step 15 of the stacked run
                out = torch.stack([out[0] * math.inf, out[1]])
            return out
        with unittest.mock.patch.object(reg.LinearSelfAttention, 'forward', flaky):
            fits = reg.train_batched(models, ['1', '1'], [0, 1], 30, 16, 1e-2, snapshot_every=10)
        self.assertEqual([f[1] for f in fits], [1, 0])
        reg.train(alone, '1', 30, 16, 1e-2, 1, snapshot_every=10)
        for x, y in zip(alone.parameters(), models[1].parameters()):
            self.assertLess(((y - x).abs().max() / x.abs().max()).item(), 1e-8)

    def test_the_gram_forward_equals_the_token_updates(self):
        """forward()'s S <- M S M^T path predicts what run() does token by token, every parameterisation,
        and a stack() of models predicts what each does alone."""
        p = prompts(32, '3')
        for param in reg.PARAMS:
            models = [random_lsa(4, param, seed=s, y_scale=reg.y_scale('3')) for s in (0, 1)]
            for m in models:
                torch.testing.assert_close(m(p), -m.run(*p.tokens())[-1][1][:, 0, -1], rtol=1e-10, atol=1e-12)
            stacked = reg.LinearSelfAttention.stack(models)
            ctx, q = p.tokens()
            both = stacked(torch.stack([ctx, ctx]), torch.stack([q, q]))
            for k, m in enumerate(models):
                torch.testing.assert_close(both[k], m(p), rtol=1e-12, atol=1e-12)


class TestMixerDiagnostic(unittest.TestCase):

    def test_products_features_hold_y_i_x_i_and_a_zero_query(self):
        p = prompts(8, '2')
        m = icl_mixers.SequenceRegressor('flat', 1, 16, products=True)
        x = m.tokens(p)
        self.assertEqual(x.shape, (8, reg.N_CTX + 1, 2 * reg.D_X + 1))
        torch.testing.assert_close(x[:, :-1, reg.D_X + 1:], (p.y[..., None] * p.x).float())
        self.assertTrue(torch.equal(x[:, -1, reg.D_X:], torch.zeros(8, reg.D_X + 1)))
        self.assertEqual(icl_mixers.SequenceRegressor('flat', 1, 16).tokens(p).shape[-1], reg.D_X + 1)

    def test_probe_r2_is_one_for_a_linear_target_and_zero_for_noise(self):
        g = torch.Generator().manual_seed(0)
        h = torch.randn(2000, 12, generator=g)
        self.assertGreater(icl_mixers.probe_r2(h, h @ torch.randn(12, 3, generator=g) + 1.0), 0.999)
        self.assertLess(abs(icl_mixers.probe_r2(h, torch.randn(2000, 3, generator=g))), 0.02)

    def test_diagnose_reads_the_products_and_the_sum_where_they_are(self):
        """A hand-made 'model' whose first hidden state holds y_i x_i at the context positions and X^T y at
        the query gets R^2 = 1 for both; an untrained mixer gets far less."""
        p = prompts(400, '0')

        class Oracle:
            def hidden(self, prompts):
                prod = prompts.y[..., None] * prompts.x
                h = torch.cat([prod, prod.sum(1, keepdim=True)], 1).float()
                return [h, h]
        r = icl_mixers.diagnose(Oracle(), p)
        for k in ('products', 'sum_first', 'sum_last'):
            self.assertGreater(r[k], 0.999, k)
        torch.manual_seed(0)
        r = icl_mixers.diagnose(icl_mixers.SequenceRegressor('flat', 2, 16), p)
        self.assertLess(r['sum_last'], 0.5)


def assert_one_line_exit_2(test, cases, out):
    """icl.parse_args on each case (with --out out) exits 2 with one line 'icl.py: error: ...' on stderr."""
    for args in cases:
        with test.subTest(args=args):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), test.assertRaises(SystemExit) as e:
                icl.parse_args([*args, '--out', out])
            test.assertEqual(e.exception.code, 2, args)
            test.assertEqual(len(err.getvalue().strip().splitlines()), 1, err.getvalue())
            test.assertTrue(err.getvalue().startswith('icl.py: error:'), err.getvalue())


def ladder_spec(rung, prev=None, seed=0):
    """A tiny rung of the mixers' ladder (d_model 8, 8 prompts a step, 1x = 20 steps)."""
    return dict(variant='flat', n_layer=2, d_model=8, noise='0', seed=seed, batch_size=8, lr=3e-3, base=20, warmup=2,
                decay=0.2, rung=rung, prev=prev, prev_rung=None if prev is None else 1, eval_prompts=300,
                sweep_prompts=200, curve_prompts=100, curve_every=4, ckpt_every=20)


class TestMixerLadder(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def job(self, name, spec):
        """Run a rung as the runner would (its folder made and kept); cache its result.json like the runner."""
        run_dir = os.path.join(self.tmp, name)
        icl_ladder.keep_dir(run_dir)
        res = icl_ladder.segment_job(spec, run_dir)
        with open(os.path.join(run_dir, 'result.json'), 'w') as f:
            json.dump({'argv': spec, **res}, f)
        return res

    def test_wsd_schedule_warms_up_holds_and_decays_to_zero(self):
        lrs = [icl_ladder.lr_wsd(it, 1.0, 4, 16, 20) for it in range(20)]
        self.assertEqual(lrs[:4], [0.25, 0.5, 0.75, 1.0])
        self.assertEqual(lrs[4:17], [1.0] * 13)
        self.assertEqual(lrs[16:], [1.0, 0.75, 0.5, 0.25])
        self.assertEqual((icl_ladder.rung_steps(4, 20), icl_ladder.fork_step(4, 20, 0.2)), (80, 64))

    def test_a_rung_forked_from_a_longer_run_equals_a_run_of_that_length(self):
        """The 2x rung trained on from the 1x rung's fork (the ladder's way) ends where a 2x run from
        initialisation ends: same losses, same parameters; the 1x rung ends elsewhere."""
        one = self.job('x1', ladder_spec(1))
        chained = self.job('x2', ladder_spec(2, prev='x1'))
        alone = self.job('x2-alone', ladder_spec(2))
        for k in ('eval', 'sweep', 'branch'):
            self.assertEqual(chained[k], alone[k], k)
        self.assertNotEqual(one['eval'], alone['eval'])
        a, b = (torch.load(os.path.join(self.tmp, d, 'state.pt'), weights_only=True)['model'] for d in ('x2', 'x2-alone'))
        for k in a:
            self.assertTrue(torch.equal(a[k], b[k]), k)
        self.assertEqual((chained['steps'], chained['prompts'], len(alone['curve'])), (40, 320, 8))

    def test_a_stopped_rung_goes_on_to_the_same_numbers(self):
        """A rung stopped after its second checkpoint (step 40 of 80) resumes from it and ends exactly
        where the same rung run without a stop ends."""
        draw, calls = icl_mixers.sample_prompts, {'n': 0}          # icl_mixers.adam_step draws a step's prompts

        def stop_at_50(*args, **kw):
            calls['n'] += 1
            if calls['n'] > 50:
                raise KeyboardInterrupt
            return draw(*args, **kw)
        with unittest.mock.patch.object(icl_mixers, 'sample_prompts', stop_at_50), self.assertRaises(KeyboardInterrupt):
            self.job('stopped', ladder_spec(4))
        resumed = self.job('stopped', ladder_spec(4))
        whole = self.job('whole', ladder_spec(4))
        self.assertEqual((resumed['resumed_at'], whole['resumed_at']), (40, None))
        for k in ('eval', 'sweep', 'curve', 'branch'):
            self.assertEqual(resumed[k], whole[k], k)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, 'stopped', 'resume.pt')))

    def test_the_device_is_where_a_rung_trains_not_part_of_its_key(self):
        """icl --compute --device cuda hands the device to segment_job beside the spec (the rungs' specs and
        folders are the CPU's, so a run may move between machines); segment_job given a device trains the
        same numbers as one without (here 'cpu': CI has no GPU; the prompts are drawn on the CPU either way)."""
        C, seen = {**icl_compute.SETTINGS['quick'], 'device': 'cuda'}, {}

        class Runner:
            def chains(self, fn, chains, what):
                seen.update(fn=fn, specs=[j.spec for ch in chains for j in ch])
                return [[{'rc': 0}] * len(ch) for ch in chains]
        with unittest.mock.patch.object(icl_compute, 'step_seconds', lambda runner, out, L, keys: dict.fromkeys(keys, 0.01)):
            icl_compute.compute_runs(Runner(), self.tmp, C)
        self.assertIs(seen['fn'].func, icl_ladder.segment_job)
        self.assertEqual(seen['fn'].keywords, {'device': 'cuda'})
        self.assertEqual(len(seen['specs']), 2 * len(C['rungs']))
        self.assertTrue(all('device' not in spec for spec in seen['specs']))
        plain = self.job('plain', ladder_spec(1))
        run_dir = os.path.join(self.tmp, 'placed')
        icl_ladder.keep_dir(run_dir)
        placed = icl_ladder.segment_job(ladder_spec(1), run_dir, device='cpu')
        for k in ('eval', 'sweep', 'curve', 'branch'):
            self.assertEqual(plain[k], placed[k], k)
        self.assertEqual(placed['device'], 'CPU')

    def test_the_ladder_trains_on_its_device_too(self):
        """icl --mixer_ladder --device cuda hands the device to segment_job, in both of its phases, and not to the
        rungs' specs (a ladder stopped on a GPU goes on on a CPU from the same folders)."""
        L, seen = {**icl_ladder.SETTINGS['quick'], 'device': 'cuda'}, []

        class Runner:
            workers = 2

            def chains(self, fn, chains, what):
                seen.append((fn, [j.spec for ch in chains for j in ch]))
                return [[{'rc': 0, 'sweep': 1.0}] * len(ch) for ch in chains]
        with unittest.mock.patch.object(icl_ladder, 'step_seconds', lambda r, o, L, ks: dict.fromkeys(ks, 0.01)):
            icl_ladder.ladder_runs(Runner(), self.tmp, L)
        self.assertEqual(len(seen), 2)
        for fn, specs in seen:
            self.assertIs(fn.func, icl_ladder.segment_job)
            self.assertEqual(fn.keywords, {'device': 'cuda'})
            self.assertTrue(specs and all('device' not in spec for spec in specs))

    def test_a_section_names_each_device_with_its_own_jobs_and_time(self):
        """A ladder run partly on a CPU and partly on a GPU: the section's first line gives each device its
        count of jobs and summed time, and no wall-time estimate from this run's workers."""
        jobs = [{'rc': 0, 'device': 'CPU', 'seconds': 600}] * 3 + [{'rc': 0, 'device': 'NVIDIA H200', 'seconds': 60}] * 2
        self.assertEqual(icl.jobs_line(jobs, 2),
                         '5 training jobs: 3 on CPU, their own time summed 30.0 min; 2 on NVIDIA H200, 2.0 min')
        self.assertEqual(icl.jobs_line(jobs[:3], 2),
                         '3 training jobs on CPU, their own time summed 30.0 min (about 15.0 min on 2 workers)')

    def test_pinned_base_steps_set_every_rungs_budget(self):
        """--mixer_base_steps (another run's 1x steps, e.g. the page's on another machine) sets each model's
        rung steps; the calibration is still run, for the ETAs only. A ladder without it takes 60 s of the
        calibrated steps."""
        L = dict(icl_ladder.SETTINGS['quick'])
        keys = sorted({(c[0], c[1], c[3]) for c in icl_ladder.configs(L)})
        pinned = {k: 100 + i for i, k in enumerate(keys)}

        class Runner:
            workers = 2

            def __init__(self):
                self.specs = []

            def chains(self, fn, chains, what):
                self.specs += [j.spec for ch in chains for j in ch]
                return [[{'rc': 0, 'sweep': 1.0}] * len(ch) for ch in chains]
        for base_steps, want in ((pinned, pinned), (None, {k: max(10, round(L['budget_s'] / 0.01)) for k in keys})):
            runner = Runner()
            with unittest.mock.patch.object(icl_ladder, 'step_seconds', lambda r, o, L, ks: dict.fromkeys(ks, 0.01)):
                plan = icl_ladder.ladder_runs(runner, self.tmp, {**L, **({'base_steps': base_steps} if base_steps else {})})
            self.assertEqual(plan['base'], want)
            self.assertEqual({(x['variant'], x['n_layer'], x['batch_size']): x['base'] for x in runner.specs}, want)
        args = icl.parse_args(['--mixer_ladder', '--quick', '--out', self.tmp, '--mixer_base_steps',
                               ','.join(f'{v}:{n}:{b}={x}' for (v, n, b), x in pinned.items())])
        self.assertEqual(args.ladder_settings['base_steps'], pinned)

    def test_leaving_the_zero_predictor_needs_a_margin_over_the_seeds_spread(self):
        self.assertTrue(icl_ladder.left_zero([4.0, 4.2], 4.888))
        self.assertFalse(icl_ladder.left_zero([4.0, 4.8], 4.888))            # mean 0.49 below, range 0.8
        self.assertFalse(icl_ladder.left_zero([4.887, 4.8895], 4.888))       # one seed above it
        self.assertTrue(icl_ladder.left_zero([4.80, 4.81], 4.888))           # a margin over range and 1%
        self.assertFalse(icl_ladder.left_zero([4.8875, 4.8876], 4.888))      # over the range, under 1%
        self.assertEqual([icl_ladder.left_zero([x], 4.888) for x in (4.5, 4.9)], [True, False])

    def test_bad_mixer_ladder_arguments_give_one_line_and_exit_2(self):
        """Checked by icl.parse_args before anything starts (here in this process)."""
        assert_one_line_exit_2(self, [['--mixer_ladder', '--mixer_rungs', '2,4'],
                                      ['--mixer_ladder', '--mixer_rates', '0,1e-3'], ['--mixer_ladder', '--docs', 'README.md'],
                                      ['--docs', 'docs/icl.md'], ['--mixer_ladder', '--mixers'],
                                      ['--mixer_ladder', '--quick', '--docs', 'docs/icl.md'],
                                      ['--mixer_ladder', '--mixer_rates', '1e-3,0.001'],
                                      ['--mixer_ladder', '--mixer_rungs', '1,4,4'], ['--mixers', '--device', 'cuda'],
                                      ['--mixer_ladder', '--mixer_base_steps', 'flat:2:256=1666'],
                                      ['--mixer_ladder', '--mixer_base_steps', 'flat:2=1666'],
                                      ['--mixer_base_steps', 'flat:2:256=1666']]
                              + ([] if torch.cuda.is_available() else [['--compute', '--device', 'cuda'],
                                                                       ['--mixer_ladder', '--device', 'cuda']]), self.tmp)


class TestMixerLadderCommand(unittest.TestCase):
    """python -m experiments.icl --mixer_ladder --quick, twice: the second run takes every job from the
    cache and rewrites the same report; its section written into a page changes the page only between
    its markers (icl_ladder.write_docs: a --quick run may not write a page itself)."""

    PAGE = 'before\n\n{}\nold section\n{}\n\nafter\n'.format(icl_ladder.BEGIN, icl_ladder.END)

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        for d in ('docs', 'assets'):
            os.makedirs(os.path.join(cls.tmp, d))
        cls.page, cls.out = os.path.join(cls.tmp, 'docs', 'page.md'), os.path.join(cls.tmp, 'out')
        with open(cls.page, 'w') as f:
            f.write(cls.PAGE)
        # --mixer_budget 1e-6: the floor of 10 base steps on any machine (--quick's 0.15 s: steps by its speed)
        args = ('--mixer_ladder', '--quick', '--mixer_budget', '1e-6', '--out', cls.out)
        cls.first = run_experiment('icl', *args)
        cls.stamps = {f: os.path.getmtime(f) for f in cached_results(cls.out)}
        cls.figure = icl_ladder.check_docs(cls.page)
        icl_ladder.write_docs(cls.page, cls.first.stdout.strip(), os.path.join(cls.out, 'mixer_ladder.png'), cls.figure)
        with open(cls.page) as f:
            cls.written = f.read()
        cls.second = run_experiment('icl', *args)          # every job cached

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_quick_ladder_writes_its_table_plot_and_page_section(self):
        self.assertEqual(self.first.returncode, 0, self.first.stderr[-2000:])
        L = icl_ladder.SETTINGS['quick']
        table = self.first.stdout
        for cfg in icl_ladder.configs(L):
            self.assertIn(f'| {cfg[1]}L {cfg[0]} | {cfg[3]} | {icl_ladder.noise_label(cfg[2])} |', table)
        self.assertIn('| model | batch | noise | rate | 1x | 2x | 4x |', table)
        self.assertNotIn('diverged', table)
        self.assertNotIn('nan', table)
        ladder = table.split('| model | batch | noise | rate | 1x | 2x | 4x |\n|---|---|---|---|---|---|---|\n')[1]
        rows = re.findall(r'^\| (\d)L (\w+) \| (\d+) \| [^|]+ \| [\d.e-]+ \| (.+) \|$', ladder.split('\n\n')[0], re.M)
        self.assertEqual(len(rows), len(L['mixers']) + len(L['subset']))
        for row in rows:
            self.assertEqual(row[3].count('+-'), 3 if int(row[2]) == L['batch'] else 2, row)   # 2 seeds a rung
        before, rest = self.written.split(icl_ladder.BEGIN)
        section, after = rest.split(icl_ladder.END)
        self.assertEqual((before, after), tuple(p.split(icl_ladder.BEGIN if i == 0 else icl_ladder.END)[i] for i, p in
                                                enumerate((self.PAGE, self.PAGE))))
        self.assertIn(table.strip(), section)
        self.assertIn(f'](../assets/{icl_ladder.FIGURE})', section)
        self.assertGreater(os.path.getsize(os.path.join(self.tmp, 'assets', icl_ladder.FIGURE)), 10000)
        with open(os.path.join(self.out, 'mixer_ladder.md')) as f:
            self.assertEqual(f.read(), table)

    def test_second_run_trains_nothing_and_writes_the_same(self):
        self.assertEqual(self.second.returncode, 0, self.second.stderr[-2000:])
        self.assertIn('; 0 jobs run;', self.second.stderr)
        self.assertRegex(self.first.stderr, r'; [1-9]\d* jobs run;')
        self.assertEqual({f: os.path.getmtime(f) for f in cached_results(self.out)}, self.stamps)
        self.assertGreater(len(self.stamps), 20)
        self.assertEqual(self.second.stdout, self.first.stdout)


class TestCommandLine(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.out = tempfile.mkdtemp()
        # --mixer_budget 1e-6: the floor of 3 steps a model on any machine (--quick's 0.3 s: 6 to 34 steps here)
        args = ('--quick', '--mixers', '--ladder', '--noise', ','.join(NOISE), '--mixer_budget', '1e-6', '--out',
                cls.out)
        cls.first = run_experiment('icl', *args)
        cls.stamps = {f: os.path.getmtime(f) for f in cached_results(cls.out)}
        cls.second = run_experiment('icl', *args)       # every job cached

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.out, ignore_errors=True)

    def test_quick_run_has_every_row_finite_and_a_plot(self):
        self.assertEqual(self.first.returncode, 0, self.first.stderr[-2000:])
        table = self.first.stdout
        for L, param in icl_report.PAPER_MODELS:
            self.assertIn(f'| {L}L {reg.PARAM_NAMES[param]} |', table)
        for name in ('CONSTRR', 'ADARR', 'TUNEDRR', '2L flat', '4L toeplitz', '2L transformer', '4L recurrent',
                     '2L linear_attention'):
            self.assertIn(f'| {name}', table)
        self.assertNotIn('nan', table)
        for f in cached_results(self.out):
            res = json.load(open(f))
            for m in res.get('models', [res]):
                self.assertTrue(math.isfinite(m.get('sweep', 0)) or not m.get('finished', True), f)
        lsa = [f for f in cached_results(self.out) if os.path.basename(os.path.dirname(f)).startswith('lsa-')]
        self.assertEqual(len(lsa), len(icl_report.PAPER_MODELS) + len(icl.LADDER_MODELS))   # a job an architecture
        for f in lsa:
            if 'ladder' not in f:
                self.assertEqual(len(json.load(open(f))['models']), len(NOISE) * icl.SETTINGS['quick']['seeds'])
        mixers = {os.path.basename(os.path.dirname(f)) for f in cached_results(self.out) if '/mixers/' in f}
        for v in icl_mixers.MIXER_VARIANTS:
            self.assertTrue(any(m.startswith(f'calibrate-{v}-L2-products-') for m in mixers), mixers)
            for L in (2, 4):
                for noise in icl_mixers.MIXER_NOISE:
                    full = [m for m in mixers if m.startswith(f'{v}-L{L}-noise{noise}-') and 'seed1' in m]
                    self.assertEqual(len(full), 1, (v, L, noise))            # two seeds at the chosen rate
        self.assertIn('### Where one step of gradient descent fails', table)
        self.assertIn('## The budget ladder of the disagreeing verdicts', table)
        for png in ('mixers.png', 'icl.png'):
            self.assertGreater(os.path.getsize(os.path.join(self.out, png)), 10000)
        self.assertGreater(table.count('| agree') + table.count('| disagree'), 5)

    def test_rerun_reuses_every_job_and_prints_the_same_report(self):
        self.assertEqual(self.second.returncode, 0, self.second.stderr[-2000:])
        self.assertEqual({f: os.path.getmtime(f) for f in cached_results(self.out)}, self.stamps)
        self.assertEqual(self.second.stdout, self.first.stdout)

    def test_bad_arguments_give_one_line_and_exit_2(self):
        """One bad argument through the command line, end to end (in this process: test_faults runs icl's command
        line as a process); the others through icl.parse_args, where the command line meets them."""
        r = run_in_process('-m', 'experiments.icl', '--noise', '0,9x', '--out', self.out)
        self.assertEqual((r.returncode, len(r.stderr.strip().splitlines())), (2, 1), r.stderr)
        self.assertTrue(r.stderr.startswith('icl.py: error:'))
        assert_one_line_exit_2(self, [['--params', 'dense'], ['--layers', 'two'], ['--iters', '0'], ['--noise', '=2'],
                                      ['--device', 'cuda']], self.out)
