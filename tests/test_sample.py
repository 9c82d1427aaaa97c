"""Tests of sample.py: stories from a checkpoint, --stop_at_eot, its tokens a second, --help with every
default, the line while --compile compiles, and one-line errors for bad input."""

import io
import os
import re
import tempfile
import unittest
from contextlib import redirect_stderr
from unittest import mock

import torch

from tests.common import TINY, assert_samples, run, run_in_process, tiny_checkpoint, tiny_model

SPEED = re.compile(r'^sample.py: ([\d,]+) new tokens in [\d.]+ s, [\d,.]+ tokens/s \((\d+) sample\(s\) as '
                   r"one batch, the prompt's (\d+) tokens read first, on (\w+), (\w+)(?:, compiled)?\)$")


class TestSample(unittest.TestCase):

    def test_sample_prints_stories(self):
        r = run('sample.py', '--ckpt', tiny_checkpoint(), '--start', 'Once upon a time', '--num_samples', '2',
                '--max_new_tokens', '30')
        self.assertEqual(r.returncode, 0, r.stderr)
        assert_samples(self, r.stdout, 'Once upon a time', 2, 30)
        line, = r.stderr.splitlines()                   # the tokens a second on stderr: stdout, the stories
        self.assertEqual(SPEED.match(line).groups()[:2], ('60', '2'))

    def test_stop_at_eot_ends_each_sample_at_the_end_of_its_story(self):
        """The draws made <|endoftext|> at the 3rd new token of sample 1 and the 6th of sample 2, never in
        sample 3: with --stop_at_eot they end there (the header says so), sample 3 runs to --max_new_tokens,
        and each is the start of the sample the same seed draws without the flag; once every sample has ended
        no token more is drawn; the tokens a second count the tokens printed, on --device auto (the CPU
        here)."""
        from harness.loading import load_checkpoint
        ckpt = tiny_checkpoint()
        eot = load_checkpoint(ckpt)[1].eot_token
        real = torch.multinomial

        def drawing(schedule, calls):
            def multinomial(probs, n):
                out = real(probs, n)
                calls.append(1)
                for row, at in schedule.items():
                    if at == len(calls):
                        out[row, 0] = eot
                return out
            return multinomial
        runs = {}
        for flags, schedule in (([], {0: 3, 1: 6}), (['--stop_at_eot'], {0: 3, 1: 6}),
                                (['--stop_at_eot'], {0: 3, 1: 6, 2: 8})):
            calls = []
            with mock.patch.object(torch, 'multinomial', drawing(schedule, calls)):
                r = run_in_process('sample.py', '--ckpt', ckpt, '--num_samples', '3', '--max_new_tokens',
                                   '10', '--start', 'Once', *flags)
            self.assertEqual(r.returncode, 0, r.stderr)
            runs[len(runs)] = (r.stdout.split('--- sample ')[1:], SPEED.match(r.stderr.strip()).groups(),
                               len(calls))
        (plain, plain_speed, plain_calls), (stopped, speed, stopped_calls), (_, _, all_ended) = runs.values()
        self.assertEqual([s.split('\n')[0].split(', ', 2)[-1] for s in stopped],
                         ['3 new tokens, to <|endoftext|>)', '6 new tokens, to <|endoftext|>)',
                          '10 new tokens)'])
        for s, full in zip(stopped, plain):
            text, whole = s.partition('\n')[2].strip(), full.partition('\n')[2].strip()
            self.assertTrue(whole.startswith(text), (text, whole))
        for s in stopped[:2]:
            self.assertTrue(s.strip().endswith('<|endoftext|>'), s)
        self.assertEqual(plain_speed[:2], ('30', '3'))
        self.assertEqual(speed, ('19', '3', '1', 'cpu', 'float32'))
        self.assertEqual((plain_calls, stopped_calls, all_ended), (10, 10, 8))

    def test_help_shows_every_default(self):
        r = run_in_process('sample.py', '--help')
        self.assertEqual(r.returncode, 0, r.stderr)
        options = ' '.join(r.stdout[r.stdout.index('options:'):].split())
        for flag, default in (('--ckpt', 'out/ckpt.pt'), ('--start', '<|endoftext|>'), ('--num_samples', '2'),
                              ('--max_new_tokens', '200'), ('--temperature', '0.8'), ('--top_k', '40'),
                              ('--seed', '1337'), ('--device', 'auto'), ('--compile', 'False'),
                              ('--stop_at_eot', 'False')):
            with self.subTest(flag):
                after = options[options.index(flag + ' '):]
                said = after[after.index('(default: '):]
                self.assertTrue(said.startswith(f'(default: {default})'), after[:200])

    def test_compile_says_so_while_it_compiles(self):
        """compile_now: a line on stderr before the compiled step is made, one with its seconds after; the
        compiled decoder then samples the eager one's greedy tokens (backend 'eager': a trace, no
        compiler)."""
        import sample
        model = tiny_model('flat')
        idx = torch.randint(0, TINY['vocab_size'], (2, 5), generator=torch.Generator().manual_seed(0))
        dec = sample.Decoder(model, 2, compile=True, backend='eager')
        seen = []
        real = dec.compiled

        def compiled():
            seen.append(err.getvalue())
            return real()
        dec.compiled = compiled
        with redirect_stderr(io.StringIO()) as err:
            sample.compile_now(dec, idx)
        self.assertEqual(seen[0], 'sample.py: compiling the decoding step (torch.compile, once: seconds to a '
                                  'minute) ...\n')              # said before the first compiled step
        self.assertRegex(err.getvalue().splitlines()[-1], r'^sample.py: compiled in [\d.]+ s$')
        self.assertTrue(torch.equal(sample.generate(model, idx, 8, temperature=0, decoder=dec),
                                    sample.generate(model, idx, 8, temperature=0)))

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
