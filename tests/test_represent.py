"""Tests of represent.py (input representation accuracy): python test_mixer.py test_represent"""

import json
import os
import shutil
import tempfile
import unittest

import torch

import mixer
from experiments import represent
from tests.common import ROOT, prepared_data, run, run_in_process, tiny_checkpoint

SHAPE = dict(vocab_size=64, n_ctx=16, d_model=16, n_layer=1, n_head=1)


def flat_model(seed=0):
    torch.manual_seed(seed)
    return mixer.build_model(mixer.variant_config('flat', **SHAPE))


def windows(seed=0):
    return torch.randint(64, (2, 12), generator=torch.Generator().manual_seed(seed))


class TestRecover(unittest.TestCase):

    def test_recovery_is_exact_for_an_identity_model(self):
        """Blocks that return their input (mixing and MLP output zeroed): the hidden
        state is the input vector, so self recovery decodes every token."""
        model = flat_model()
        with torch.no_grad():
            for b in model.blocks:
                b.mixing.W.zero_()
                b.mixing.c.zero_()
                b.ff.proj_out.weight.zero_()
                b.ff.proj_out.bias.zero_()
        idx = windows()
        self.assertTrue(torch.equal(model.hidden(None, embeddings=model.wte.weight[idx]), model.wte.weight[idx]))
        res = represent.recover(model, idx, 1, 'self', [0, 3, 7, 10], steps=150, lr=0.05)
        self.assertEqual(res['accuracy'], 1.0)
        self.assertLess(res['chance'], 0.5)

    def test_zeroed_mixing_recovers_no_non_self_token(self):
        """No token mixing: later positions never see the token, so non-self recovery
        stays at the random start; self recovery still works (the test is not empty)."""
        model = flat_model()
        with torch.no_grad():
            for b in model.blocks:
                b.mixing.W.zero_()
                b.mixing.c.zero_()
        idx = windows()
        nonself = represent.recover(model, idx, 1, 'nonself', [0, 3, 7, 10], steps=100, lr=0.05)
        self.assertEqual(nonself['accuracy'], nonself['chance'])
        self.assertLess(nonself['accuracy'], 0.2)
        self.assertEqual(represent.recover(model, idx, 1, 'self', [0, 3, 7, 10], steps=100, lr=0.05)['accuracy'],
                         1.0)

    def test_an_untrained_flat_mixer_carries_earlier_tokens_forward(self):
        """Measured: 7 of 8 (the layer norm before the mixing hides a token's scale and
        mean from later positions, so a few decode to a neighbour); chance 0."""
        res = represent.recover(flat_model(), windows(), 1, 'nonself', [0, 3, 7, 10], steps=150, lr=0.05)
        self.assertGreater(res['accuracy'], 0.7)
        self.assertLess(res['chance'], 0.2)

    def test_the_model_never_changes(self):
        model = flat_model().train()
        model.blocks[0].norm1.weight.requires_grad_(False)        # a flag that must come back as it was
        before = {k: v.clone() for k, v in model.state_dict().items()}
        flags = [p.requires_grad for p in model.parameters()]
        for mode in ('self', 'nonself'):
            represent.recover(model, windows(), 1, mode, [0, 5], steps=20, lr=0.5)
        self.assertTrue(all(torch.equal(before[k], v) for k, v in model.state_dict().items()))
        self.assertEqual([p.requires_grad for p in model.parameters()], flags)
        self.assertTrue(model.training)
        self.assertTrue(all(p.grad is None for p in model.parameters()))

    def test_bad_arguments(self):
        model = flat_model()
        for args in (dict(depth=2, mode='self', positions=[0]), dict(depth=1, mode='other', positions=[0]),
                     dict(depth=1, mode='self', positions=[11])):
            with self.subTest(**args), self.assertRaises(ValueError):
                represent.recover(model, windows(), steps=1, **args)


