"""The compiled and bf16 paths, proven on CPU, and the decoding step of every kind.

python test_mixer.py test_compile

torch.compile generates C++ kernels on CPU and torch.autocast('cpu', bfloat16)
runs the same dtype paths as on a GPU, so what breaks there that is not
GPU-specific breaks here first:
- compiled (AOTAutograd, and inductor for the core kinds) logits and gradients
  equal eager's for every model kind, in one graph (no graph break), and a
  compiled model fed many lengths compiles a bounded number of times;
- under bf16 autocast every kind stays causal and its decoding steps equal the
  full forward within 4 bf16 ulps of the logits' scale;
- sample.Decoder's steps equal the full forward for every kind, eager and compiled,
  one compiled graph serves every position, and greedy tokens equal eager's;
- train.py --compile=True trains and its checkpoint loads uncompiled.
"""

import os
import shutil
import tempfile
import unittest

import torch

import mixer
import sample
from tests.common import TINY, assert_samples, prepared_data, run_in_process, step_pieces, tiny_model

# every model kind with its own code path: TINY's chunk_size 8 and fft_threshold 16 make
# the recurrent chunks and the Toeplitz FFT run at T = 24 (and the matrix path at T < 16)
CODE_PATHS = {**{name: (name, {}) for name in mixer.VARIANTS}, 'autoencoder': ('flat', dict(task='autoencode'))}
CORE = ('toeplitz', 'recurrent', 'transformer')     # the flat mixer: test_train_py_compile_trains_...
LENGTHS = tuple(range(5, 25))
DEVICE = os.environ.get('MIXER_TEST_DEVICE', 'cpu')   # experiments.gpu_check sets cuda
BF16_ULP = 2 ** -8          # bf16 keeps 8 significant bits: one rounding moves a value by up to 2^-9 of it


class Counter:
    """A torch.compile backend that counts the graphs it is handed (one per
    compilation; a graph break makes two) and compiles each with `backend`."""

    def __init__(self, backend='aot_eager'):
        self.backend, self.graphs = backend, 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return torch._dynamo.lookup_backend(self.backend)(gm, example_inputs)


def step(model, idx):
    """Logits and parameter gradients of one loss backward -> (logits, [grads])."""
    model.zero_grad()
    logits, loss = model(idx[:, :-1], idx[:, 1:]) if model.cfg.task == 'lm' else model(idx[:, :-1], idx[:, :-1])
    loss.backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters()]


