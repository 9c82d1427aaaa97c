"""The CUDA path, proven on CPU: each test fails without its fix (a code review's findings).

- the token mixings save no per-sequence copy of their matrix for backward (einsum, not M @ z);
- MFU's nominal peak matches the GPU's exact name (an H100 PCIe is not an SXM, an L40S not an L4);
- --device=cuda:N without torchrun makes N the current device;
- DDP wraps the model before torch.compile and does not re-broadcast the constant buffers;
- the static decode step copies nothing from the host a token, marks its caches static (CUDA graphs),
  and bench.py's decode columns wait for the device before reading the clock;
- fft_threshold and chunk_size come from the device's tuning and may change on resume;
- --device=cuda and --device=auto start train.py on a CUDA machine (a mocked CUDA that keeps
  torch.cuda.set_device's own index check: the real one refuses a bare 'cuda');
- the Toeplitz FFT transforms its last, contiguous axis (the layout whose traced strides are CUDA's);
- bench never prints an MFU above 100%, and prints its decode and paths rows as it measures them;
- train.py's summary gives the steady tokens/s and MFU beside the whole run's;
- the GPU check refuses a machine without a GPU in one line (and the test cannot start a real
  check), and its whole step list runs on the CPU at tiny sizes within its time limits.
(A NaN on one of two DDP ranks stopping both: tests/test_faults_outputs.py. The GPU configs: test_scale.)
"""

import contextlib
import dataclasses
import io
import os
import re
import tempfile
import threading
import time
import unittest
from types import SimpleNamespace
from unittest import mock

import torch
import torch.distributed as dist

from harness import machine
import mixer
import sample
import train
from experiments import bench, bench_decode, gpu_check
from tests.common import TINY, heads, merge, prepared_data, read_log, run, run_in_process, tiny_model


def checked_set_device(chosen):
    """A stand-in for torch.cuda.set_device that keeps the real one's argument check (a device
    without an index is refused: ValueError) and records the device it was given in `chosen`."""
    def set_device(device):
        torch.cuda._utils._get_device_index(device, optional=False)
        chosen.append(device)
    return set_device


@contextlib.contextmanager
def mocked_cuda(chosen):
    """CUDA that is 'available' with one GPU (bf16 capable), the current device 0, and a checked
    set_device; torchrun's variables removed."""
    with mock.patch('torch.cuda.is_available', return_value=True), \
            mock.patch('torch.cuda.device_count', return_value=1), \
            mock.patch('torch.cuda.current_device', return_value=0), \
            mock.patch('torch.cuda.is_bf16_supported', return_value=True), \
            mock.patch('torch.cuda.set_device', side_effect=checked_set_device(chosen)), \
            mock.patch.dict(os.environ, {}, clear=False):
        for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK'):
            os.environ.pop(k, None)
        yield


class TestMixingMemory(unittest.TestCase):

    def test_no_saved_tensor_holds_the_matrix_once_per_sequence(self):
        """Every tensor a token mixing saves for backward is smaller than batch x T x T: the matrix
        [H, T, T] is kept once, not broadcast to [B, H, T, T] (matmul's copy, 4x to 5x the flat
        mixer's layer memory at T = 2048 for multihead and kernel)."""
        B, T = 8, 48
        for name in ('flat', 'multihead', 'kernel', 'expanded', 'toeplitz', 'recurrent'):   # hybrid_parallel's is multihead's
            cfg = mixer.variant_config(name, vocab_size=64, n_ctx=T, d_model=8, n_layer=1, n_head=1,
                                       fft_threshold=10 ** 6, chunk_size=T)
            block = mixer.Block(cfg)
            saved = []
            with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
                out = block(torch.randn(B, T, 8, requires_grad=True))
            out.sum().backward()
            with self.subTest(variant=name):
                self.assertLess(max(saved), B * T * T, f'{name} saved a tensor of {max(saved)} elements')


