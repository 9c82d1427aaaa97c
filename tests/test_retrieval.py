"""Tests for retrieval.py, its pairs (data/pairs.py) and its embeddings (data/embeddings.py): inverse cloze
pairs, the equivariant retrieval mixer, early stopping at chance and the Wilson interval, batched
embeddings, an end-to-end run on real text, and bad inputs.

    python test_mixer.py test_retrieval

Real text comes from $TINYSTORIES_DIR (train.txt, valid.txt), by default
../shared/data/tinystories beside the repo; tests that need it are skipped
with a printed reason if it is absent.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

import mixer
import retrieval
from data import embeddings, pairs as data_pairs

from tests.common import HAVE_TEXT, NO_TEXT, ROOT, TEXT_DIR, finished, prepared_data, run_in_process, start
from tests.common import tiny_checkpoint as shared_checkpoint


def need_text():
    if not HAVE_TEXT:
        print(f'skipped: {NO_TEXT}')
        raise unittest.SkipTest(NO_TEXT)


ENV = {**os.environ, 'OMP_NUM_THREADS': '1'}


def run(*args):
    """Run retrieval.py (or another project script) -> CompletedProcess (text)."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=ENV)


def run_here(*args):
    """retrieval.py's command line in this process (tests.common.run_in_process) -> CompletedProcess."""
    return run_in_process(*args, env=ENV, timeout=600)


def tiny_checkpoint():
    """(data dir, checkpoint): tests.common's shared fixtures. In our runs a few hundred
    steps of LM training of such tiny models erased the bag-of-words signal of the
    near-init checkpoint before building their own (near chance), so these tests check
    the pipeline on real text, not the quality of LM training."""
    need_text()
    return prepared_data(), shared_checkpoint()


def read_json(path):
    with open(path) as f:
        return json.load(f)


class TestPairs(unittest.TestCase):

    def test_sentence_splitter(self):
        text = 'Tom said, "Hi!" Then he ran home.\nWhy? Because it rained'
        got = [text[a:b] for a, b in data_pairs.split_sentences(text)]
        self.assertEqual(got, ['Tom said, "Hi!"', 'Then he ran home.', 'Why?', 'Because it rained'])

    def test_inverse_cloze_pairs_on_real_text(self):
        need_text()
        stories = data_pairs.read_text_stories(os.path.join(TEXT_DIR, 'valid.txt'))[:300]
        pairs = data_pairs.ict_pairs(stories, seed=0, per_story=2)
        self.assertGreater(len(pairs), 400)
        for p in pairs:
            story = stories[p['story']]
            self.assertIn(p['query'], story)                    # taken out of the original story
            self.assertNotIn(p['query'], p['target'])           # and really absent from the target
            self.assertGreaterEqual(len(data_pairs.split_sentences(story)), 3)
            # the target is the story minus that sentence (up to whitespace at the cut)
            self.assertEqual(''.join(p['target'].split()), ''.join(story.replace(p['query'], '', 1).split()))
            self.assertTrue(story.startswith(p['target'][:p['cut']]))   # cut = end of the text before
        self.assertEqual(pairs, data_pairs.ict_pairs(stories, seed=0, per_story=2))   # fixed seed
        train, test = data_pairs.split_by_story(pairs, 0.2, seed=0)
        self.assertEqual(sorted(train + test), list(range(len(pairs))))
        tr, te = {pairs[i]['story'] for i in train}, {pairs[i]['story'] for i in test}
        self.assertFalse(tr & te, 'a story is on both sides of the split')
        self.assertAlmostEqual(len(te) / len(tr | te), 0.2, delta=0.01)
        # each story gave at most 2 pairs, with different queries
        by_story = {}
        for p in pairs:
            by_story.setdefault(p['story'], []).append(p['query'])
        self.assertTrue(all(len(v) <= 2 and len(set(v)) == len(v) for v in by_story.values()))

    def test_target_window_is_centred_on_the_cut(self):
        class WordEncoder:                       # one token per word, eot = -1
            eot_token = -1

            def encode_ordinary(self, text):
                return [int(w[1:]) for w in text.split()]
        words = ' '.join(f'w{i}' for i in range(200))
        pair = {'query': 'w1 w2', 'target': words, 'cut': words.index('w120')}
        q, t = data_pairs.encode_pairs([pair], WordEncoder(), 33)
        self.assertEqual(q[0], [-1, 1, 2])
        self.assertEqual(t[0], [-1] + list(range(104, 136)))     # 32 words around word 120
        pair['cut'] = words.index('w190')
        self.assertEqual(data_pairs.encode_pairs([pair], WordEncoder(), 33)[1][0], [-1] + list(range(168, 200)))
        pair['cut'] = None                       # a --pairs target keeps its beginning
        self.assertEqual(data_pairs.encode_pairs([pair], WordEncoder(), 33, prefix_eot=False)[1][0],
                         list(range(33)))