class TestCompile(unittest.TestCase):

    def setUp(self):
        torch._dynamo.reset()

    def check_compiled(self, name, backend, atol):
        variant, kw = CODE_PATHS[name]
        model = tiny_model(variant, n_layer=1, **kw).train()        # one block: compile time is per op
        idx = torch.randint(0, 64, (2, TINY['n_ctx'] + 1))
        counter = Counter(backend)
        compiled = torch.compile(model, backend=counter)
        ref_logits, ref_grads = step(model, idx)
        logits, grads = step(compiled, idx)
        self.assertEqual(counter.graphs, 1, 'a graph break')
        torch.testing.assert_close(logits, ref_logits, atol=atol, rtol=atol)
        scale = max(ref.abs().max().item() for ref in ref_grads)      # some gradients are ~0 (a bias a norm removes)
        for (n, _), g, ref in zip(model.named_parameters(), grads, ref_grads):
            torch.testing.assert_close(g, ref, atol=atol * scale, rtol=atol, msg=n)
        return model, compiled, counter

    def test_every_kind_compiles_in_one_graph_to_eager_logits_and_gradients(self):
        """AOTAutograd (dynamo's trace, functionalisation and the autograd graph; no
        codegen) for every code path."""
        for name in CODE_PATHS:
            with self.subTest(kind=name):
                torch._dynamo.reset()
                self.check_compiled(name, 'aot_eager', 1e-6)

    def test_many_lengths_compile_a_bounded_number_of_times(self):
        """After the training step, the 20 lengths 5..24 under no_grad compile 2 graphs
        (grad mode changed, then one with a dynamic length), one more where the
        Toeplitz mixing switches to the FFT (T >= 16); the chunked kinds at most 3 per
        number of chunks (a last chunk of 1 token, of 2..7 and of 8 specialise
        apart; measured 8 graphs in all for 1 to 3 chunks of 8): never one per
        length. These are the kinds whose code depends on the length: the flat
        slices, the FFT switch, the chunk loops, SDPA."""
        for name, bound in (('toeplitz', 4), ('recurrent', 8), ('transformer', 3)):   # linear attention
            # chunks as the recurrent mixing does (counted first); flat slices as Toeplitz does
            with self.subTest(kind=name), torch._dynamo.config.patch(recompile_limit=64):   # dynamo's 8 would
                # cap the count (it then runs eager) and hide a compilation per length
                torch._dynamo.reset()
                model, compiled, counter = self.check_compiled(name, 'aot_eager', 1e-6)
                idx = torch.randint(0, 64, (2, TINY['n_ctx']))
                with torch.no_grad():
                    for T in LENGTHS:
                        x = idx[:, :T].contiguous()
                        torch.testing.assert_close(compiled(x)[0], model(x)[0])
                self.assertLessEqual(counter.graphs, bound, f'{counter.graphs} compilations, {len(LENGTHS)} lengths')

    def test_inductor_core_kinds_equal_eager(self):
        """The C++ kernels inductor generates give eager's logits and gradients within
        1e-4 (of the largest gradient): the Toeplitz FFT (inductor falls back to eager
        for the complex ops), the recurrent chunks, SDPA."""
        for name in CORE:
            with self.subTest(kind=name):
                torch._dynamo.reset()
                self.check_compiled(name, 'inductor', 1e-4)

    def test_train_py_compile_trains_and_loads_uncompiled(self):
        """train.py --compile=True on CPU: the loss falls, and the checkpoint loads
        into an uncompiled model in sample.py and --init_from=resume; sample.py
        --compile gives the uncompiled greedy text."""
        out = tempfile.mkdtemp(prefix='mixer_compile_')
        self.addCleanup(shutil.rmtree, out, True)
        args = [f'--data_dir={prepared_data()}', '--d_model=32', '--n_layer=1', '--n_ctx=32', '--batch_size=4',
                '--eval_windows=4', f'--out_dir={out}', '--compile=True']
        env = {**os.environ, 'OMP_NUM_THREADS': '1'}        # a tiny model: one thread; each run in this process
        r = run_in_process('train.py', *args, '--max_iters=30', '--eval_interval=30', '--learning_rate=1e-2', env=env)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        ckpt = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)
        self.assertFalse([k for k in ckpt['model'] if k.startswith('_orig_mod.')])
        self.assertLess(ckpt['best_val_loss'], 5.5)          # from ln(512) = 6.2 at init
        # the three runs from the checkpoint too, one thread (each as a process cost 3.5 s of CPU more: torch's
        # import; sample.py and train.py as processes: test_sample, test_train)
        greedy = ['sample.py', '--ckpt', os.path.join(out, 'ckpt.pt'), '--max_new_tokens', '12', '--num_samples', '1',
                  '--start', 'Once', '--temperature', '0']
        r, rc = run_in_process(*greedy, env=env), run_in_process(*greedy, '--compile', env=env)
        resumed = run_in_process('train.py', f'--out_dir={out}', '--init_from=resume', '--max_iters=32',
                                 '--compile=False', env=env)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(rc.returncode, 0, rc.stderr[-2000:])
        assert_samples(self, r.stdout, 'Once', 1, 12)
        self.assertEqual(rc.stdout, r.stdout)                    # sample.py --compile: the same greedy tokens
        self.assertEqual(resumed.returncode, 0, resumed.stderr[-2000:])
        self.assertIn('resumed', resumed.stdout)


