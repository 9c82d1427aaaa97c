"""Tests of the multi-query associative recall experiment (Arora et al. 2023, "Zoology"):
experiments/mqar.py (the generator, the answer positions, causality through the task for every
kind, exact-answer accuracy) and experiments/mqar_report.py, and the quick run end to end.

Part of the suite run by python test_mixer.py (or alone: python test_mixer.py test_mqar).
"""
import io
import json
import math
import os
import shutil
import tempfile
import unittest
from unittest import mock

import numpy as np
import torch

from experiments import mqar, mqar_data, mqar_report, runner
from tests.common import cached_results, run_experiment, run_in_process

T, KV, V = 16, 2, 32            # a tiny cell


class OneThread(unittest.TestCase):
    """Tests of tiny models on one torch thread: two threads on a busy 2-core machine made their many
    small forward passes 200 times slower (14 s against 0.07 s, measured)."""

    @classmethod
    def setUpClass(cls):
        cls.threads = torch.get_num_threads()
        torch.set_num_threads(1)

    @classmethod
    def tearDownClass(cls):
        torch.set_num_threads(cls.threads)


def tiny(kind, seed=0, d_model=16):
    """A tiny model of `kind` at the tiny cell whose biases and per-position weights are moved off their
    init (as tests/common.tiny_model does), so that every parameter matters."""
    model = mqar.build(kind, T, V, d_model, 2, seed).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.split('.')[-1] in ('c', 'c2', 'v', 'w', 'W', 'W2', 'wpe', 'bias'):
                p.add_(0.05 * torch.randn_like(p))
    return model


