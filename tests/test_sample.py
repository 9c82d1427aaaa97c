"""Tests of sample.py: stories from a checkpoint, and one-line errors for bad input."""

import os
import tempfile
import unittest
from unittest import mock

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

    def test_sizes_are_checked_against_memory_before_anything_is_allocated(self):
        """A --num_samples or a --max_new_tokens whose tokens and decoder buffers exceed the machine's memory
        (train.py's rule, machine.memory_error) is refused in one line, exit 2, before the decoder's
        buffers exist (its init_state is called on the meta device only); it once built the batch first
        (a MemoryError's traceback, or a run that never ends). A size that fits still samples."""
        import mixer
        real = mixer.LanguageModel.init_state
        devices = []

        def init_state(self, batch_size, device=None, dtype=None):
            devices.append(str(device))
            return real(self, batch_size, device, dtype)
        ckpt = tiny_checkpoint()
        with mock.patch.object(mixer.LanguageModel, 'init_state', init_state):
            for flags in (['--num_samples', str(10 ** 12)], ['--num_samples', '1', '--max_new_tokens', str(10 ** 12)],
                          ['--num_samples', str(10 ** 6), '--max_new_tokens', str(10 ** 6)]):
                with self.subTest(flags=flags):
                    r = run_in_process('sample.py', '--ckpt', ckpt, *flags, timeout=120)
                    self.assertEqual((r.returncode, r.stdout), (2, ''), r.stderr[-2000:])
                    self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                    self.assertRegex(r.stderr, r'^sample.py: error: sampling [\d,]+ sequences of [\d,]+ tokens would '
                                     r'need [\d,.]+ GiB, more than the [\d,.]+ GiB cpu has: give a smaller --num_samples')
            self.assertEqual(set(devices), {'meta'})
            r = run_in_process('sample.py', '--ckpt', ckpt, '--num_samples', '3', '--max_new_tokens', '4')
        self.assertEqual(r.returncode, 0, r.stderr)
        assert_samples(self, r.stdout, '', 3, 4)