class TestRetrievalMixer(unittest.TestCase):

    def test_permutation_equivariant_in_the_candidates_for_any_n(self):
        torch.manual_seed(0)
        model = retrieval.RetrievalMixer(d_in=12, d_r=16, n_layer=2).eval()
        with torch.no_grad():                   # move every parameter off its init (b = d = 0 ...)
            for p in model.parameters():
                p.add_(0.3 * torch.randn_like(p))
            model.set_input_stats(torch.randn(50, 12))
        for n in (1, 2, 7, 33):
            q, c = torch.randn(3, 12), torch.randn(3, n, 12)
            perm = torch.randperm(n)
            s = model(q, c)
            with self.subTest(n=n):
                self.assertEqual(tuple(s.shape), (3, n))
                torch.testing.assert_close(model(q, c[:, perm]), s[:, perm], atol=1e-5, rtol=1e-5)
                if n > 1:   # the scores do depend on the query and on the other candidates
                    self.assertGreater((model(q.flip(0), c) - s).abs().max().item(), 1e-4)
                    c2 = c.clone()
                    c2[:, 0] += 1.0
                    self.assertGreater((model(q, c2)[:, 1:] - s[:, 1:]).abs().max().item(), 1e-5)

    def test_learns_a_synthetic_problem(self):
        # query = noisy copy of its target's embedding; every pair its own story
        g = torch.Generator().manual_seed(0)
        t = torch.randn(600, 24, generator=g)
        q = t + 0.5 * torch.randn(600, 24, generator=g)
        stories = np.arange(600)
        torch.manual_seed(0)
        model = retrieval.RetrievalMixer(24, d_r=32, n_layer=1)
        retrieval.train_retrieval(model, q[:500], t[:500], stories[:500], n=8, steps=150, batch_size=32,
                                        lr=3e-3, seed=0)
        for n in (8, 32):
            draws = data_pairs.candidate_draws(stories[500:], n, rounds=2, seed=0)
            acc = retrieval.accuracy(lambda a, b: model(a, b), q[500:], t[500:], draws)
            with self.subTest(n=n):
                self.assertGreater(acc, 0.9, f'N={n}: top-1 accuracy {acc:.3f}')

    def test_early_stopping_keeps_the_parameters_of_the_lowest_validation_loss(self):
        g = torch.Generator().manual_seed(0)
        t = torch.randn(200, 8, generator=g)
        q = t + 0.5 * torch.randn(200, 8, generator=g)
        torch.manual_seed(0)
        model = retrieval.RetrievalMixer(8, d_r=16, n_layer=1)
        scripted, seen = iter([3.0, 1.0, 2.0, 1.5, 2.5]), []      # lowest at the 2nd check: step 20

        def val_loss():
            seen.append({k: v.clone() for k, v in model.state_dict().items()})
            return next(scripted)
        fit = retrieval.train_retrieval(model, q, t, np.arange(200), n=4, steps=50, batch_size=16,
                                              seed=0, val_loss=val_loss, test_loss=lambda: 0.0, every=10)
        self.assertEqual([c[0] for c in fit['curve']], [10, 20, 30, 40, 50])
        self.assertEqual(fit['kept_step'], 20)
        self.assertFalse(all(torch.equal(seen[1][k], seen[-1][k]) for k in seen[1]))   # it did move on
        for k, v in model.state_dict().items():
            torch.testing.assert_close(v, seen[1][k], atol=0, rtol=0)

    def early_stopped(self, scripted, **kw):
        """train_retrieval whose validation losses are `scripted` (checks every 10 of 60 steps) -> (its dict,
        the model's parameters at each check, the model)."""
        g = torch.Generator().manual_seed(0)
        t = torch.randn(200, 8, generator=g)
        q = t + 0.5 * torch.randn(200, 8, generator=g)
        torch.manual_seed(0)
        model = retrieval.RetrievalMixer(8, d_r=16, n_layer=1)
        scripted, seen = iter(scripted), []

        def val_loss():
            seen.append({k: v.clone() for k, v in model.state_dict().items()})
            return next(scripted)
        fit = retrieval.train_retrieval(model, q, t, np.arange(200), n=4, steps=60, batch_size=16,
                                              seed=0, val_loss=val_loss, test_loss=lambda: 0.0, every=10,
                                              **kw)
        return fit, seen, model

    def assert_parameters(self, model, state):
        for k, v in model.state_dict().items():
            torch.testing.assert_close(v, state[k], atol=0, rtol=0)

    def test_only_a_check_below_chance_is_kept(self):
        """The issue's case: the first check at chance (ln 16 = 2.773: 2.778) was kept for being the lowest.
        Below chance only: a later, lower check below it is kept; none below: kept_step None, said as 'no
        better than chance at N=16', and the model keeps its last parameters; a check beats chance by more
        than 2 standard errors."""
        chance = math.log(16)
        fit, seen, model = self.early_stopped([2.778, 2.80, 2.70, 2.79, 2.75, 2.85], chance=chance)
        self.assertEqual((fit['kept_step'], fit['last_step'], fit['chance']), (30, 60, chance))
        self.assert_parameters(model, seen[2])
        self.assertEqual(retrieval.kept_cell(fit, 16),
                         'kept step 30 (val loss 2.700 +- 0.000, chance ln 16 = 2.773)')
        fit, seen, model = self.early_stopped([2.778, 2.80, 2.79, 2.781, 2.9, 2.85], chance=chance)
        self.assertEqual((fit['kept_step'], fit['last_step']), (None, 60))
        self.assertFalse(all(torch.equal(seen[0][k], v) for k, v in model.state_dict().items()))   # not 10
        self.assertEqual(retrieval.kept_cell(fit, 16), 'no better than chance at N=16 (lowest val loss '
                                                       '2.778 +- 0.000, chance ln 16 = 2.773): kept its last '
                                                       'step, 60')
        result = {'name': 'm', 'loss': {'16': {'train': 1.0, 'test': 2.0}}, 'val_n': 16, 'best_test_step': 10,
                  'kept_step': fit['kept_step'], 'last_step': fit['last_step']}
        row = retrieval.loss_table([result], [16], 60).splitlines()[-1]
        self.assertEqual(row, '| m | 1.000 / 2.000 | none: no better than chance at N=16 | 60 of 60 | 10 |')
        # beating chance by more than 2 standard errors: 2.70 +- 0.05 does not, 2.75 +- 0.005 does
        fit, seen, model = self.early_stopped([(2.70, 0.05), (2.75, 0.005), (2.76, 0.1), (2.9, 0.1),
                                               (3.0, 0.1), (2.8, 0.1)], chance=chance)
        self.assertEqual(fit['kept_step'], 20)
        self.assert_parameters(model, seen[1])

    def test_patience_stops_after_that_many_checks_without_a_lower_one(self):
        """patience 3: the lowest at step 20, then 3 checks without a lower one: it stops at step 50 (the 0.5
        of step 60 never measured), with step 20's parameters; patience 0 runs every step."""
        fit, seen, model = self.early_stopped([3.0, 1.0, 2.0, 1.5, 2.5, 0.5], patience=3)
        self.assertEqual([c[0] for c in fit['curve']], [10, 20, 30, 40, 50])
        self.assertEqual((fit['kept_step'], fit['last_step']), (20, 50))
        self.assert_parameters(model, seen[1])
        fit, _, _ = self.early_stopped([3.0, 1.0, 2.0, 1.5, 2.5, 0.5], patience=0)
        self.assertEqual((fit['kept_step'], fit['last_step']), (60, 60))

    def test_wilson_interval(self):
        """The 95% Wilson score interval against values computed apart: 0.530 of 368 trials (0.479, 0.581: it
        holds chance 0.5), 0 of 10 (0, 0.278), 1 of 1 (0.207, 1)."""
        for p, n, want in ((0.530, 368, (0.47896, 0.58042)), (0.0, 10, (0.0, 0.27753)),
                           (1.0, 1, (0.20655, 1.0))):
            lo, hi = retrieval.wilson(p, n)
            self.assertAlmostEqual(lo, want[0], places=4)
            self.assertAlmostEqual(hi, want[1], places=4)

    def test_candidate_draws_are_fixed_and_exclude_the_querys_story(self):
        stories = np.array([0, 0, 1, 2, 3, 3, 4, 5, 6, 7])
        a = data_pairs.candidate_draws(stories, 4, rounds=2, seed=3)
        b = data_pairs.candidate_draws(stories, 4, rounds=2, seed=3)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
        qs, cs, ls = a
        for q, c, label in zip(qs, cs, ls):
            self.assertEqual(c[label], q)
            self.assertEqual(len(set(c.tolist())), 4)
            self.assertEqual(sum(stories[j] == stories[q] for j in c), 1)


