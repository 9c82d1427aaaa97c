"""Tests for claims.py, its report (claims_report.py) and the model options it compares
(GPT-style transformer, naive attention, the extra linear layer after the embedding).

Part of the suite run by python test_mixer.py (or alone: python test_mixer.py test_claims).
"""
import json
import math
import os
import shutil
import tempfile
import unittest

import torch

import mixer
from experiments import claims_report
from tests.common import (HAVE_TEXT, NO_TEXT, cached_results, prepared_data, run_experiment, run_in_process,
                          step_pieces, tiny_model)

ROOT = os.path.dirname(os.path.abspath(__file__))


class TestClaimModels(unittest.TestCase):

    def test_naive_attention_equals_sdpa_in_forward_and_cached_decode(self):
        for name in ('transformer', 'gpt', 'hybrid'):
            sdpa = tiny_model(name)
            naive = tiny_model(name, attention='naive')
            naive.load_state_dict(sdpa.state_dict())
            idx = torch.randint(0, 64, (2, 20))
            with self.subTest(variant=name):
                torch.testing.assert_close(naive(idx)[0], sdpa(idx)[0], atol=1e-5, rtol=0)
                torch.testing.assert_close(step_pieces(naive, idx, (7, 5, 8)), sdpa(idx)[0][:, [6, 11, 19]],
                                           atol=1e-5, rtol=0)

    def test_gpt_has_no_rotary_positions_but_learned_ones(self):
        model = tiny_model('gpt')
        self.assertIsNotNone(model.wpe)
        self.assertTrue(all(not b.mixing.rope for b in model.blocks))
        self.assertIsInstance(model.blocks[0].norm1, torch.nn.LayerNorm)
        self.assertIsInstance(model.blocks[0].ff, mixer.MLP)
        # without the learned positions one layer cannot tell the order: a permutation of the
        # earlier tokens gives the same last-position logits (softmax attention is a set operation)
        model = tiny_model('gpt', n_layer=1)
        with torch.no_grad():
            model.wpe.zero_()
        idx = torch.tensor([[5, 9, 12, 30, 7]])
        perm = torch.tensor([[9, 30, 5, 12, 7]])
        torch.testing.assert_close(model(idx)[0][:, -1], model(perm)[0][:, -1], atol=1e-5, rtol=0)
        llama = tiny_model('transformer', n_layer=1)      # RoPE: the order matters
        self.assertGreater((llama(idx)[0][:, -1] - llama(perm)[0][:, -1]).abs().max().item(), 1e-4)

    def test_embed_proj_is_used_and_causal(self):
        model = tiny_model('kernel', feature_kernel=4, embed_proj=True)
        idx = torch.randint(0, 64, (2, 16))
        logits = model(idx)[0]
        idx2 = idx.clone()
        idx2[:, 9] = (idx2[:, 9] + 1) % 64
        self.assertTrue(torch.equal(model(idx2)[0][:, :9], logits[:, :9]))
        with torch.no_grad():
            model.embed_proj.weight.mul_(2)
        self.assertGreater((model(idx)[0] - logits).abs().max().item(), 1e-4)


class TestVerdict(unittest.TestCase):

    def test_difference_counts_only_beyond_the_spreads(self):
        self.assertEqual(claims_report.verdict([3.0, 3.2], [3.05, 3.15], 'better'), 'within noise')
        self.assertEqual(claims_report.verdict([3.0, 3.2], [3.05, 3.15], 'equal'), 'yes (within noise)')
        self.assertEqual(claims_report.verdict([2.0, 2.1], [3.0, 3.1], 'better'), 'yes (better)')
        self.assertEqual(claims_report.verdict([2.0, 2.1], [3.0, 3.1], 'worse'), 'no (better)')
        self.assertEqual(claims_report.verdict([2.0, 2.1], [3.0, 3.1], 'equal'), 'no (better)')
        self.assertEqual(claims_report.verdict([0.9, 0.8], [0.1, 0.2], 'better', higher_is_better=True), 'yes (better)')
        self.assertEqual(claims_report.verdict([float('inf'), 3.0], [3.0, 3.1], 'better'), 'undecided (a run failed)')

    def test_a_failed_run_is_named_not_averaged(self):
        self.assertEqual(claims_report.fmt([3.0, float('inf')], unit='nats'), 'failed in 1 of 2 runs')
        self.assertEqual(claims_report.fmt([3.0, 3.2], unit='nats'), '3.100 +- 0.100 nats')
        diverged = {'rc': 1, 'evals': [[0, 8.3, 2.99, 0.0]]}       # stopped at a non-finite loss after step 0's eval
        plan = {'m': {'runs': [{'rc': 0, 'evals': [[9, 3.0, 1.1, 0.3]]}, diverged], 'lr': 3e-3, 'sweep': {},
                      'steps': 9, 'command': 'c'}}
        row = claims_report.run_rows(plan, 1000, 10)[0]
        self.assertEqual(row[6:8], ['failed in 1 of 2 runs'] * 2)