class TestPeak(unittest.TestCase):

    def test_nominal_peak_matches_the_exact_name(self):
        cases = {'NVIDIA H100 80GB HBM3': 989e12, 'NVIDIA H100 PCIe': 756e12, 'NVIDIA H100 NVL': 835e12,
                 'NVIDIA L40S': 362e12, 'NVIDIA L4': 121e12, 'NVIDIA A100-SXM4-80GB': 312e12,
                 'NVIDIA GeForce RTX 3060': None}
        for name, peak in cases.items():
            with mock.patch('torch.cuda.get_device_name', return_value=name), self.subTest(gpu=name):
                self.assertEqual(machine.nominal_peak('cuda'), peak)
        self.assertIsNone(machine.nominal_peak('cpu'))

    def test_mfu_is_against_the_nominal_peak_when_known(self):
        with mock.patch('torch.cuda.get_device_name', return_value='NVIDIA H100 PCIe'), \
                mock.patch.object(machine, 'measure_matmul_flops', side_effect=AssertionError('measured')):
            peak, what = machine.peak_flops('cuda:0', torch.bfloat16)
        self.assertEqual(peak, 756e12)
        self.assertIn('nominal', what)
        self.assertIn('NVIDIA H100 PCIe', what)


class Started(Exception):
    """Raised where train.main would build the model: the device setup is over."""


    def test_a_measured_peak_is_measured_once_a_process(self):
        """Without a nominal peak (a CPU) the matmul peak is measured once for each thread count: a
        pool process that trains many runs (claims.py) does not pay a second a run again."""
        with mock.patch.dict(machine._MEASURED_PEAK, clear=True), \
                mock.patch.object(machine, 'measure_matmul_flops', return_value=7e10) as measure:
            first = machine.peak_flops('cpu', torch.float32)
            self.assertEqual(machine.peak_flops('cpu', torch.float32), first)
            self.assertEqual(measure.call_count, 1)
            with mock.patch('torch.get_num_threads', return_value=torch.get_num_threads() + 1):
                machine.peak_flops('cpu', torch.float32)
            self.assertEqual(measure.call_count, 2)
        self.assertEqual(first[0], 7e10)


class TestDevice(unittest.TestCase):

    def test_the_mock_refuses_what_torch_refuses(self):
        with self.assertRaisesRegex(ValueError, 'specified index'):
            checked_set_device([])('cuda')
        checked_set_device(chosen := [])('cuda:0')
        self.assertEqual(chosen, ['cuda:0'])

    def test_cuda_n_without_torchrun_becomes_the_current_device(self):
        chosen = []
        with mocked_cuda(chosen):
            env = machine.setup_device({'device': 'cuda:1', 'dtype': 'float32'})
        self.assertEqual(chosen, ['cuda:1'])
        self.assertEqual(env.dev, 'cuda:1')

    def test_cuda_and_auto_start_train_py_on_the_current_gpu(self):
        """train.main with --device=cuda and the default --device=auto on a (mocked) CUDA machine
        gets past the device setup with cuda:0, the current device, where the real set_device
        refused 'cuda' and every GPU run stopped at start (the first H200 run)."""
        for device in ('cuda', 'auto'):
            chosen, seen = [], []
            with self.subTest(device=device), mocked_cuda(chosen), \
                    mock.patch.object(train, 'build_run', side_effect=lambda cfg, ckpt, env, meta:
                                      seen.append(env) or (_ for _ in ()).throw(Started())):
                with self.assertRaises(Started):
                    train.main([f'--data_dir={prepared_data()}', f'--out_dir={tempfile.mkdtemp()}',
                                f'--device={device}'])
                self.assertEqual(chosen, ['cuda:0'])
                self.assertEqual((seen[0].dev, seen[0].cuda, seen[0].dtype), ('cuda:0', True, 'bfloat16'))

    def test_an_unknown_device_is_one_line(self):
        r = run_in_process('train.py', f'--data_dir={prepared_data()}', '--device=tpu', f'--out_dir={tempfile.mkdtemp()}')
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stderr.strip().count('\n'), 0, r.stderr)
        self.assertIn("device 'tpu'", r.stderr)