class TestCommandLine(unittest.TestCase):
    """The --quick table as a process (the command line end to end); the bad arguments and the
    checkpoint runs in this process (tests.common.run_in_process: the same __main__ code)."""

    def test_quick_table_and_one_line_errors(self):
        r = run('-m', 'experiments.represent', '--quick', '--variants', 'flat,transformer', '--steps', '20', '--depths', '1',
                '--windows', '2', '--positions', '3')
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        rows = [l for l in r.stdout.splitlines() if l.startswith('| flat') or l.startswith('| transformer')]
        self.assertEqual(len(rows), 2, r.stdout)
        for args, msg in ((['--variants', 'nope'], 'unknown variant'), (['--depths', 'x'], '--depths'),
                          (['--variants', '', '--ckpt', '/nonexistent.pt'], 'not found'),
                          (['--quick', '--T', '99'], 'n_ctx')):
            r = run_in_process('-m', 'experiments.represent', *args)
            with self.subTest(args=args):
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(msg, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_quick_presets_only_what_was_not_given_and_what_would_be_ignored_or_done_twice(self):
        """--quick's 60 steps only where --steps was not given (--steps 500, the full default, given
        with --quick stays 500); one checkpoint given twice (as spelled or through another spelling),
        --untrained without --ckpt, an empty --json, a --seed torch cannot take: one line, exit 2."""
        cheap = ['--quick', '--variants', 'flat', '--steps', '2', '--depths', '1', '--windows', '1', '--positions',
                 '2', '--T', '4']
        for args, msg in ((['--untrained'], 'give --ckpt'), (['--json', ''], 'empty path'),
                          (['--seed', str(2 ** 70)], 'argument --seed: must be <= 4294967295'),   # was a traceback
                          (['--ckpt', 'README.md', '--ckpt', 'README.md'], 'give each once'),
                          (['--ckpt', 'README.md', '--ckpt', os.path.join(ROOT, 'docs', '..', 'README.md')],
                           'give each once')):
            r = run_in_process('-m', 'experiments.represent', *cheap, *args)    # (cheap, should it run)
            with self.subTest(args=args):
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn(msg, r.stderr)
        self.assertEqual(represent.parse_args(['--quick']).steps, 60)
        self.assertEqual(represent.parse_args(['--quick', '--steps', '500']).steps, 500)
        self.assertEqual(represent.parse_args([]).steps, 500)

    def test_a_depth_named_twice_is_measured_once(self):
        """--depths 2,all on a 2-layer checkpoint: one row, with a note (not two identical rows)."""
        ckpt = tiny_checkpoint()
        r = run_in_process('-m', 'experiments.represent', '--variants', '', '--ckpt', ckpt, '--depths', '2,all',
                           '--T', '4', '--steps', '2', '--windows', '1', '--positions', '2')
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(len([l for l in r.stdout.splitlines() if l.startswith('| flat')]), 1, r.stdout)
        self.assertIn('measured once', r.stderr)

    def test_untrained_control_of_a_checkpoint_and_json(self):
        """--untrained adds a freshly initialised model of the checkpoint's config (seeded by
        its training seed); --json is never overwritten unless asked."""
        ckpt = tiny_checkpoint()
        tmp = tempfile.mkdtemp(prefix='represent_test_')
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        out = os.path.join(tmp, 'r.json')
        args = ['-m', 'experiments.represent', '--variants', '', '--untrained', '--ckpt', ckpt, '--data_dir', prepared_data(),
                '--T', '12', '--steps', '10', '--depths', 'all', '--windows', '1', '--positions', '3', '--json', out]
        r = run_in_process(*args)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        res = json.load(open(out))['results']
        self.assertEqual([(x['ckpt'], x['trained'], x['depth']) for x in res], [(ckpt, True, 2), (ckpt, False, 2)])
        self.assertNotEqual(res[0]['self']['loss'], res[1]['self']['loss'])      # two different models
        r = run_in_process(*args)
        self.assertEqual(r.returncode, 2)
        self.assertIn('exists', r.stderr)
        self.assertEqual(run_in_process(*args, '--overwrite').returncode, 0)
        self.assertEqual(json.load(open(out))['results'], res)                  # seeded: the same numbers


if __name__ == '__main__':
    unittest.main()