class TestBF16(unittest.TestCase):
    """bf16 autocast on DEVICE: the CPU here, CUDA under experiments.gpu_check."""

    def test_every_kind_stays_causal(self):
        """A perturbed token changes no earlier logit under autocast (exactly: the
        masks multiply by zero; the Toeplitz FFT, which mixes all positions in float32,
        within 1e-5 of the logits)."""
        g = torch.Generator().manual_seed(2)
        for name in mixer.VARIANTS:
            model = tiny_model(name).to(DEVICE)
            idx = torch.randint(0, 64, (2, TINY['n_ctx']), generator=g).to(DEVICE)
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                logits, _ = model(idx)
                for j in (0, 11, 23):
                    idx2 = idx.clone()
                    idx2[:, j] = (idx2[:, j] + 1) % 64
                    logits2, _ = model(idx2)
                    with self.subTest(variant=name, j=j):
                        self.assertEqual(logits.dtype, torch.bfloat16)
                        atol = 1e-5 if name == 'toeplitz' else 0
                        torch.testing.assert_close(logits2[:, :j], logits[:, :j], atol=atol, rtol=0)
                        self.assertGreater((logits2[:, j:] - logits[:, j:]).abs().max().item(), 0)

    def test_decoding_equals_the_full_forward(self):
        """Under autocast, steps in pieces and a Decoder's prefill and steps give the full forward's
        logits within 4 bf16 ulps of the largest logit (2^-6 of it): the paths round at different points
        (different matmul shapes), each rounding off by up to half an ulp. Measured: at most 1.3 ulps
        (0.0049 of the scale)."""
        for name in mixer.VARIANTS:
            model = tiny_model(name).to(DEVICE)
            idx = torch.randint(0, 64, (2, TINY['n_ctx'])).to(DEVICE)
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                full = model(idx)[0].float()
                pieces = step_pieces(model, idx, (5,) + (1,) * 19).float()
                dec = sample.Decoder(model, idx.shape[0])
                steps = torch.stack([dec.prefill(idx[:, :3])] + [dec.step(idx[:, t:t + 1]) for t in range(3, 24)],
                                    1).float()
            tol = 4 * BF16_ULP * full.abs().max().item()
            with self.subTest(variant=name):
                torch.testing.assert_close(pieces, full[:, 4:], atol=tol, rtol=0)
                torch.testing.assert_close(steps, full[:, 2:], atol=tol, rtol=0)

    def test_training_tracks_float32(self):
        """40 AdamW steps of a small model on a fixed batch of a 16-token language: the
        bf16 autocast loss curve stays within 0.1 nats of the float32 one at every
        step (measured: at most 0.058, flat)."""
        for name in ('flat', 'toeplitz', 'recurrent', 'transformer'):
            losses = {}
            for bf16 in (False, True):
                torch.manual_seed(0)
                model = mixer.build_model(mixer.variant_config(name, **TINY))
                opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
                data = torch.randint(0, 16, (8, TINY['n_ctx'] + 1)) * 4 % 64     # a learnable 16-token language
                curve = []
                for _ in range(40):
                    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16):
                        _, loss = model(data[:, :-1], data[:, 1:])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    curve.append(loss.item())
                losses[bf16] = torch.tensor(curve)
            with self.subTest(variant=name):
                self.assertLess(losses[False][-1], losses[False][0] - 1.0)       # it learns
                self.assertLess((losses[True] - losses[False]).abs().max().item(), 0.1)


