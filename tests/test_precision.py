"""The CPU's precision chosen by measuring (issue 89): python test_mixer.py test_precision

harness/machine.py's native_bf16 reads the CPU's flags (a fake /proc/cpuinfo here), PrecisionChoice keeps
bf16 only when it is faster by its margin, Tuning falls back to float32 where bf16 is not native; a bf16
autocast step of a tiny model agrees with a float32 one (weights and optimiser state stay float32, the loss
is float32); train.py records its choice as an event and in its checkpoint, and a resumed run trains in the
chosen precision to the same losses as a run never stopped. The step times are fed, not measured: no verdict
here depends on the machine's speed.
"""

import os
import tempfile
import unittest
from types import SimpleNamespace
from unittest import mock

import torch

import mixer
from harness import machine
from tests.common import TINY, prepared_data, read_log, run_in_process


def cpuinfo(flags):
    """A /proc/cpuinfo of one core with these flags -> its path."""
    path = os.path.join(tempfile.mkdtemp(prefix='mixer_cpuinfo_'), 'cpuinfo')
    with open(path, 'w') as f:
        f.write(f'processor\t: 0\nmodel name\t: a test CPU\nflags\t\t: fpu sse2 avx2 {flags}\n\n')
    return path


def fed(choice, times):
    """Step PrecisionChoice `choice` with the step time times[dtype] of the precision each step runs in, until
    it chooses -> (the change, the precisions of the steps in order)."""
    order = []
    for _ in range(100):
        order.append(choice.dtype)
        change = choice.stepped(times[choice.dtype])
        if change:
            return change, order
    raise AssertionError('no choice after 100 steps')


class TestChoice(unittest.TestCase):

    def test_native_bf16_reads_the_cpus_flags(self):
        """avx512_bf16 or amx_bf16 among the flags: native; neither, or no such file: not."""
        self.assertTrue(machine.native_bf16(cpuinfo('avx512f avx512_bf16')))
        self.assertTrue(machine.native_bf16(cpuinfo('amx_tile amx_bf16')))
        self.assertFalse(machine.native_bf16(cpuinfo('avx512f avx512_vnni')))
        self.assertFalse(machine.native_bf16('/no/such/cpuinfo'))

    def test_bf16_only_when_clearly_faster(self):
        """After 3 float32 warm-up steps the two alternate, the first of each dropped, 4 of each timed: bf16 at
        1.5x float32's speed is kept; at 1.05x (inside the 1.1 margin) float32 stays."""
        change, order = fed(machine.PrecisionChoice(), {'float32': 0.3, 'bfloat16': 0.2})
        self.assertEqual(change['dtype'], 'bfloat16')
        self.assertEqual(order, ['float32'] * 3 + ['bfloat16', 'float32'] * 5)
        self.assertAlmostEqual(change['rates']['bfloat16'] / change['rates']['float32'], 1.5)
        change, _ = fed(machine.PrecisionChoice(), {'float32': 0.21, 'bfloat16': 0.2})
        self.assertEqual(change['dtype'], 'float32')

    def test_float32_where_bf16_is_not_native(self):
        """dtype='auto' on a CPU without native bf16: no choice, float32 throughout; with it: a choice; a
        fixed --dtype: none either."""
        env = SimpleNamespace(dev='cpu', cuda=False, ddp=False, dtype='float32')
        with mock.patch.object(machine, 'native_bf16', return_value=False):
            tuning = machine.Tuning(env, 'auto', 1)
        self.assertEqual((tuning.precision, tuning.dtypes), (None, ('float32',)))
        with mock.patch.object(machine, 'native_bf16', return_value=True):
            self.assertIsNotNone(machine.Tuning(env, 'auto', 1).precision)
            self.assertIsNone(machine.Tuning(env, 'float32', 1).precision)


class TestSteps(unittest.TestCase):

    def test_a_bf16_step_agrees_with_a_float32_step(self):
        """One AdamW step of a tiny flat mixer under bf16 autocast and one in float32 from the same weights: the
        losses (float32 both) within 0.02 nats, the gradients' cosine over 0.99, the weights and the optimiser's
        moments float32 after it."""
        torch.manual_seed(0)
        idx = torch.randint(0, 64, (4, 24))
        results = []
        for ctx in (torch.autocast('cpu', dtype=torch.bfloat16), torch.autocast('cpu', enabled=False)):
            torch.manual_seed(1)
            model = mixer.build_model(mixer.variant_config('flat', **TINY))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            with ctx:
                _, loss = model(idx, idx)
                loss.backward()
            grad = torch.cat([p.grad.flatten() for p in model.parameters()])
            opt.step()
            self.assertEqual(loss.dtype, torch.float32)
            self.assertTrue(all(p.dtype == torch.float32 for p in model.parameters()))
            self.assertTrue(all(v.dtype == torch.float32 for s in opt.state.values() for v in s.values()
                                if torch.is_tensor(v) and v.dim()))
            results.append((loss.item(), grad))
        (bf16, g_bf16), (fp32, g_fp32) = results
        self.assertLess(abs(bf16 - fp32), 0.02)
        self.assertGreater(torch.nn.functional.cosine_similarity(g_bf16, g_fp32, dim=0).item(), 0.99)


