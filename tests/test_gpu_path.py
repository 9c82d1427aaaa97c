"""The CUDA path, proven on CPU: each test fails without its fix (a code review's findings).

- the token mixings save no per-sequence copy of their matrix for backward (einsum, not M @ z);
- MFU's nominal peak matches the GPU's exact name (an H100 PCIe is not an SXM, an L40S not an L4);
- --device=cuda:N without torchrun makes N the current device;
- DDP wraps the model before torch.compile and does not re-broadcast the constant buffers;
- the static decode step copies nothing from the host a token, marks its caches static (CUDA graphs),
  and bench.py's decode columns wait for the device before reading the clock;
- fft_threshold and chunk_size come from the device's tuning and may change on resume;
- the GPU check refuses a machine without a GPU in one line.
(A NaN on one of two DDP ranks stopping both: tests/test_faults_outputs.py. The GPU configs: test_scale.)
"""

import os
import tempfile
import unittest
from types import SimpleNamespace
from unittest import mock

import torch
import torch.distributed as dist

import decode
import machine
import mixer
import train
from experiments import bench
from tests.common import TINY, prepared_data, read_log, run, tiny_model


class TestMixingMemory(unittest.TestCase):

    def test_no_saved_tensor_holds_the_matrix_once_per_sequence(self):
        """Every tensor a token mixing saves for backward is smaller than batch x T x T: the matrix
        [H, T, T] is kept once, not broadcast to [B, H, T, T] (matmul's copy, 4x to 5x the flat
        mixer's layer memory at T = 2048 for multihead and kernel)."""
        B, T = 8, 48
        for name in ('flat', 'multihead', 'kernel', 'expanded', 'toeplitz', 'recurrent'):   # hybrid_parallel's is multihead's
            cfg = mixer.variant_config(name, vocab_size=64, n_ctx=T, d_model=8, n_layer=1, fft_threshold=10 ** 6,
                                       chunk_size=T)
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


class TestDevice(unittest.TestCase):

    def test_cuda_n_without_torchrun_becomes_the_current_device(self):
        chosen = []
        with mock.patch('torch.cuda.is_available', return_value=True), \
                mock.patch('torch.cuda.set_device', side_effect=chosen.append), \
                mock.patch.dict(os.environ, {}, clear=False):
            os.environ.pop('RANK', None)
            env = machine.setup_device({'device': 'cuda:1', 'dtype': 'float32'})
        self.assertEqual(chosen, ['cuda:1'])
        self.assertEqual(env.dev, 'cuda:1')

    def test_an_unknown_device_is_one_line(self):
        r = run('train.py', f'--data_dir={prepared_data()}', '--device=tpu', f'--out_dir={tempfile.mkdtemp()}')
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


class TestStaticDecode(unittest.TestCase):

    def test_no_host_to_device_copy_a_token_and_static_caches(self):
        """After the first token, a step builds no tensor from a Python number (torch.tensor: a
        blocking copy on CUDA), and every cache buffer has been marked static for CUDA graphs."""
        for name in ('flat', 'recurrent', 'transformer', 'linear_attention', 'hybrid'):
            model = tiny_model(name)
            marked = []
            dec = decode.StaticDecoder(model)
            with mock.patch('torch._dynamo.mark_static_address', side_effect=lambda t, **k: marked.append(t)):
                dec.step(torch.zeros(1, 1, dtype=torch.long))
            with self.subTest(variant=name):
                self.assertTrue(dec.buffers())
                self.assertEqual({id(b) for b in dec.buffers()}, {id(t) for t in marked})
                with mock.patch('torch.tensor', side_effect=AssertionError('torch.tensor in a decode step')):
                    for t in range(5):
                        dec.step(torch.ones(1, 1, dtype=torch.long))
                self.assertEqual(int(dec._pos), dec.pos)

    def test_bench_waits_for_the_device_around_each_timed_token(self):
        calls = []
        step = lambda idx: calls.append('step') or torch.zeros(1, 8)       # noqa: E731
        bench.decode_ms(step, torch.zeros(1, 3, dtype=torch.long), 4, wait=lambda: calls.append('wait'))
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
        r = run('train.py', *tiny, '--max_iters=2')
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run('train.py', *tiny, '--max_iters=4', '--init_from=resume', '--fft_threshold=16', '--chunk_size=8')
        self.assertEqual(r.returncode, 0, r.stderr)
        mc = [e for e in read_log(out) if e['event'] == 'config'][-1]['model_config']
        self.assertEqual((mc['fft_threshold'], mc['chunk_size']), (16, 8))
        r = run('train.py', *tiny, '--max_iters=6', '--init_from=resume', '--d_model=64')
        self.assertEqual(r.returncode, 2)
        self.assertIn('cannot change on resume', r.stderr)


class TestGPUCheck(unittest.TestCase):

    def test_refuses_without_a_gpu_in_one_line(self):
        r = run('-m', 'experiments.gpu_check', '--out', tempfile.mkdtemp())
        self.assertEqual(r.returncode, 2)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn('no GPU', r.stderr)
        self.assertNotIn('Traceback', r.stderr)


if __name__ == '__main__':
    unittest.main()
