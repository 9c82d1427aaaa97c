"""Tests of sample.py: stories from a checkpoint, and one-line errors for bad input."""

import os
import tempfile
import unittest

from tests.common import assert_samples, run, run_in_process, tiny_checkpoint


class TestSample(unittest.TestCase):

    def test_sample_prints_stories(self):
        r = run('sample.py', '--ckpt', tiny_checkpoint(), '--start', 'Once upon a time', '--num_samples', '2',
                '--max_new_tokens', '30')
        self.assertEqual(r.returncode, 0, r.stderr)
        assert_samples(self, r.stdout, 'Once upon a time', 2, 30)

    def test_sample_bad_inputs(self):
        bad = os.path.join(tempfile.mkdtemp(), 'ckpt.pt')        # a run folder's file name
        with open(bad, 'wb') as f:
            f.write(b'not a checkpoint')
        folder = os.path.dirname(bad)
        cases = ((['--ckpt', bad], 'corrupt'), (['--ckpt', bad + '.missing'], 'not found'),
                 (['--ckpt', folder], f'is a folder, not a checkpoint file; did you mean {bad!r}?'),
                 (['--ckpt', bad, '--seed', str(2 ** 70)], 'argument --seed: must be <= 4294967295'),   # was a
                 (['--ckpt', bad, '--seed', '-1'], 'argument --seed: must be >= 0'),         # traceback in torch
                 (['--ckpt', bad, '--temperature', 'nan'], 'argument --temperature: must be >= 0, got nan'))
        # (a prompt longer than n_ctx is kept by its tail with a warning: test_scale.TestCheckpointTravels)
        for args, msg in cases:                  # in this process (test_faults runs one as a process)
            r = run_in_process('sample.py', *args)
            with self.subTest(args=args[:2]):
                self.assertEqual(r.returncode, 2)
                self.assertIn(msg, r.stderr)
                self.assertNotIn('Traceback', r.stderr)