class TestDDPWrapping(unittest.TestCase):

    def test_ddp_before_compile_without_buffer_broadcasts(self):
        """One gloo rank in this process: the model is compile(DDP(model)), so that compiled graphs
        split at DDP's buckets and all-reduces overlap backward; broadcast_buffers is off."""
        store = dist.HashStore()
        dist.init_process_group('gloo', store=store, rank=0, world_size=1)
        self.addCleanup(dist.destroy_process_group)
        env = SimpleNamespace(ddp=True, cuda=False, local=0)
        model = train.wrap_model(tiny_model('transformer'), {'compile': True}, env)
        ddp = model._orig_mod
        self.assertIsInstance(ddp, torch.nn.parallel.DistributedDataParallel)
        self.assertFalse(ddp.broadcast_buffers)

    def test_every_buffer_is_a_constant(self):
        """What makes broadcast_buffers=False safe: no kind's buffer changes in training."""
        for name in mixer.VARIANTS:
            model = tiny_model(name).train()
            before = {k: b.clone() for k, b in model.named_buffers()}
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            idx = torch.randint(0, 64, (2, TINY['n_ctx'] + 1))
            model(idx[:, :-1], idx[:, 1:])[1].backward()
            opt.step()
            with self.subTest(variant=name):
                for k, b in model.named_buffers():
                    self.assertTrue(torch.equal(b, before[k]), k)


class TestDecoder(unittest.TestCase):

    def test_no_host_to_device_copy_a_token_and_static_state(self):
        """A compiled decoder's graph takes every state tensor and the input token (and the position, where
        the model reads it) as static inputs (torch.compile keeps their addresses: what a CUDA graph replays, written in place, with no
        copy in); after the first token, a step builds no tensor from a Python number (torch.tensor: a
        blocking copy on CUDA)."""
        for name in ('flat', 'recurrent', 'transformer', 'linear_attention', 'hybrid'):
            torch._dynamo.reset()
            model, static = tiny_model(name), []

            def backend(gm, inputs):             # dynamo marks an input static by this attribute
                static.extend(id(t) for t in inputs if getattr(t, '_dynamo_static_input_type', None))
                return gm.forward
            dec = sample.Decoder(model, compile=True, backend=backend)
            dec.step(torch.zeros(1, 1, dtype=torch.long))
            with self.subTest(variant=name):
                self.assertTrue(list(sample.state_tensors(dec.state)))
                held = [*sample.state_tensors(dec.state), dec.token]
                self.assertLessEqual({id(t) for t in held}, set(static))
                with mock.patch('torch.tensor', side_effect=AssertionError('torch.tensor in a decode step')):
                    for t in range(5):
                        dec.step(torch.ones(1, 1, dtype=torch.long))
                self.assertEqual(int(dec.pos_on_device), dec.pos - 1)     # the last token's position

    def test_a_prefill_a_slice_of_the_batch_at_a_time_equals_the_full_forward(self):
        """bench_decode.prefill_rows: three sequences prefilled in two slices of an allocated batch (one
        parallel pass each, as bench's serving table does; the buffers of another sequence there before),
        then stepped: the logits of every later token equal the full forward pass's, for every kind; a
        slice given the tokens of another number of sequences, or a batch of another size, is a ValueError."""
        idx = torch.randint(0, 64, (3, 14))
        for name in ('flat', 'expanded', 'toeplitz', 'recurrent', 'transformer', 'linear_attention', 'hybrid'):
            model = tiny_model(name)
            dec = sample.Decoder(model, 3)
            with torch.no_grad():
                full = model(idx)[0]
                dec.prefill(torch.randint(0, 64, (3, 12)))                 # an earlier sequence's state
                for rows in (slice(0, 2), slice(2, 3)):
                    bench_decode.prefill_rows(dec, idx[rows, :9], rows)
                logits = torch.stack([dec.step(idx[:, t:t + 1]) for t in range(9, 14)], 1)
            with self.subTest(variant=name):
                self.assertEqual(dec.pos, 14)
                torch.testing.assert_close(logits, full[:, 9:], atol=1e-5, rtol=1e-5)
        with self.assertRaisesRegex(ValueError, 'that holds 1'):
            bench_decode.prefill_rows(dec, idx[:2, :9], slice(2, 3))
        with self.assertRaisesRegex(ValueError, 'batch of 3'):
            dec.prefill(idx[:2, :9])
        with self.assertRaisesRegex(ValueError, 'batch of 3'):
            dec.step(idx[:1, :1])

    def test_bench_waits_for_the_device_around_each_timed_token(self):
        calls = []
        step = lambda idx: calls.append('step') or torch.zeros(1, 8)       # noqa: E731
        bench_decode.decode_ms(step, torch.zeros(1, 3, dtype=torch.long), 4, wait=lambda: calls.append('wait'))
        self.assertEqual(calls[3:], ['wait', 'step', 'wait'] * 4)