class TestEmbeddings(unittest.TestCase):

    def test_batched_embedding_equals_alone(self):
        g = torch.Generator().manual_seed(0)
        seqs = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (5, 1, 17, 9, 24, 9, 3, 12, 20, 2)]
        for name in ('flat', 'transformer', 'toeplitz', 'linear_attention'):
            torch.manual_seed(0)
            cfg = mixer.variant_config(name, vocab_size=64, n_ctx=24, d_model=32, n_layer=2, n_head=1,
                                       chunk_size=8)
            model = mixer.build_model(cfg).eval()
            for layer in (None, 0):
                batched = embeddings.embed_tokens(model, seqs, layer=layer, batch_size=4)
                mean = embeddings.embed_tokens(model, seqs, layer=layer, batch_size=4, pool='mean')
                for i, s in enumerate(seqs):
                    alone = model.hidden(torch.tensor([s]), layer=layer)[0, -1]      # the last token's vector
                    mean_alone = model.hidden(torch.tensor([s]), layer=layer)[0].mean(0)
                    with self.subTest(variant=name, layer=layer, length=len(s)):
                        torch.testing.assert_close(batched[i], alone, atol=1e-5, rtol=0)
                        torch.testing.assert_close(mean[i], mean_alone, atol=1e-5, rtol=0)
        torch.manual_seed(0)
        ae = mixer.build_model(mixer.ModelConfig(vocab_size=64, n_ctx=24, d_model=32, n_layer=1, n_head=1,
                                                 task='autoencode')).eval()
        batched = embeddings.embed_tokens(ae, seqs, batch_size=4)
        for i, s in enumerate(seqs):
            torch.testing.assert_close(batched[i], ae.encode(torch.tensor([s]))[0], atol=1e-5, rtol=0)