class TestDecoder(unittest.TestCase):
    """sample.Decoder: every mixing's step on its buffers at n_ctx, eager and compiled."""

    def setUp(self):
        torch._dynamo.reset()

    def test_every_variant_steps_to_the_full_forward_eager_and_compiled(self):
        """For every variant: a prefill and one step a token give the full forward's logits, uncompiled
        and through torch.compile (the trace-only 'eager' backend: one graph for every position); and 60
        greedy tokens from a 5-token prompt (the window sliding twice) are the same tokens both ways."""
        for name in mixer.VARIANTS:
            torch._dynamo.reset()
            model = tiny_model(name)
            idx = torch.randint(0, 64, (2, TINY['n_ctx']))
            full, outs = model(idx)[0], {}
            for compiled in (False, True):
                counter = Counter('eager')
                dec = sample.Decoder(model, idx.shape[0], compile=compiled, backend=counter)
                logits = torch.stack([dec.prefill(idx[:, :4])] + [dec.step(idx[:, t:t + 1]) for t in range(4, 24)], 1)
                outs[compiled] = sample.generate(model, idx[:, :5], 60, temperature=0, decoder=dec)
                with self.subTest(variant=name, compiled=compiled):
                    torch.testing.assert_close(logits, full[:, 3:], atol=1e-5, rtol=1e-5)
                    self.assertEqual(counter.graphs, int(compiled))
            with self.subTest(variant=name):
                self.assertTrue(torch.equal(outs[True], outs[False]))
            if name == 'recurrent':          # the state stays one [B, H, d / H] vector a layer
                self.assertEqual([{k: tuple(v.shape) for k, v in s.items()} for s in dec.state],
                                 [{'h': (2, 4, TINY['d_model'] // 4)}] * TINY['n_layer'])

    def test_inductor_greedy_tokens_equal_eager(self):
        """Inductor's compiled step (C++ kernels) gives exactly the eager greedy
        tokens, with one compilation."""
        model = tiny_model('flat', d_model=64)
        idx = torch.randint(0, 64, (1, 5))
        counter = Counter('inductor')
        dec = sample.Decoder(model, compile=True, backend=counter)
        out = sample.generate(model, idx, 30, temperature=0, decoder=dec)
        self.assertEqual(counter.graphs, 1)
        self.assertTrue(torch.equal(out, sample.generate(model, idx, 30, temperature=0)))

    def test_a_small_step_on_the_cpu_runs_on_one_thread(self):
        """On the CPU generate's decode steps of batch x d_model <= sample.ONE_THREAD_WIDTH run on one torch
        thread (the Decoder's `threads`), eager and compiled, and the thread count is the caller's again
        after it; a wider step, and the prompt's prefill, keep the caller's threads."""
        before, seen = torch.get_num_threads(), []
        model = tiny_model('flat')
        step = model.step
        model.step = lambda *a: seen.append(torch.get_num_threads()) or step(*a)
        wide = sample.ONE_THREAD_WIDTH // TINY['d_model'] + 1
        try:
            torch.set_num_threads(2)
            for batch, compiled, want in ((1, False, 1), (1, True, 1), (wide, False, 2)):
                torch._dynamo.reset()
                dec = sample.Decoder(model, batch, compile=compiled, backend='eager')
                seen.clear()
                sample.generate(model, torch.zeros(batch, 3, dtype=torch.long), 3, temperature=0, decoder=dec)
                with self.subTest(batch=batch, compiled=compiled):
                    self.assertEqual(seen, [2, want, want])          # the prefill's, the two steps'
                    self.assertEqual(torch.get_num_threads(), 2)
        finally:
            torch.set_num_threads(before)
            del model.step

    def test_past_n_ctx_is_an_error(self):
        dec = sample.Decoder(tiny_model('flat'))
        dec.prefill(torch.randint(0, 64, (1, TINY['n_ctx'])))
        with self.assertRaisesRegex(ValueError, 'past n_ctx'):
            dec.step(torch.zeros(1, 1, dtype=torch.long))
        with self.assertRaisesRegex(ValueError, 'longer than n_ctx'):
            sample.generate(dec.model, torch.zeros(1, 25, dtype=torch.long), 1)


if __name__ == '__main__':
    unittest.main()