class TestDeviceTuning(unittest.TestCase):

    def test_defaults_come_from_the_device_and_may_change_on_resume(self):
        d, out = prepared_data(), tempfile.mkdtemp()
        tiny = ['--d_model=32', '--n_layer=1', '--n_ctx=32', '--batch_size=4', '--eval_windows=4', '--variant=toeplitz',
                f'--data_dir={d}', f'--out_dir={out}', '--eval_interval=2', '--log_interval=1']
        with mock.patch.dict(machine.DEVICE_TUNING, {'cpu': dict(fft_threshold=7, chunk_size=5)}):
            meta = {'vocab_size': 512, 'tokenizer_sha256': 'x'}
            cfg = {**train.DEFAULTS, 'variant': 'toeplitz', **mixer.VARIANTS['toeplitz'], 'device': 'cpu'}
            r = train.build_run(cfg, None, SimpleNamespace(dev='cpu', rank=0, master=True, cuda=False, ddp=False),
                                meta)
        self.assertEqual((r.model_cfg.fft_threshold, r.model_cfg.chunk_size), (7, 5))
        r = run_in_process('train.py', *tiny, '--max_iters=2')
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_in_process('train.py', *tiny, '--max_iters=4', '--init_from=resume', '--fft_threshold=16',
                           '--chunk_size=8')
        self.assertEqual(r.returncode, 0, r.stderr)
        mc = [e for e in read_log(out) if e['event'] == 'config'][-1]['model_config']
        self.assertEqual((mc['fft_threshold'], mc['chunk_size']), (16, 8))
        r = run_in_process('train.py', *tiny, '--max_iters=6', '--init_from=resume', '--d_model=64')
        self.assertEqual(r.returncode, 2)
        self.assertIn('cannot change on resume', r.stderr)


class TestToeplitzFFT(unittest.TestCase):

    def test_the_fft_transforms_a_contiguous_last_axis(self):
        """Every FFT of the Toeplitz mixing runs over the last axis of a contiguous tensor: the
        layout whose strides torch.compile traces as CUDA returns them (over dim 2 of [B, H, T, e],
        inductor on an H200 failed 'stride 1==8 at dim=2' in aten._fft_r2c)."""
        layer = mixer.ToeplitzMixing(24, 32, 4, fft_threshold=16, mixing_init='average')     # T = 24: the FFT
        x = torch.randn(2, 24, 32)
        calls, real = [], {f: getattr(torch.fft, f) for f in ('rfft', 'irfft')}

        def spy(name):
            def fft(x, n=None, dim=-1, **kw):
                calls.append((name, dim in (-1, x.dim() - 1), x.is_contiguous()))
                return real[name](x, n=n, dim=dim, **kw)
            return fft
        with mock.patch('torch.fft.rfft', spy('rfft')), mock.patch('torch.fft.irfft', spy('irfft')):
            y = layer(x)
        self.assertEqual(sorted(c[0] for c in calls), ['irfft', 'rfft', 'rfft'])
        self.assertTrue(all(last and contiguous for _, last, contiguous in calls), calls)
        matrix_path = merge(layer, layer.mix(layer.matrix(24), heads(layer, x)) + layer.c[:, :24])
        torch.testing.assert_close(y, matrix_path, atol=1e-5, rtol=1e-5)