class TestEndToEnd(unittest.TestCase):
    """Two retrieval.py runs end to end. They go side by side, one thread each: the controls' run
    starts in setUpClass and its test waits for it."""

    @classmethod
    def setUpClass(cls):
        data, cls.ckpt = tiny_checkpoint()
        cls.tmp = tempfile.mkdtemp(prefix='retrieval_ctl_')
        cls.out = os.path.join(cls.tmp, 'res.json')
        cls.controls = start('retrieval.py', '--ckpt', cls.ckpt, '--text', os.path.join(TEXT_DIR, 'valid.txt'),
                             '--steps', '250', '--max_pairs', '600', '--d_r', '16', '--train_n', '8', '--batch_size',
                             '32', '--untrained', '--pool', 'last', 'mean', '--n_candidates', '2', '32', '--cache_dir',
                             os.path.join(cls.tmp, 'cache'), '--json', cls.out)

    @classmethod
    def tearDownClass(cls):
        if cls.controls.poll() is None:
            cls.controls.kill()
        finished(cls.controls)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_short_run_beats_chance_and_uses_the_cache(self):
        # Inverse cloze on the 1,841 stories of the shared valid.txt (4 pairs a story), embedded
        # by the tiny checkpoint. With so little LM training the signal is small but clear.
        data, ckpt = tiny_checkpoint()
        tmp = tempfile.mkdtemp(prefix='retrieval_test_')
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        out = os.path.join(tmp, 'res.json')
        args = ['retrieval.py', '--ckpt', ckpt, '--text', os.path.join(TEXT_DIR, 'valid.txt'), '--steps', '1500',
                '--per_story', '4', '--max_pairs', '8000', '--d_r', '32', '--train_n', '8', '--batch_size', '32',
                '--cache_dir', os.path.join(tmp, 'cache'), '--json', out]
        r = run(*args)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        res = read_json(out)
        self.assertEqual(res['ns'], [2, 8, 32, 128])
        self.assertGreaterEqual(res['test_stories'], 300)
        self.assertGreaterEqual(res['test_pairs'], 1200)             # 3 draws each: about 0.003 s.e. at N = 32
        self.assertIn('| (chance) | 1/N | 0.500 | 0.125 | 0.031 | 0.008 |', r.stdout)
        acc, ci = res['results'][0]['accuracy'], res['results'][0]['accuracy_95']
        self.assertEqual(set(acc), {'mixer (trained)', 'cosine', 'cosine (centred)'})
        for method, a in acc.items():      # each beside its 95% Wilson interval over the test queries
            cells = [f'{a[n]:.3f} ({ci[method][n][0]:.3f}-{ci[method][n][1]:.3f})'
                     for n in ('2', '8', '32', '128')]
            self.assertIn(f'| {ckpt} | {method} | ' + ' | '.join(cells) + ' |', r.stdout)
            for n, v in a.items():
                self.assertEqual(ci[method][n], list(retrieval.wilson(v, res['test_pairs'])))
                self.assertTrue(0 <= ci[method][n][0] <= v <= ci[method][n][1] <= 1)
        # the retrieval model on its own, not the best of three methods. Measured here: 0.158 at N = 8
        # and 0.016 at N = 128 (chance 0.125, 0.008), about 6 and 4 standard errors above chance;
        # cosine similarity does better on these near-untrained embeddings (0.146, 0.024).
        trained = acc['mixer (trained)']
        self.assertGreater(trained['8'], 1.15 / 8, acc)
        self.assertGreater(trained['128'], 1.5 / 128, acc)
        self.assertEqual(len(os.listdir(os.path.join(tmp, 'cache'))), 1)
        # second run (in this process; 50 steps: the retrieval model's 1,500 were a third of the test's time):
        # embeddings from the cache, and cosine similarity on them, which no training touches, scores as on the
        # first run's (the same fixed draws); --json replaced only when asked
        r2 = run_here(*[a if a != '1500' else '50' for a in args], '--overwrite')
        self.assertEqual(r2.returncode, 0, r2.stderr[-2000:])
        self.assertIn('from cache', r2.stderr)
        self.assertEqual(len(os.listdir(os.path.join(tmp, 'cache'))), 1)
        again = read_json(out)['results'][0]['accuracy']
        for method in ('cosine', 'cosine (centred)'):
            self.assertEqual(again[method], acc[method])

    def test_controls_untrained_and_mean_pool_and_the_loss_curve(self):
        ckpt, tmp, out = self.ckpt, self.tmp, self.out
        r = finished(self.controls)                      # started in setUpClass
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        res = read_json(out)
        names = [x['name'] for x in res['results']]
        self.assertEqual(names, [ckpt, f'{ckpt} [mean pool]', f'{ckpt} (untrained)', f'{ckpt} (untrained) [mean pool]'])
        self.assertEqual(len(os.listdir(os.path.join(tmp, 'cache'))), 4)     # four different embeddings
        for x in res['results']:
            self.assertEqual([c[0] for c in x['curve']], [50, 100, 150, 200, 250])   # patience 5: never stops
            self.assertAlmostEqual(x['val_chance'], math.log(x['val_n']))
            below = [c for c, se in zip(x['curve'], x['val_se'])           # kept: the lowest below chance
                     if c[2] + retrieval.CHANCE_SE * se < x['val_chance']]
            self.assertEqual(x['kept_step'], min(below, key=lambda c: c[2])[0] if below else None)
            self.assertIn(f'- {x["name"]}: ', r.stdout)
            self.assertIn(x['kept'], r.stdout)
            self.assertEqual(x['best_test_step'], min(x['curve'], key=lambda c: c[3])[0])
            self.assertEqual(x['loss']['32']['test'] > 0, True)
            self.assertIn(f'| {x["name"]} | ', r.stdout)
        self.assertIn(f'| (chance: ln N) | {math.log(2):.3f} | {math.log(32):.3f} | | | |', r.stdout)
        # the untrained model is a different model: its embeddings differ from the checkpoint's
        trained, untrained = res['results'][0], res['results'][2]
        self.assertNotEqual(trained['loss'], untrained['loss'])