class TestBenchTable(unittest.TestCase):

    def test_the_precision_table(self):
        """bench.py --tables precision --quick: per thread count a float32 row (ratio 1), a bf16 row whose ratio
        is the median [p25, p75] of the rounds (p25 <= median <= p75), MFU against its own precision's peak, and
        what dtype='auto' keeps: bf16 exactly when this CPU is native and the printed median reaches the margin."""
        r = run_in_process('-m', 'experiments.bench', '--quick', '--tables', 'precision', '--device', 'cpu',
                           '--precision_data_dir', prepared_data())
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = [[c.strip() for c in line.strip('|').split('|')] for line in r.stdout.splitlines()
                if line.startswith('| 1 |')]
        self.assertEqual([row[1] for row in rows], ['float32', 'bfloat16', "train.py's dtype='auto' keeps"])
        self.assertEqual(rows[0][3], '1')
        mid, p25, p75 = (float(x) for x in rows[1][3].replace('[', '').replace(']', '').replace(',', '').split())
        self.assertLessEqual(p25, mid)
        self.assertLessEqual(mid, p75)
        native, margin = machine.native_bf16(), machine.PrecisionChoice().margin
        if abs(mid - margin) > 0.005:                       # the printed median is rounded to 2 places
            self.assertEqual(rows[2][2], 'bfloat16' if native and mid >= margin else 'float32')
        self.assertIn('Native bf16: yes' if native else 'Native bf16: no', r.stdout)


class TestTrainPy(unittest.TestCase):

    def test_the_choice_is_logged_saved_and_kept_on_resume(self):
        """train.py with dtype='auto' on a (faked) native-bf16 CPU whose bf16 steps are fed as twice as fast:
        a 'precision' event at step 13 choosing bf16, the checkpoint's dtype setting 'bfloat16'; resumed from
        step 15, it trains in bf16 without measuring again, to the losses of the run never stopped."""
        real = machine.PrecisionChoice.stepped

        def stepped(choice, seconds):
            return real(choice, {'float32': 0.2, 'bfloat16': 0.1}[choice.dtype])
        base = ['train.py', f'--data_dir={prepared_data()}', '--d_model=32', '--n_layer=1', '--n_ctx=32',
                '--batch_size=4', '--eval_windows=4', '--eval_interval=15', '--log_interval=1', '--threads=1',
                '--lr_decay_iters=20']
        whole, part = tempfile.mkdtemp(), tempfile.mkdtemp()
        with mock.patch.object(machine, 'native_bf16', return_value=True), \
                mock.patch.object(machine.PrecisionChoice, 'stepped', stepped):
            for out, iters in ((whole, 20), (part, 15)):
                r = run_in_process(*base, f'--max_iters={iters}', f'--out_dir={out}')
                self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn('step    13/15 | precision bfloat16: float32 0.6k, bfloat16 1.3k tokens/s', r.stdout)
            saved = torch.load(os.path.join(part, 'ckpt.pt'), weights_only=True)['config']
            self.assertEqual(saved['dtype'], 'bfloat16')
            with mock.patch.object(machine.PrecisionChoice, '__init__', side_effect=AssertionError('measured')):
                r = run_in_process(*base, '--init_from=resume', '--max_iters=20', f'--out_dir={part}')
            self.assertEqual(r.returncode, 0, r.stderr)
        events = [e for e in read_log(whole) if e['event'] == 'precision']
        self.assertEqual([(e['step'], e['dtype']) for e in events], [(13, 'bfloat16')])
        losses = [{e['step']: e['loss'] for e in read_log(d) if e['event'] == 'train'} for d in (whole, part)]
        self.assertEqual(sorted(losses[1]), list(range(1, 21)))
        for step in range(1, 21):
            self.assertAlmostEqual(losses[0][step], losses[1][step], places=5, msg=f'step {step}')


if __name__ == '__main__':
    unittest.main()