class TestReportedSpeed(unittest.TestCase):

    def test_no_mfu_above_100_percent(self):
        self.assertEqual(machine.fmt_mfu(0.439), '43.9%')
        self.assertEqual(machine.fmt_mfu(1.0), '100.0%')
        self.assertNotIn('%', machine.fmt_mfu(1.95))
        args = bench.parse_args(['--quick', '--variants', 'flat', '--device', 'cpu'])
        with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()) as err:
            bench.bench_train(args, {'measured': 1e3, 'nominal': None})       # a peak far below any model
        row = next(l for l in out.getvalue().splitlines() if l.startswith('| flat'))
        self.assertIn('n/a (peak below the achieved rate)', row)
        self.assertNotRegex(row, r'\d%')
        self.assertIn('peak measurement is wrong', err.getvalue())

    def test_decode_rows_print_as_they_are_measured(self):
        """A decode table cut short (here: its second model fails to build) has printed the rows
        it measured. (Its compiled step traced only, backend 'eager': inductor's C++, a cold cache's
        half a minute, is test_bench's and test_compile's.)"""
        args = bench.parse_args(['--quick', '--decode_variants', 'flat,transformer', '--device', 'cpu'])
        built = []
        real_build, real_decoder = bench_decode.build, sample.Decoder

        def build(name, a, **sizes):
            built.append(name)
            if name == 'transformer':
                raise KeyboardInterrupt
            return real_build(name, a, **sizes)
        traced = lambda model, *a, **k: real_decoder(model, *a, **{**k, 'backend': 'eager'})     # noqa: E731
        with mock.patch.object(bench_decode, 'build', build), mock.patch.object(bench_decode.sample, 'Decoder', traced), \
                contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
            with self.assertRaises(KeyboardInterrupt):
                bench_decode.bench_decode(args)
        self.assertEqual(built, ['flat', 'transformer'])
        self.assertTrue(any(l.startswith('| flat | 64 x 2') for l in out.getvalue().splitlines()), out.getvalue())

    def test_summary_gives_the_steady_rate_beside_the_whole_run(self):
        """steady_tokens_per_s is the rate of the logged intervals after the first (which holds the
        warm-up); tokens_per_s stays the whole run's."""
        out = tempfile.mkdtemp()
        with contextlib.redirect_stdout(io.StringIO()) as console:
            train.main([f'--data_dir={prepared_data()}', f'--out_dir={out}', '--d_model=32', '--n_layer=1',
                        '--n_ctx=32', '--batch_size=4', '--max_iters=6', '--eval_interval=6', '--eval_windows=2',
                        '--log_interval=2', '--device=cpu'])
        log = read_log(out)
        trains, (summary,) = [e for e in log if e['event'] == 'train'], [e for e in log if e['event'] == 'summary']
        tokens = 2 * summary['tokens_seen'] // summary['step']   # tokens a logged interval of 2 steps
        steady = 2 * tokens / sum(tokens / e['tokens_per_s'] for e in trains[1:])
        self.assertEqual(len(trains), 3)
        self.assertAlmostEqual(summary['steady_tokens_per_s'], steady, delta=1e-6 * steady)
        self.assertAlmostEqual(summary['steady_mfu'] / summary['mfu'],
                               summary['steady_tokens_per_s'] / summary['tokens_per_s'], places=9)
        self.assertIsNone(summary['peak_memory_gib'])           # CPU: no GPU memory to report
        printed = float(re.search(r'steady ([\d,]+) tok/s', console.getvalue()).group(1).replace(',', ''))
        self.assertLessEqual(abs(printed - steady), 0.5 + 1e-9 * steady)     # printed to the token: at its precision