class TestGenerator(OneThread):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.x, cls.y = mqar_data.mqar(2000, 64, 4, 64, seed=1)

    def test_keys_and_values_come_from_disjoint_halves_and_are_distinct(self):
        keys, values = self.x[:, 0:8:2], self.x[:, 1:8:2]
        self.assertTrue(((keys >= 1) & (keys < 32)).all())
        self.assertTrue(((values >= 32) & (values < 64)).all())
        for a in (keys, values):                                   # kv distinct keys (values) a sequence
            self.assertTrue((np.sort(a, 1)[:, 1:] != np.sort(a, 1)[:, :-1]).all())
        self.assertEqual(set(np.unique(self.x[:, 8:])) - set(range(1, 32)), {mqar_data.FILLER})   # then keys and filler

    def test_every_answer_is_the_value_paired_with_that_key_earlier(self):
        n_checked = 0
        for x, y in zip(self.x, self.y):
            asked = []
            for t in np.flatnonzero(y >= 0):
                earlier = [j for j in range(0, 8, 2) if x[j] == x[t]]
                self.assertEqual(len(earlier), 1)                  # the query is a key of this sequence...
                self.assertLess(earlier[0], t)                     # ...given before it
                self.assertEqual(y[t], x[earlier[0] + 1])          # its answer: the value paired with it
                asked.append(x[t])
                n_checked += 1
            self.assertEqual(sorted(asked), sorted(x[0:8:2]))      # each key asked exactly once
        self.assertEqual(n_checked, 2000 * 4)

    def test_the_mask_selects_exactly_the_answer_positions(self):
        query = np.zeros_like(self.y, dtype=bool)
        query[:, 8:] = self.x[:, 8:] != mqar_data.FILLER                # after the pairs: the queries, and filler
        np.testing.assert_array_equal(self.y >= 0, query)
        self.assertTrue(((self.y >= 0).sum(1) == 4).all())
        self.assertTrue((self.y[self.y < 0] == -1).all())
        self.assertTrue((np.flatnonzero(self.y[0] >= 0) % 2 == 0).all())     # even positions, as Zoology's
        model = tiny('transformer')                                 # and answer_logits reads exactly those positions
        x, y = (torch.from_numpy(a[:8, :T]) for a in mqar_data.mqar(8, T, KV, V, seed=2))
        logits, answers = mqar.answer_logits(model, x, y)
        with torch.no_grad():
            full = model(x)[0]
        torch.testing.assert_close(logits, full[y >= 0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(answers, y[y >= 0])

    def test_the_same_seed_gives_the_same_sequences(self):
        a, b, c = (mqar_data.mqar(300, 128, 8, 64, seed=s) for s in (5, 5, 6))
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)
        self.assertFalse(np.array_equal(a[0], c[0]))
        out = tempfile.mkdtemp()
        try:                                                         # the cached files hold the same sequences
            s = {**mqar.PROTOCOLS['quick'], 'cells': ((128, 8),), 'vocab_size': 64, 'n_train': 300, 'n_test': 20}
            self.assertEqual(len(mqar_data.make_data(out, s, 5)), 2)
            self.assertEqual(mqar_data.make_data(out, s, 5), [])          # made once
            x, y = mqar_data.load_split(os.path.join(out, mqar_data.split_files(s, 128, 8, 5)['train']))
            np.testing.assert_array_equal(x.numpy(), a[0])
            np.testing.assert_array_equal(y.numpy(), a[1])
            x, _ = mqar_data.load_split(os.path.join(out, mqar_data.split_files(s, 128, 8, 5)['test']))
            np.testing.assert_array_equal(x.numpy(), mqar_data.mqar(20, 128, 8, 64, seed=15)[0])
        finally:
            shutil.rmtree(out)

    def test_gaps_follow_the_power_law(self):
        """With one pair, the query's gap g is drawn with probability proportional to (g + 1)^(a - 1)."""
        x, y = mqar_data.mqar(40000, 64, 1, 64, seed=3)
        gaps = (np.flatnonzero(y >= 0) % 64 - 2) // 2
        freq = np.bincount(gaps, minlength=31) / len(gaps)
        p = np.arange(1, 32) ** (mqar.POWER_A - 1)
        np.testing.assert_allclose(freq, p / p.sum(), atol=0.01)

    def test_a_cell_that_does_not_fit_is_refused(self):
        for T_, kv, v in ((16, 5, 64), (64, 4, 8)):
            with self.assertRaises(ValueError):
                mqar_data.mqar(2, T_, kv, v, seed=0)


class TestCausality(OneThread):

    def test_no_kind_sees_the_answer_it_predicts(self):
        """For every kind: the logits at a query are unchanged when its answer is placed right after it
        and every later token is changed; they change when the pair it asks for is changed."""
        x, y = (torch.from_numpy(a) for a in mqar_data.mqar(4, T, KV, V, seed=4))
        g = torch.Generator().manual_seed(0)
        for kind in mqar.MQAR_VARIANTS:
            model = tiny(kind)
            with self.subTest(kind=kind), torch.no_grad():
                logits, _ = mqar.answer_logits(model, x, y)
                for row, q in torch.nonzero(y >= 0).tolist():
                    only = torch.full_like(y, -1)
                    only[row, q] = y[row, q]
                    after = x.clone()
                    after[row, q + 1:] = torch.randint(V, (T - q - 1,), generator=g)
                    if q + 1 < T:
                        after[row, q + 1] = y[row, q]                      # the answer itself, one step late
                    ref = logits[(y >= 0).nonzero().tolist().index([row, q])]
                    torch.testing.assert_close(mqar.answer_logits(model, after, only)[0][0], ref, rtol=0, atol=1e-5)
                    pair = [j for j in range(0, 2 * KV, 2) if x[row, j] == x[row, q]][0]
                    before = x.clone()
                    before[row, pair + 1] = (before[row, pair + 1] - V // 2 + 1) % (V // 2) + V // 2
                    changed = mqar.answer_logits(model, before, only)[0][0]
                    self.assertGreater((changed - ref).abs().max().item(), 1e-6)   # the test can see a change


class TestAccuracy(OneThread):

    def test_only_exact_answers_count(self):
        logits = torch.tensor([[0.0, 0.1, 0.2, 0.9],        # answer 3: right
                               [0.5, 0.4, 0.0, 0.0],        # answer 1: second best, a near miss
                               [0.7, 0.0, 0.7, 0.0],        # answer 2: tied with 0, which argmax takes first
                               [0.3, 0.0, 0.0, 0.1]])       # answer 0: right
        self.assertEqual(mqar.count_correct(logits, torch.tensor([3, 1, 2, 0])), (2, 4))

    def test_evaluate_counts_the_answer_positions_alone(self):
        """A fake model whose logits are given: right at 3 of 4 answer positions, a near miss at the 4th,
        wrong at every other position -> accuracy 0.75."""
        x = torch.tensor([[0, 5, 1, 1], [1, 5, 2, 2]])            # x[:, 0]: the row, for the fake model
        y = torch.tensor([[-1, 2, -1, 3], [-1, 2, 0, -1]])
        table = torch.full((2, 4, 4), 0.0)
        table[..., 1] = 1.0                                        # wrong (1) wherever nothing is set
        table[0, 1, 2] = table[0, 3, 3] = table[1, 1, 2] = 2.0     # right
        table[1, 2, 1], table[1, 2, 0] = 2.0, 1.5                  # the answer 0 second best

        class Fake(torch.nn.Module):
            norm_f = lm_head = torch.nn.Identity()

            def hidden(self, idx):
                return table[idx[:, 0]]
        loss, acc = mqar.evaluate(Fake(), x, y, batch_size=1)
        self.assertEqual(acc, 0.75)
        self.assertTrue(math.isfinite(loss))

    def test_the_table_takes_each_cells_best_rate(self):
        ok = lambda acc: {'rc': 0, 'acc': acc, 'test_loss': 0.1, 'epochs': 1, 'seconds': 1, 'diverged': False}
        grid = {('flat', 2, 64, 4, 64): {1e-3: ok(0.5), 3e-4: ok(0.75)},
                ('flat', 2, 64, 4, 128): {1e-3: ok(0.4), 3e-4: {'rc': 1, 'line': 'its process died'}},
                ('transformer', 2, 64, 4, 64): {1e-3: ok(1.0), 3e-4: ok(1.0)}}
        self.assertEqual(mqar.best(grid[('flat', 2, 64, 4, 64)]), (0.75, 3e-4))
        self.assertEqual(mqar.best(grid[('flat', 2, 64, 4, 128)]), (0.4, 1e-3))     # a failed rate counts 0
        self.assertEqual(mqar.best(grid[('transformer', 2, 64, 4, 64)]), (1.0, 3e-4))    # a tie: the smaller rate
        self.assertEqual(mqar.best_mixer(grid, 2), 'flat')
        s = {'cells': ((64, 4),), 'd_models': (64, 128)}
        table = mqar_report.accuracy_table(grid, [('flat', 2), ('transformer', 2)], s)
        self.assertIn('| flat | 0.750 (0.0003) | 0.400 (0.001) |', table)
        self.assertIn('| transformer | 1.000 (0.0003) | - |', table)


class TestWindow(unittest.TestCase):
    """The learning-rate window protocol (docs/mqar_window.md; issue 45): its plan and its plateau rule."""

    def test_the_window_plans_every_kind_at_every_rate(self):
        """--protocol window plans one job a kind and rate: at least 7 rates, log-spaced from 1e-4 to past
        1e-2 with Zoology's four (logspace(-4, -2, 4)) among them, each in its own folder."""
        out = tempfile.mkdtemp()
        try:
            args = mqar.parse_args(['--protocol', 'window', '--out', out])
        finally:
            shutil.rmtree(out)
        jobs = mqar.plan(args.s, args.kinds, 2, args.s['seed'], out)
        lrs = sorted({j.spec['lr'] for j, _ in jobs})
        self.assertGreaterEqual(len(lrs), 7)
        self.assertEqual(lrs[0], 1e-4)
        self.assertGreater(lrs[-1], 1e-2)
        for zoology in np.logspace(-4, -2, 4):
            self.assertTrue(any(math.isclose(lr, zoology, rel_tol=1e-9) for lr in lrs), zoology)
        np.testing.assert_allclose(np.diff(np.log(lrs)), np.log(10) / 3)
        self.assertEqual(sorted((j.spec['kind'], j.spec['lr']) for j, _ in jobs),
                         sorted((k, lr) for k in mqar.MQAR_VARIANTS for lr in lrs))
        self.assertEqual(len({j.dir for j, _ in jobs}), len(jobs))
        self.assertTrue(all(j.spec['epochs'] == 16 and j.spec['patience'] == 8 for j, _ in jobs))

    def test_the_plateau_rule_waits_its_patience(self):
        """A run stops only after `patience` epochs without a rise of 0.01 over the best before them: never
        before that many epochs, never while it still rises, never without a patience."""
        flat = [0.25] * 9
        self.assertFalse(mqar.plateaued(flat[:8], 8))                 # 8 epochs: not yet a plateau
        self.assertTrue(mqar.plateaued(flat, 8))
        self.assertFalse(mqar.plateaued(flat + [0.27], 8))           # a late rise of 0.02 keeps it going
        self.assertTrue(mqar.plateaued([0.25] + [0.255] * 8, 8))     # rises under 0.01 do not
        self.assertFalse(mqar.plateaued([0.25] * 30, None))
        self.assertFalse(mqar.plateaued([0.25] * 30, 0))


class TestTraining(OneThread):

    def test_every_kind_trains_through_fit(self):
        """Each of the 13 kinds at the tiny cell, 2 epochs of 4 steps through fit (the quick run trains 4 of
        them end to end): every step taken, finite losses, an accuracy in [0, 1], and every parameter that
        gets a gradient moved by the optimiser."""
        train = tuple(torch.from_numpy(a) for a in mqar_data.mqar(64, T, KV, V, seed=1))
        test = tuple(torch.from_numpy(a) for a in mqar_data.mqar(32, T, KV, V, seed=11))
        spec = dict(lr=1e-3, weight_decay=0.01, batch_size=16, epochs=2, patience=None, seed=0)
        for kind in mqar.MQAR_VARIANTS:
            model = mqar.build(kind, T, V, 16, 2, 0)
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            res = mqar.fit(model, train, test, spec, 'cpu')
            with self.subTest(kind=kind):
                self.assertEqual((res['steps'], res['epochs'], res['diverged']), (8, 2, False))
                self.assertTrue(all(math.isfinite(v) for c in res['curve'] for v in c[1:3]), res['curve'])
                self.assertTrue(0.0 <= res['acc'] <= 1.0)
                moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
                self.assertEqual(moved, [n for n, p in model.named_parameters() if p.grad is not None])


def zoology_rate(lr, epoch):
    """Zoology's trainer's rate in `epoch` (1-based), written as fit wrote it before the warm-up existed:
    lr times its cosine over 64 epochs, stepped once an epoch."""
    return lr * 0.5 * (1 + math.cos(math.pi * (epoch - 1) / mqar.SCHEDULE_EPOCHS))


class TestWarmup(OneThread):
    """The warm-up of the MQAR trainer (issue 58): its per-step schedule, what fit steps at, and its
    place in the jobs' keys."""

    def rates_fit_steps_at(self, warmup, per_epoch=4, epochs=5, lr=1e-3):
        """Train a tiny model with fit (per_epoch steps an epoch, no early stop at the tiny cell) and read
        the rate of every optimiser step off the optimiser itself -> list of floats, one a step."""
        seen, make = [], mqar.optimizer

        def recording(model, lr, weight_decay):
            opt = make(model, lr, weight_decay)
            step = opt.step
            opt.step = lambda: (seen.append([g['lr'] / g['lr_mult'] for g in opt.param_groups]), step())[1]
            return opt
        train = tuple(torch.from_numpy(a) for a in mqar_data.mqar(32 * per_epoch, T, KV, V, seed=1))
        test = tuple(torch.from_numpy(a) for a in mqar_data.mqar(32, T, KV, V, seed=11))
        spec = dict(lr=lr, weight_decay=0.01, batch_size=32, epochs=epochs, patience=None, seed=0,
                    **({'warmup': warmup} if warmup else {}))
        with mock.patch.object(mqar, 'optimizer', recording):
            res = mqar.fit(mqar.build('flat', T, V, 16, 2, 0), train, test, spec, 'cpu')
        self.assertEqual(res['steps'], per_epoch * epochs)
        self.assertEqual(len(seen), res['steps'])
        for groups in seen:                               # every group at the same rate (times its lr_mult)
            self.assertEqual(len(set(groups)), 1, groups)
        return [groups[0] for groups in seen]

    def test_the_warm_up_ramps_the_rate_linearly_from_0_each_step_then_zoologys_cosine(self):
        """Warm-up 0.3 of 5 epochs of 4 steps: the first 6 steps (into the 2nd epoch) at lr (s + 1) / 6 times
        Zoology's cosine, the rest at that cosine alone; a staircase (the rate set once an epoch) fails."""
        lr, per_epoch, epochs = 1e-3, 4, 5
        self.assertEqual(mqar.warmup_steps(0.3, per_epoch * epochs), 6)
        self.assertEqual(mqar.warmup_steps(0.0, per_epoch * epochs), 0)
        self.assertEqual(mqar.warmup_steps(0.01, per_epoch * epochs), 1)          # never a warm-up of no step
        want = [zoology_rate(lr, s // per_epoch + 1) * min(1.0, (s + 1) / 6) for s in range(per_epoch * epochs)]
        got = self.rates_fit_steps_at(0.3, per_epoch, epochs, lr)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        np.testing.assert_allclose(got, [mqar.lr_at(s, lr, per_epoch, epochs, 0.3) for s in range(len(got))],
                                   rtol=1e-12)
        self.assertAlmostEqual(got[0], lr / 6, delta=1e-12)                     # from 0: the first step at lr / W
        ramp = np.array(got[:6]) / [zoology_rate(lr, s // per_epoch + 1) for s in range(6)]
        np.testing.assert_allclose(np.diff(ramp), 1 / 6, rtol=1e-9)              # linear, one step at a time
        self.assertEqual(got[6:], want[6:])                                      # then the cosine alone
        self.assertGreater(got[5], got[4])                                       # not held for an epoch

    def test_warm_up_0_is_zoologys_trainer_exactly(self):
        """Without a warm-up every step is at the rate of the trainer before the warm-up, float for float:
        lr times the cosine of its epoch."""
        lr, per_epoch, epochs = 2.2e-3, 4, 5
        want = [zoology_rate(lr, s // per_epoch + 1) for s in range(per_epoch * epochs)]
        self.assertEqual(self.rates_fit_steps_at(0, per_epoch, epochs, lr), want)
        self.assertEqual([mqar.lr_at(s, lr, 500, 16) for s in range(8000)],
                         [zoology_rate(lr, s // 500 + 1) for s in range(8000)])

    def test_two_warm_ups_are_two_jobs_and_none_keeps_the_old_key(self):
        """On one --out: the window protocol's default warm-up (0.1), another (0.05) and none are three jobs
        a (kind, rate); none's key is the key of the spec without the field, which is what every job had
        before the warm-up existed (pinned: the folder of the window's first table's transformer at 1e-4)."""
        out = tempfile.mkdtemp()
        try:
            plans = {w: mqar.plan(mqar.parse_args(['--protocol', 'window', '--kinds', 'transformer', '--out', out]
                                                  + ([] if w is None else ['--warmup', w])).s,
                                  ['transformer'], 2, 0, out) for w in (None, '0.1', '0.05', '0')}
        finally:
            shutil.rmtree(out)
        keys = {w: [j.dir.rsplit('-', 1)[1] for j, _ in jobs] for w, jobs in plans.items()}    # NAME-KEY
        self.assertEqual(keys[None], keys['0.1'])                                 # the window's default: 0.1
        self.assertEqual(len(set(keys['0.1'] + keys['0.05'] + keys['0'])), 3 * len(mqar.PROTOCOLS['window']['lrs']))
        for (j0, _), (j1, _) in zip(plans['0'], plans['0.1']):
            self.assertEqual(j1.spec['warmup'], 0.1)
            self.assertNotIn('warmup', j0.spec)
            without = {k: v for k, v in j1.spec.items() if k != 'warmup'}
            self.assertEqual(j0.spec, without)
            self.assertTrue(j0.dir.endswith('-' + runner.spec_key([without, mqar.VERSION])), j0.dir)
            self.assertFalse(j1.dir.endswith('-' + runner.spec_key([without, mqar.VERSION])), j1.dir)
        self.assertEqual(os.path.basename(plans['0'][0][0].dir), 'transformer-L2-T64-kv4-d128-lr0.0001-3c4e655672',
                         "the key of a job without a warm-up moved: the window's cached runs would all run again")

    def test_a_warm_up_outside_0_to_1_is_refused(self):
        out = tempfile.mkdtemp()
        try:
            for w in ('1', '1.5', '-0.1', 'nan'):
                with self.subTest(warmup=w), self.assertRaises(SystemExit) as e, \
                        mock.patch('sys.stderr', new_callable=io.StringIO):
                    mqar.parse_args(['--protocol', 'window', '--warmup', w, '--out', out])
                self.assertEqual(e.exception.code, 2)
        finally:
            shutil.rmtree(out)


class TestArguments(unittest.TestCase):
    """mqar's settings checked before any work, in one line, exit 2 (issue 57), in this process."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def refused(self, *argv):
        """mqar.parse_args(argv) exits 2 with one line on stderr -> that line."""
        err = io.StringIO()
        with mock.patch('sys.stderr', err), self.assertRaises(SystemExit) as e:
            mqar.parse_args(list(argv))
        self.assertEqual(e.exception.code, 2, err.getvalue())
        lines = err.getvalue().strip().splitlines()
        self.assertEqual(len(lines), 1, err.getvalue())
        return lines[0]

    def test_a_field_that_changes_what_a_row_is_is_refused(self):
        """--fields may set a kind's other settings, never its kind or its mixing: flat with kind=transformer
        would train a transformer named flat[kind=transformer]. The kind's own value is no change."""
        for kinds, field in (('flat', 'kind=transformer'), ('transformer', 'kind=mixer'), ('flat', 'token_mixing=toeplitz'),
                             ('toeplitz,flat', 'token_mixing=toeplitz'), ('transformer', 'token_mixing=recurrent')):
            with self.subTest(kinds=kinds, field=field):
                line = self.refused('--quick', '--kinds', kinds, '--fields', field, '--out', self.tmp)
                self.assertTrue(line.startswith(f'mqar.py: error: --fields: {field} changes what the '), line)
                self.assertIn('--kinds', line)
        args = mqar.parse_args(['--quick', '--kinds', 'toeplitz', '--fields', 'token_mixing=toeplitz,n_head=1,kind=mixer',
                                '--out', self.tmp])
        self.assertEqual(args.s['fields'], {'token_mixing': 'toeplitz', 'n_head': 1, 'kind': 'mixer'})

    def test_the_deep_row_is_a_masked_mixer(self):
        """best_mixer reads the kind a row's model has, fields and all: a row named flat that trains a
        transformer is never the masked mixers' best."""
        ok = {'rc': 0, 'acc': 1.0}
        self.assertIsNone(mqar.best_mixer({('flat[kind=transformer]', 2, 16, 2, 32): {1e-3: ok}}, 2,
                                          {'kind': 'transformer'}))
        self.assertEqual(mqar.best_mixer({('flat[n_head=2]', 2, 16, 2, 32): {1e-3: ok}}, 2, {'n_head': 2}), 'flat')

    def test_a_field_of_the_wrong_type_is_named_with_its_type(self):
        """Each --fields value has its ModelConfig field's type, said with the field's name (not "'>=' not
        supported between instances of 'str' and 'int'"); a name that is no field is said so."""
        for field, said in (('n_head=abc', "n_head must be int, got 'abc'"),
                            ('n_head=2.5', 'n_head must be int, got 2.5'),
                            ('n_head=True', 'n_head must be int, got True'),
                            ('dropout=abc', "dropout must be float, got 'abc'"),
                            ('final_norm=1', 'final_norm must be bool, got 1'),
                            ('activation=3', 'activation must be str, got 3'),
                            ('nope=1', 'nope is not a field of ModelConfig')):
            with self.subTest(field=field):
                line = self.refused('--quick', '--kinds', 'flat', '--fields', field, '--out', self.tmp)
                self.assertTrue(line.startswith(f'mqar.py: error: --fields: {said}'), line)
        args = mqar.parse_args(['--quick', '--kinds', 'toeplitz', '--fields', 'n_head=1,dropout=0,final_norm=False,'
                                'mixing_init=normal', '--out', self.tmp])
        self.assertEqual(args.s['fields']['dropout'], 0)

    def test_cached_only_on_a_folder_without_cached_runs_is_refused_and_makes_nothing(self):
        """--cached_only trains nothing: on a folder that does not exist, or holds no cached run (a typo in
        --out), it is refused in one line, exit 2, and nothing is made (no folder, no data, no report)."""
        missing = os.path.join(self.tmp, 'typo')
        self.assertIn('does not exist', self.refused('--quick', '--cached_only', '--out', missing))
        os.makedirs(os.path.join(self.tmp, 'runs', 'flat-L2-unfinished'))      # a job that never finished
        self.assertIn('holds none', self.refused('--quick', '--cached_only', '--out', self.tmp))
        for out in (missing, self.tmp):
            r = run_in_process('-m', 'experiments.mqar', '--quick', '--cached_only', '--out', out)
            with self.subTest(out=out):
                self.assertEqual(r.returncode, 2, r.stderr[-2000:])
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertTrue(r.stderr.startswith('mqar.py: error: --cached_only '), r.stderr)
        self.assertFalse(os.path.exists(missing))
        self.assertEqual(os.listdir(self.tmp), ['runs'])
        self.assertEqual(os.listdir(os.path.join(self.tmp, 'runs')), ['flat-L2-unfinished'])
        self.refused('--quick', '--cached_only', '--estimate', '--out', self.tmp)

    def test_cached_only_makes_no_data_and_says_why_there_is_no_deep_row(self):
        """--cached_only on a folder with a cached run (of another plan here: this plan's rows read '-'):
        the report in OUT/cached_only, no data generated, the deep row's absence given its own reason."""
        other = os.path.join(self.tmp, 'runs', 'other-run')
        os.makedirs(other)
        with open(os.path.join(other, 'result.json'), 'w') as f:
            json.dump({'rc': 0}, f)
        r = run_in_process('-m', 'experiments.mqar', '--quick', '--kinds', 'flat', '--cached_only', '--out', self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(sorted(os.listdir(self.tmp)), ['cached_only', 'runs'])
        self.assertIn('(0 of 1 runs were cached', r.stdout)
        self.assertIn('Deep row: none (--cached_only reports the 2-layer runs alone).', r.stdout)


# the quick run's kinds (4 runs and the deep row; every kind of the 13 trains through fit in TestTraining): the
# mixers' three token-mixing paths and attention
QUICK_KINDS = ('flat', 'expanded', 'recurrent', 'transformer')


class TestQuickRun(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.out = tempfile.mkdtemp()
        cls.first = run_experiment('mqar', '--quick', '--kinds', ','.join(QUICK_KINDS), '--out', cls.out)
        cls.warm = run_in_process('-m', 'experiments.mqar', '--quick', '--kinds', 'transformer', '--deep_layers', '0',
                                  '--warmup', '0.25', '--out', cls.out)      # one job more, beside the first's
        cls.stamps = {f: os.path.getmtime(f) for f in cached_results(cls.out)}
        cls.second = run_in_process('-m', 'experiments.mqar', '--quick', '--kinds', ','.join(QUICK_KINDS), '--out',
                                    cls.out)                                        # all cached: no process

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.out, ignore_errors=True)

    def test_the_kinds_run_and_the_transformer_recalls(self):
        self.assertEqual(self.first.returncode, 0, self.first.stderr[-2000:])
        res = json.load(open(os.path.join(self.out, 'results.json')))
        runs = {(r['kind'], r['n_layer']): r for r in res['runs']}
        self.assertEqual({k for k, L in runs if L == 2}, set(QUICK_KINDS))
        self.assertEqual([L for k, L in runs if L != 2], [4])
        self.assertIn(res['deep'], mqar.MASKED_VARIANTS)
        for r in runs.values():
            self.assertEqual(r['rc'], 0)
            self.assertTrue(0.0 <= r['acc'] <= 1.0)
            self.assertLessEqual(r['epochs'], mqar.PROTOCOLS['quick']['epochs'])
        kv, values = mqar.PROTOCOLS['quick']['cells'][0][1], mqar.PROTOCOLS['quick']['vocab_size'] // 2
        # above chance (1 / values) and above 1 / kv, what returning any value of the sequence would score
        self.assertGreater(runs[('transformer', 2)]['acc'], 1 / kv + 0.2)
        self.assertGreater(1 / kv, 1 / values)
        text = self.first.stdout
        for kind in QUICK_KINDS:
            self.assertIn(f'| {kind} | ', text)
        self.assertIn(f'| {res["deep"]}, 4 layers | ', text)
        self.assertGreater(os.path.getsize(os.path.join(self.out, 'mqar.png')), 10000)

    def test_a_warm_up_is_a_job_of_its_own_beside_the_run_without(self):
        """On the quick run's --out, where the transformer without a warm-up is cached: with a 25% warm-up it
        trains anew, each report heading names its trainer, and both stay cached side by side (--warmup 0
        takes the first run's job, another warm-up finds none)."""
        self.assertEqual(self.warm.returncode, 0, self.warm.stderr[-2000:])
        self.assertIn('(0 of 1 runs were cached', self.warm.stdout)
        for text, trainer in ((self.warm.stdout, 'trainer: 25% linear warm-up'), (self.first.stdout,
                                                                                 'trainer: no warm-up')):
            headings = [line for line in text.splitlines() if line.startswith('## ')]
            self.assertEqual(len(headings), 2, headings)                    # the accuracy table, every run
            for line in headings:
                self.assertIn(trainer, line)
        runs = [json.load(open(f))['argv'] for f in cached_results(self.out)]
        self.assertEqual(sorted(r.get('warmup', 0) for r in runs if r.get('kind') == 'transformer'), [0, 0.25])
        for warmup, cached in (('0', '1 of 1'), ('0.25', '1 of 1'), ('0.5', '0 of 1')):
            r = run_in_process('-m', 'experiments.mqar', '--quick', '--kinds', 'transformer', '--deep_layers', '0',
                               '--warmup', warmup, '--cached_only', '--out', self.out)
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            self.assertIn(f'({cached} runs were cached', r.stdout)

    def test_rerun_reuses_every_job_and_gives_the_same_table(self):
        self.assertEqual(self.second.returncode, 0, self.second.stderr[-2000:])
        self.assertEqual({f: os.path.getmtime(f) for f in cached_results(self.out)}, self.stamps)
        self.assertIn('5 of 5 runs were cached', self.second.stdout)
        self.assertEqual(open(os.path.join(self.out, 'mqar.md')).read().strip(), self.second.stdout.strip())
        table = lambda text: text.split('## Test accuracy')[1].split('## Every run')[0]
        self.assertEqual(table(self.second.stdout), table(self.first.stdout))

    def test_cached_only_trains_nothing_and_leaves_the_full_report(self):
        """--cached_only with rates of which one is cached: no job runs, the others read '-', the report goes to
        OUT/cached_only and OUT/mqar.md stays the full run's."""
        lr = mqar.PROTOCOLS['quick']['lrs'][0]
        full = open(os.path.join(self.out, 'mqar.md')).read()
        r = run_in_process('-m', 'experiments.mqar', '--quick', '--kinds', 'transformer,flat', '--lrs',
                           f'{lr},{2 * lr},{4 * lr}', '--cached_only', '--out', self.out)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual({f: os.path.getmtime(f) for f in cached_results(self.out)}, self.stamps)
        self.assertEqual(open(os.path.join(self.out, 'mqar.md')).read(), full)
        self.assertEqual(open(os.path.join(self.out, 'cached_only', 'mqar.md')).read().strip(), r.stdout.strip())
        window = r.stdout.split('## The learning-rate window')[1].split('## Every run')[0]
        for kind in ('transformer', 'flat'):
            row = next(line for line in window.splitlines() if line.startswith(f'| {kind} |'))
            self.assertEqual(row.split(' | ')[2:4], ['-', '-'], row)
        self.assertIn('2 of 6 runs were cached', r.stdout)

    def test_bad_arguments_give_one_line_and_exit_2(self):
        cases = (['--kinds', 'flat,nope'], ['--cells', '16:5'], ['--lrs', '0'], ['--quick', '--protocol', 'gpu'],
                 ['--d_models', '30'], ['--batch_size', '0'])
        for args in cases:                # in this process (test_faults runs mqar's command line as a process)
            r = run_in_process('-m', 'experiments.mqar', *args, '--out', self.out)
            with self.subTest(args=args):
                self.assertEqual(r.returncode, 2)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertTrue(r.stderr.startswith('mqar.py: error:'), r.stderr)


if __name__ == '__main__':
    unittest.main()