class TestBadInputs(unittest.TestCase):
    """retrieval.py's command line in this process (test_faults runs one of its bad inputs as a process)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix='retrieval_bad_')
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.fake_ckpt = os.path.join(self.tmp, 'ckpt.pt')       # a file, never loaded by these tests
        with open(self.fake_ckpt, 'wb') as f:
            f.write(b'not a checkpoint')
        self.pairs = os.path.join(self.tmp, 'pairs.jsonl')

    def write_pairs(self, lines):
        with open(self.pairs, 'w') as f:
            f.write('\n'.join(lines) + '\n')

    def check_error(self, r, *needles):
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertNotIn('Traceback', r.stderr)
        last = r.stderr.strip().splitlines()[-1]        # earlier lines: progress only
        self.assertTrue(last.startswith('retrieval.py: error: '), r.stderr)
        for s in needles:
            self.assertIn(s, last)

    def test_malformed_pairs_line(self):
        good = json.dumps({'query': 'a cat', 'target': 'the cat sat on the mat'})
        for bad in ('{"query": "x", "target": ', '{"query": "x"}', '["x", "y"]', '{"query": 3, "target": "y"}'):
            self.write_pairs([good, good, '', bad, good])
            r = run_here('retrieval.py', '--ckpt', self.fake_ckpt, '--pairs', self.pairs)
            with self.subTest(line=bad):
                self.check_error(r, 'line 4')

    def test_missing_and_corrupt_checkpoint_and_too_large_n(self):
        self.write_pairs([json.dumps({'query': f'q{i}', 'target': f't{i}'}) for i in range(20)])
        r = run_here('retrieval.py', '--ckpt', self.fake_ckpt + '.missing', '--pairs', self.pairs)
        self.check_error(r, 'not found')
        r = run_here('retrieval.py', '--ckpt', self.fake_ckpt, '--pairs', self.pairs, '--n_candidates', '2', '8')
        self.check_error(r, 'larger than the test set')
        r = run_here('retrieval.py', '--ckpt', self.fake_ckpt, '--pairs', self.pairs, '--n_candidates', '2',
                '--no_cache')
        self.check_error(r, 'corrupt')

    def test_one_checkpoint_given_twice_is_refused(self):
        """The same --ckpt twice, as spelled, through another spelling or through a link: one line, exit 2,
        before any work (it would be computed twice, two identical rows)."""
        self.write_pairs([json.dumps({'query': f'q{i}', 'target': f't{i}'}) for i in range(20)])
        link = os.path.join(self.tmp, 'link.pt')
        os.symlink(self.fake_ckpt, link)
        other = os.path.join(self.tmp, '..', os.path.basename(self.tmp), 'ckpt.pt')
        for second in (self.fake_ckpt, other, link):
            with self.subTest(second=second):
                r = run_here('retrieval.py', '--ckpt', self.fake_ckpt, '--ckpt', second, '--pairs', self.pairs)
                self.check_error(r, '--ckpt', 'give each once')
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_values_that_would_run_wrong_or_be_ignored_are_refused(self):
        """Found trying the command as a new user: each was accepted (a value computed twice, a zero or
        infinite learning rate, an empty --json, --pairs or --cache_dir ignored, a folder read as a missing
        file) or a traceback from the optimiser or numpy (a negative learning rate or weight decay, a
        negative or huge --seed); now one line and exit 2 before any work."""
        self.write_pairs([json.dumps({'query': f'q{i}', 'target': f't{i}'}) for i in range(20)])
        base = ['retrieval.py', '--ckpt', self.fake_ckpt, '--no_cache']
        cases = ((['--lr', '-1'], 'argument --lr: must be positive'), (['--lr', 'nan'], '--lr'),
                 (['--weight_decay', '-1'], '--weight_decay'), (['--pool', 'last', 'last'], '--pool names last twice'),
                 (['--n_candidates', '2', '2'], '--n_candidates names 2 twice'), (['--json', ''], 'empty path'),
                 (['--pairs', ''], '--pairs is empty'), (['--pairs', self.tmp], 'is a folder'),
                 (['--cache_dir', ''], '--cache_dir is empty'), (['--seed', '-1'], 'argument --seed: must be >= 0'),
                 (['--seed', str(2 ** 70)], 'argument --seed: must be <= 4294967295'))
        for args, msg in cases:
            with self.subTest(args=args):
                r = run_here(*base, *([] if '--pairs' in args else ['--pairs', self.pairs]), *args)   # a flag once
                self.check_error(r, msg)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        r = run_here('retrieval.py', '--ckpt', self.fake_ckpt, '--data_dir', self.pairs, '--no_cache')
        self.check_error(r, 'is a file, not a prepared data folder')

    def test_a_folder_given_as_the_checkpoint_is_named_a_folder(self):
        """A run folder given as --ckpt: 'is a folder', and the ckpt.pt inside it named (not 'not found')."""
        self.write_pairs([json.dumps({'query': f'q{i}', 'target': f't{i}'}) for i in range(20)])
        empty = os.path.join(self.tmp, 'empty')
        os.mkdir(empty)
        for folder, words in ((self.tmp, ['is a folder', f'did you mean {self.fake_ckpt!r}']),
                              (empty, ['is a folder', 'OUT_DIR/ckpt.pt'])):
            with self.subTest(folder=folder):
                self.check_error(run_here('retrieval.py', '--ckpt', folder, '--pairs', self.pairs), *words)


if __name__ == '__main__':
    unittest.main()