@unittest.skipUnless(HAVE_TEXT, NO_TEXT)
class TestClaimsQuick(unittest.TestCase):
    """python claims.py --quick on real text (at its floor of 12 steps a run): every row, finite numbers, a plot,
    and a cache."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        data = prepared_data(whole=True)
        cls.out = os.path.join(cls.tmp, 'claims')
        # --budget 0.01: every run takes claims' floor of 12 steps, whatever the machine's speed (--quick's 1 s of
        # training a run, 10 to 100 ms a step here, made the work follow the machine and cost the suite its
        # seconds on any machine); the rows, the numbers and the cache are what the tests check
        args = ('--quick', '--budget', '0.01', '--data_dir', data, '--out', cls.out)
        cls.first = run_experiment('claims', *args)
        cls.mtimes = {p: os.path.getmtime(p) for p in cached_results(cls.out)}
        cls.second = run_experiment('claims', *args)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_every_row_present_with_finite_numbers(self):
        self.assertEqual(self.first.returncode, 0, self.first.stderr[-3000:])
        with open(os.path.join(self.out, 'claims.md')) as f:
            table = f.read()
        for claim in ('llama-style transformer', 'GPT-style', 'expanded', 'layer norms removed',
                      'positional encoding', 'Toeplitz', '2 heads', '4 heads', 'kernel 4 mixer vs',
                      'linear after the embedding', 'hybrid transformer-mixer', 'parallel hybrid', 'recurrent',
                      'linear mixer trains', 'retrieval top-1 at N=32, mixer vs transformer embeddings',
                      'mean pooling instead of the last token', 'untrained flat mixer embeddings retrieve worse',
                      'autoencoder token accuracy', "trained autoencoder's embeddings retrieve no better",
                      'represents self and non-self tokens', 'non-self representation accuracy after all blocks',
                      'loses non-self accuracy', 'expanded vs flat mixer: non-self', '## Input representation accuracy',
                      '## Retrieval with autoencoder embeddings', 'lowest test loss at step', 'training memory',
                      'Muon vs AdamW, flat', 'Muon vs AdamW, transformer',
                      'best mixer vs best transformer', 'fewer attention heads are more efficient',
                      'best mixer width is larger', 'flat mixer vs transformer as the budget grows',
                      'toeplitz mixer vs transformer as the budget grows', "generalisation gap (val - train windows)",
                      'flat_mixing_wd (--mixing_weight_decay', 'flat_mixing_lr (--mixing_lr_mult', '## Budget sweep'):
            with self.subTest(claim=claim):
                self.assertIn(claim, table)
        self.assertNotIn('failed', table)
        self.assertNotIn('nan', table)
        with open(os.path.join(self.out, 'runs.jsonl')) as f:
            runs = [json.loads(l) for l in f]
        self.assertEqual({r['model'] for r in runs}, set(claims_report.MODELS))
        for r in runs:
            self.assertEqual(r['rc'], 0)
            self.assertTrue(math.isfinite(r['evals'][-1][1]), r['model'])

    def test_plots_are_written(self):
        for name in ('curves.png', 'budgets.png'):
            path = os.path.join(self.out, name)
            self.assertTrue(os.path.isfile(path), name)
            with open(path, 'rb') as f:
                self.assertEqual(f.read(8), b'\x89PNG\r\n\x1a\n')

    def test_window_losses_read_each_final_checkpoint(self):
        """The budget sweep's validation-window loss of every final checkpoint is its run's
        own last eval (the same windows, the same weights); its training-window loss is
        another number (other text; a 1 s model can score both alike, so across runs)."""
        found, diffs = 0, []
        for d, _, files in os.walk(self.out):
            if os.path.basename(d).startswith('windows-') and 'result.json' in files:
                with open(os.path.join(d, 'result.json')) as f:
                    w = json.load(f)
                with open(os.path.join(os.path.dirname(d), 'result.json')) as f:
                    last_eval = json.load(f)['evals'][-1]
                with self.subTest(run=os.path.relpath(d, self.out)):
                    self.assertAlmostEqual(w['val_loss'], last_eval[1], places=4)
                diffs.append(abs(w['train_loss'] - w['val_loss']))
                found += 1
        self.assertGreater(max(diffs), 0.01)
        # --quick: budgets 1 and 2, 2 seeds
        runs = 2 * 2 * len(claims_report.BUDGET_MODELS) + len(claims_report.REGULARISE)
        self.assertEqual(found, runs)

    def test_second_call_reuses_every_run(self):
        self.assertEqual(self.second.returncode, 0, self.second.stderr[-3000:])
        self.assertEqual({p: os.path.getmtime(p) for p in cached_results(self.out)}, self.mtimes)
        self.assertNotIn('runs, about', self.second.stderr)        # no phase had anything to train
        self.assertIn('cached', self.second.stderr)
        self.assertEqual(self.second.stdout, self.first.stdout)     # the same table, from the cache

    def test_bad_arguments_are_one_line_errors(self):
        """(In this process: test_faults runs a bad claims.py argument as a process.)"""
        for args, msg in ((['--models', 'nope'], 'unknown model'), (['--budget', '0'], 'positive'),
                          (['--budgets', '1,x'], 'argument --budgets: expected a number'), (['--budgets', '0,1'], 'positive'),
                          (['--data_dir', os.path.join(self.tmp, 'missing')], 'prepare.py')):
            r = run_in_process('-m', 'experiments.claims', *args)
            with self.subTest(args=args):
                self.assertEqual(r.returncode, 2)
                self.assertIn(msg, r.stderr)
                self.assertNotIn('Traceback', r.stderr)


if __name__ == '__main__':
    unittest.main()