class TestGPUCheck(unittest.TestCase):

    def test_refuses_without_a_gpu_in_one_line(self):
        """With the GPUs hidden, so that on a GPU machine (gpu_check's own tests step) this test cannot
        start a second, real check."""
        r = run('-m', 'experiments.gpu_check', '--out', tempfile.mkdtemp(),
                env={**os.environ, 'CUDA_VISIBLE_DEVICES': ''})
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn('no GPU', r.stderr)
        self.assertNotIn('Traceback', r.stderr)

    def test_every_test_the_gpu_check_names_exists(self):
        """The GPU's test lists name tests that load (a renamed class, TestStaticDecode, was a failed step
        on the GPU, found by no CPU run: the CPU check runs another list)."""
        for ids in (*gpu_check.GPU['tests'], *gpu_check.TINY['tests']):
            for t in ids:
                with self.subTest(t):
                    loaded = unittest.defaultTestLoader.loadTestsFromName(t)
                    self.assertNotIn('_FailedTest', repr(loaded), t)
                    self.assertGreater(loaded.countTestCases(), 0, t)

    def test_a_failed_timed_out_or_late_step_is_a_row_and_the_report_is_written_as_it_goes(self):
        out = tempfile.mkdtemp()
        check = gpu_check.Check(out, 'test machine', budget_s=3600)
        check.run(gpu_check.Step('fails', 'a failing step', ['-c', 'import sys; sys.exit(3)'], 600))
        with open(os.path.join(out, 'report.md')) as f:
            self.assertIn('FAILED (exit 3)', f.read())
        check.run(gpu_check.Step('sleeps', 'a slow step', ['-c', 'import time; time.sleep(600)'], 1))
        check.deadline = 0                                       # the budget is spent
        check.run(gpu_check.Step('late', 'a late step', ['-c', 'pass'], 30))
        self.assertEqual([r[1] for r in check.rows], ['FAILED (exit 3)', 'TIMEOUT (1 s)', 'SKIPPED (out of time)'])
        with open(os.path.join(out, 'report.md')) as f:
            self.assertIn('0 of 3 steps ok', f.read())

    def test_ctrl_c_stops_the_running_steps_and_skips_the_rest(self):
        """Check.stop (what run_check calls on Ctrl-C): the running step, in a session of its own that the
        terminal's Ctrl-C misses, is killed at once, not at its limit (600 s: its thread ends within the 300 s
        the test waits, however loaded the machine); its row says so; later steps skip."""
        check = gpu_check.Check(tempfile.mkdtemp(), 'test machine', budget_s=3600)
        raised = []

        def step():                  # in the thread: what it raises is the test's (--fast's skip, a failure)
            try:
                check.run(gpu_check.Step('sleeps', 'a long step', ['-c', 'import time; time.sleep(600)'], 600))
            except BaseException as e:
                raised.append(e)
        t = threading.Thread(target=step)
        t0 = time.time()
        t.start()
        while not check.live and t.is_alive() and time.time() - t0 < 300:
            time.sleep(0.05)
        if raised:
            raise raised[0]
        check.stop()
        t.join(timeout=300)
        self.assertFalse(t.is_alive(), 'the step ran on after Check.stop')
        check.run(gpu_check.Step('after', 'a later step', ['-c', 'pass'], 30))
        self.assertEqual([r[1] for r in check.rows], ['STOPPED (Ctrl-C)', 'SKIPPED (interrupted)'])

    def test_every_step_runs_on_the_cpu_at_tiny_sizes(self):
        """The GPU's step list with the device swapped for the CPU and tiny sizes: every command
        line is right (each step ok), the resumed run ends where the straight one does, every
        training step's numbers and every table reach the report. (Each step's limit and the budget are an
        hour here: the GPU's limits are not the CPU's, and a step past its limit on a loaded machine would
        fail the test with every command line right.)"""
        out = tempfile.mkdtemp()
        real_plan = gpu_check.plan

        def patient(*args):          # the plan with every step's limit an hour: a loaded machine is no fault here
            correctness, configs, tables = real_plan(*args)
            hour = lambda steps: [dataclasses.replace(s, limit_s=3600) for s in steps]      # noqa: E731
            return [hour(chain) for chain in correctness], hour(configs), hour(tables)
        with mock.patch.object(gpu_check, 'plan', patient):
            check = gpu_check.run_check(prepared_data(), out, 'cpu', gpu_check.TINY, budget_s=3600)
        correctness, configs, tables = real_plan(prepared_data(), out, 'cpu', gpu_check.TINY)
        steps = [s for chain in correctness for s in chain] + configs + tables
        self.assertEqual(len(check.rows), len(steps) + 1)                   # + the resume comparison
        self.assertEqual([r for r in check.rows if r[1] != 'ok'], [])
        for s in steps:
            row = next(r for r in check.rows if r[0] == s.what)
            if s.run_dir:
                self.assertIn('tokens/s steady', row[3], row)
        with open(os.path.join(out, 'report.md')) as f:
            report = f.read()
        for title in ('Serving', 'Decode step', 'Decode step profile', 'SDPA backends', 'Training step profile',
                      'Training throughput', 'Memory vs context length'):
            self.assertIn(f'## {title}\n', report)


if __name__ == '__main__':
    unittest.main()
