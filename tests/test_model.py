"""Tests of mixer.py, the models themselves: every variant is causal (a later token
changes no earlier logit, not even through a gradient), incremental decoding equals
the full forward pass, each variant's mixing equals its definition, the recurrent
forms agree with their recurrences, the autoencoder's decoder sees only the
embedding, and every variant learns real TinyStories text.
"""

import math
import os
import unittest
from unittest import mock

import numpy as np
import torch

import attention
import mixer
import sample
from experiments import look
from tests.common import TINY, heads, merge, prepared_data, step_pieces, tiny_model

# ----------------------------------------------------------------------------- causality and caches

class TestCausality(unittest.TestCase):
    """For every variant: no logit depends on a later token."""

    def test_perturbing_a_token_changes_no_earlier_logit(self):
        g = torch.Generator().manual_seed(1)
        for name in mixer.VARIANTS:
            model = tiny_model(name)
            for T in (7, 16, TINY['n_ctx']):          # T = 16, 24 take the Toeplitz FFT path
                idx = torch.randint(0, 64, (2, T), generator=g)
                logits, _ = model(idx)
                for j in (0, T // 2, T - 1):
                    idx2 = idx.clone()
                    idx2[:, j] = (idx2[:, j] + 1) % 64
                    logits2, _ = model(idx2)
                    with self.subTest(variant=name, T=T, j=j):
                        if name == 'toeplitz' and T >= TINY['fft_threshold']:   # FFT rounding, not leakage
                            torch.testing.assert_close(logits2[:, :j], logits[:, :j], atol=1e-5, rtol=0)
                        else:
                            self.assertTrue(torch.equal(logits2[:, :j], logits[:, :j]))
                        self.assertGreater((logits2[:, j:] - logits[:, j:]).abs().max().item(), 1e-6)

    def test_gradient_of_logit_wrt_later_embeddings_is_zero(self):
        for name in mixer.VARIANTS:
            model = tiny_model(name, fft_threshold=10 ** 6)
            for T in (9, TINY['n_ctx']):
                idx = torch.randint(0, 64, (1, T))
                emb = {}
                hook = model.wte.register_forward_hook(
                    lambda m, i, out: emb.setdefault('x', out.detach().requires_grad_()))
                logits, _ = model(idx)
                hook.remove()
                i = T // 2
                (grad,) = torch.autograd.grad(logits[0, i].sum(), emb['x'])
                with self.subTest(variant=name, T=T):
                    self.assertTrue(torch.all(grad[0, i + 1:] == 0))
                    self.assertGreater(grad[0, :i + 1].abs().sum(dim=-1).min().item(), 0)

    def test_short_input_equals_prefix_of_long_input(self):
        for name in mixer.VARIANTS:
            model = tiny_model(name, fft_threshold=10 ** 6)
            idx = torch.randint(0, 64, (2, TINY['n_ctx']))
            full, _ = model(idx)
            for T in (1, 5, 13):
                with self.subTest(variant=name, T=T):
                    self.assertTrue(torch.allclose(model(idx[:, :T])[0], full[:, :T], atol=1e-6, rtol=0))

    def test_mask_stays_exact_under_training(self):
        model = mixer.build_model(mixer.ModelConfig(**TINY)).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        mixing = model.blocks[0].mixing
        upper = ~torch.ones(24, 24, dtype=torch.bool).tril()
        with torch.no_grad():
            mixing.W.add_(0.1 * torch.randn_like(mixing.W))     # non-zero raw weights above the diagonal
        for _ in range(5):
            idx = torch.randint(0, 64, (4, 24))
            _, loss = model(idx[:, :-1], idx[:, 1:])
            opt.zero_grad()
            loss.backward()
            self.assertTrue(torch.all(mixing.W.grad[0][upper] == 0))
            self.assertGreater(mixing.W.grad[0][~upper].abs().sum().item(), 0)
            opt.step()
        self.assertTrue(torch.all(mixing.matrix(24)[0][upper] == 0))
        self.assertTrue(torch.equal(mixing.matrix(24)[0], mixing.W[0] * ~upper))
        self.assertGreater(mixing.W[0][upper].abs().sum().item(), 0)   # the mask does the work


# Badger & Roland 2026's Toeplitz mixer as settings of the toeplitz kind (docs/mqar_window.md)
AUTHOR_FORM = dict(n_head=1, mixing_init='normal', block_order='ff_mix', final_norm=False, init='kaiming',
                   activation='silu', tie_embeddings=False)


class TestAuthorToeplitz(unittest.TestCase):
    """The Toeplitz form of Badger & Roland 2026 (its block order, init, norms) as settings: causal, decoded
    incrementally and statically to the full forward's logits, initialised as said."""

    def test_causal_and_decoded_to_the_full_forward(self):
        model = tiny_model('toeplitz', **AUTHOR_FORM)
        idx = torch.randint(0, 64, (2, TINY['n_ctx']))
        full, _ = model(idx)
        idx2 = idx.clone()
        idx2[:, 9] = (idx2[:, 9] + 1) % 64
        torch.testing.assert_close(model(idx2)[0][:, :9], full[:, :9], atol=1e-5, rtol=0)   # T >= fft_threshold
        self.assertGreater((model(idx2)[0][:, 9:] - full[:, 9:]).abs().max().item(), 1e-4)
        dec = sample.Decoder(model, idx.shape[0])
        steps = torch.stack([dec.prefill(idx[:, :5])] + [dec.step(idx[:, t:t + 1]) for t in range(5, 24)], 1)
        torch.testing.assert_close(steps, full[:, 4:], atol=1e-4, rtol=0)
        torch.testing.assert_close(step_pieces(model, idx, (3, 1, 9, 11)), full[:, [2, 3, 12, 23]], atol=1e-4, rtol=0)

    def test_feed_forward_first_kaiming_init_and_no_final_norm(self):
        torch.manual_seed(0)
        cfg = mixer.variant_config('toeplitz', **{**TINY, 'n_ctx': 512, 'd_model': 256, **AUTHOR_FORM})
        model = mixer.build_model(cfg)
        calls = []
        block = model.blocks[0]
        for name in ('ff', 'mixing'):
            getattr(block, name).register_forward_hook(lambda m, i, o, name=name: calls.append(name))
        model(torch.randint(0, 64, (1, 8)))
        self.assertEqual(calls[:2], ['ff', 'mixing'])
        self.assertIsInstance(model.norm_f, torch.nn.Identity)
        self.assertIsInstance(block.ff.act, torch.nn.SiLU)
        self.assertFalse(model.lm_head.weight is model.wte.weight)
        for got, want in ((block.mixing.w.std(), math.sqrt(2 / 512)), (block.ff.fc.weight.std(), math.sqrt(2 / 256)),
                          (block.ff.proj_out.weight.std(), math.sqrt(2 / 1024)), (model.wte.weight.std(), 1.0)):
            self.assertAlmostEqual(got.item() / want, 1.0, delta=0.05)
        with self.assertRaisesRegex(ValueError, "mixing_init='normal' is the Toeplitz mixing's"):
            mixer.variant_config('flat', **TINY, mixing_init='normal')

    def test_kaiming_keeps_tied_embeddings_at_unit_variance(self):
        """init='kaiming' with tied embeddings (issue 87): the embedding is N(0, 1) and the head is that same
        matrix (std about 1.0 at d_model 256, not the head's fan-in 0.088); untied, the head alone is
        N(0, 2 / d_model). The gpt2 init is untouched: N(0, 0.02) either way."""
        cases = (('kaiming', True, 1.0, 1.0), ('kaiming', False, 1.0, math.sqrt(2 / 256)),
                 ('gpt2', True, 0.02, 0.02), ('gpt2', False, 0.02, 0.02))
        for init, tie, wte_std, head_std in cases:
            torch.manual_seed(0)
            cfg = mixer.variant_config('flat', **{**TINY, 'vocab_size': 512, 'd_model': 256}, init=init,
                                       tie_embeddings=tie)
            model = mixer.build_model(cfg)
            with self.subTest(init=init, tie_embeddings=tie):
                self.assertIs(model.lm_head.weight is model.wte.weight, tie)
                self.assertAlmostEqual(model.wte.weight.std().item() / wte_std, 1.0, delta=0.02)
                self.assertAlmostEqual(model.lm_head.weight.std().item() / head_std, 1.0, delta=0.02)


class TestIncremental(unittest.TestCase):
    """Decoding (every token mixing's step, on its buffers at n_ctx) gives the logits of the full forward pass."""

    def test_every_variant_has_a_step_and_flops_in_its_mixing_class(self):
        """Each block's mixing, of every variant, defines step and flops in its own class (or a base of
        it in mixer.py / attention.py): a kind without them fails here, by name."""
        for name in mixer.VARIANTS:
            for block in tiny_model(name).blocks:
                for face in ('forward', 'init_state', 'step', 'flops'):
                    with self.subTest(variant=name, face=face):
                        owner = next((c for c in type(block.mixing).__mro__ if face in vars(c)), None)
                        self.assertTrue(owner is not None and owner.__module__ in ('mixer', 'attention'),
                                        f'{name}: {type(block.mixing).__name__} has no {face} of its own')

    def test_steps_in_pieces_equal_forward(self):
        """One token a step, steps of several tokens after a prefix, and one step of all 24 (a prefill):
        the logits after each piece are the full forward's there, for every variant."""
        for name in mixer.VARIANTS:
            model = tiny_model(name)
            idx = torch.randint(0, 64, (2, TINY['n_ctx']))
            full, _ = model(idx)
            for cuts in ((1,) * 24, (5, 1, 1, 10, 7), (24,)):
                ends = [sum(cuts[:i + 1]) - 1 for i in range(len(cuts))]
                for tensor_pos in (False, True):
                    with self.subTest(variant=name, cuts=cuts, tensor_pos=tensor_pos):
                        torch.testing.assert_close(step_pieces(model, idx, cuts, tensor_pos), full[:, ends],
                                                   atol=1e-4, rtol=0)

    def test_an_eager_step_costs_what_it_reads(self):
        """At n_ctx 2048, d_model 256, one token at position 1,900 against one at 64: an eager step (an int
        position) of the flat mixing does at least 10x the FLOPs (FlopCounterMode), the Toeplitz and
        attention steps, projections included, at least 2.5x (attention's kernel counted from the key
        length SDPA receives, 4 S d); the compiled step's (a 0-dim tensor position) reads all n_ctx at
        both positions, one graph for all (equal counts)."""
        from torch.utils.flop_counter import FlopCounterMode
        torch.manual_seed(0)
        keys, sdpa = [], torch.nn.functional.scaled_dot_product_attention

        def spy(q, k, v, **kw):
            keys.append(k.shape[2])
            return sdpa(q, k, v, **kw)
        mixings = {'flat': (mixer.FlatMixing(2048, 256, 1), 10),
                   'toeplitz': (mixer.ToeplitzMixing(2048, 256, 4, 2048, 'average'), 2.5),
                   'attention': (attention.Attention(2048, 256, 4), 2.5)}
        for name, (mixing, ratio) in mixings.items():
            for as_pos in (int, torch.tensor):
                work, state = [], mixing.init_state(1)
                for pos in (64, 1900):
                    with torch.no_grad(), FlopCounterMode(display=False) as counter, \
                            mock.patch('torch.nn.functional.scaled_dot_product_attention', spy):
                        mixing.step(torch.randn(1, 1, 256), state, as_pos(pos))
                    work.append(counter.get_total_flops() + (4 * keys.pop() * 256 if keys else 0))
                with self.subTest(mixing=name, position=as_pos.__name__):
                    if as_pos is int:
                        self.assertGreaterEqual(work[1] / work[0], ratio)
                    else:
                        self.assertEqual(work[1], work[0])

    def test_generate_matches_greedy_full_forward(self):
        for name in mixer.VARIANTS:
            model = tiny_model(name)
            prompt = torch.randint(0, 64, (1, 5))
            out = sample.generate(model, prompt, 12, temperature=0)
            seq = prompt
            for _ in range(12):   # the slow reference: a full forward per token
                seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], 1)
            with self.subTest(variant=name):
                self.assertTrue(torch.equal(out, seq))

    def test_generation_past_n_ctx_slides_the_window(self):
        """Past n_ctx the window restarts from exactly the last n_ctx / 2 tokens, and every
        decode (the slide's and those after it) gives the logits of a full forward over
        the tokens in the window; linear attention (no positions) never slides."""
        half = TINY['n_ctx'] // 2
        for name in ('flat', 'transformer', 'recurrent', 'linear_attention'):
            model = tiny_model(name)
            calls, model_step = [], model.step

            def spy(idx, layers, pos):
                logits = model_step(idx, layers, pos)
                calls.append((int(pos), idx.clone(), logits[:, None]))     # the decoder reuses its input tensor
                return logits
            model.step = spy
            out = sample.generate(model, torch.randint(0, 64, (2, 20)), 40, temperature=0)
            del model.step
            window, n_out, slides = None, 20, 0
            for pos, idx, logits in calls:
                if pos == 0 and window is not None:                # a slide, after sampling one more token
                    slides, n_out = slides + 1, n_out + 1
                    with self.subTest(variant=name, n_out=n_out):
                        self.assertTrue(torch.equal(idx, out[:, n_out - half:n_out]))
                window = idx if pos == 0 else torch.cat([window, idx], 1)
                if pos > 0:
                    n_out += idx.shape[1]
                with self.subTest(variant=name, n_out=n_out):
                    self.assertEqual(window.shape[1], pos + idx.shape[1])
                    torch.testing.assert_close(logits, model(window)[0][:, -1:], atol=1e-4, rtol=0)
                    self.assertTrue(torch.equal(out[:, :n_out][:, -window.shape[1]:], window))
            with self.subTest(variant=name):
                self.assertEqual(out.shape, (2, 60))
                self.assertEqual(slides, 0 if name == 'linear_attention' else 3)   # at 24, 36 and 48 tokens
        with self.assertRaises(ValueError):
            sample.generate(tiny_model('flat'), torch.zeros(1, 25, dtype=torch.long), 1)


# ----------------------------------------------------------------------------- variants

class TestVariants(unittest.TestCase):

    def test_toeplitz_fft_equals_materialised_and_definition(self):
        """The FFT's M z equals the materialised matrix's at every length, and forward takes the matrix
        below fft_threshold (17) and the FFT from it on; M[i, j] = w[i - j], zero above the diagonal."""
        layer = mixer.ToeplitzMixing(n_ctx=64, d_model=8, n_head=2, fft_threshold=17, mixing_init='average')
        with torch.no_grad():
            layer.w.normal_()
            layer.c.normal_()
        for T in (1, 16, 17, 64):
            x = torch.randn(3, T, 8)
            with torch.no_grad():
                z = heads(layer, x)
                by_fft, by_matrix = layer.fft(z), layer.mix(layer.matrix(T), z)
                torch.testing.assert_close(by_fft, by_matrix, atol=1e-4, rtol=0)
                taken = by_fft if T >= 17 else by_matrix
                self.assertTrue(torch.equal(layer(x), merge(layer, taken + layer.c[:, :T])), T)
        M = layer.matrix(64)
        for i, j in ((0, 0), (5, 2), (63, 0), (40, 39)):
            self.assertEqual(M[1, i, j].item(), layer.w[1, i - j].item())
        self.assertTrue(torch.all(M[:, ~torch.ones(64, 64, dtype=torch.bool).tril()] == 0))

    def test_every_head_of_the_multihead_mixer_is_live(self):
        model = tiny_model('multihead')
        idx = torch.randint(0, 64, (2, 24))
        base, _ = model(idx)
        mixing = model.blocks[0].mixing
        self.assertEqual(mixing.W.shape[0], 4)
        for h in range(4):
            with torch.no_grad():
                mixing.W[h, 10, 3] += 1.0
                changed = (model(idx)[0] - base).abs().max().item()
                mixing.W[h, 10, 3] -= 1.0
            self.assertGreater(changed, 1e-4, f'head {h} has no effect')

    def test_expanded_and_kernel_shapes(self):
        self.assertEqual(tiny_model('expanded').blocks[0].mixing.W.shape, (1, 48, 24))
        self.assertEqual(tiny_model('expanded').blocks[0].mixing.W2.shape, (1, 24, 48))
        self.assertEqual(tiny_model('kernel').blocks[0].mixing.W.shape, (1, 3, 24, 24))
        self.assertEqual(tiny_model('flat').blocks[0].mixing.W.shape, (1, 24, 24))
        with self.assertRaises(ValueError):
            mixer.ModelConfig(**TINY, expansion=2, feature_kernel=3)

    def test_fresh_expanded_mixing_averages_once(self):
        """A fresh expanded mixing copies each position into its hidden rows (M1 = the
        identity per position), and only M2 averages over the past."""
        layer = mixer.ExpandedMixing(n_ctx=6, d_model=4, n_head=1, expansion=2, out_scale=0.5)
        M1 = layer.matrix(6)[0]
        self.assertTrue(torch.equal(M1, (torch.arange(12)[:, None] // 2 == torch.arange(6)).float()))
        M2 = layer.W2[0] * layer.mask2
        torch.testing.assert_close(M2.sum(-1), torch.full((6,), 0.5))
        self.assertTrue(torch.all(M2[5] == 0.5 / 12))

    @staticmethod
    def random_masked(kind, **kw):
        """A masked mixing of class `kind` whose raw weights (above the diagonal too) and biases are random."""
        torch.manual_seed(0)
        layer = kind(n_ctx=7, d_model=10, n_head=2, **kw)
        with torch.no_grad():
            for p in layer.parameters():
                p.normal_()
        return layer

    def assert_forward_and_steps(self, layer, x, want, cut):
        """layer(x) is `want` (float [B, T, d]), and so are two steps on its init_state, cut at `cut`, at int
        positions (eager) and at 0-dim tensor positions (compiled)."""
        torch.testing.assert_close(layer(x), want, atol=1e-5, rtol=1e-5)
        for as_pos in (int, torch.tensor):
            state = layer.init_state(x.shape[0])
            pieces = torch.cat([layer.step(x[:, :cut], state, as_pos(0)), layer.step(x[:, cut:], state, as_pos(cut))], 1)
            torch.testing.assert_close(pieces, want, atol=1e-5, rtol=1e-5)

    def test_kernel_mixing_equals_a_loop_over_taps(self):
        """k taps: y[i, f] = c[i] + sum_u sum_{j<=i} W[u, i, j] z[j, f + u - (k-1)//2]
        (z zero outside the features), written as loops; also when decoded in pieces."""
        for k in (2, 3, 4):
            layer = self.random_masked(mixer.KernelMixing, feature_kernel=k)
            x = torch.randn(2, 7, 10)
            z = heads(layer, x)                                              # the heads [2, 2, 7, 5]
            ref = torch.zeros(2, 2, 7, 5)
            for h in range(2):
                for i in range(7):
                    ref[:, h, i] += layer.c[h, i, 0]
                    for u in range(k):
                        for f in range(5):
                            g = f + u - (k - 1) // 2
                            if 0 <= g < 5:
                                for j in range(i + 1):
                                    ref[:, h, i, f] += layer.W[h, u, i, j] * z[:, h, j, g]
            with self.subTest(k=k):
                self.assert_forward_and_steps(layer, x, merge(layer, ref), 3)

    def test_expanded_mixing_equals_a_loop_over_hidden_rows(self):
        """Expansion e: hidden row r (position r // e) is g_r = GELU(c[r] + sum_{j <= r//e}
        W[r, j] z_j), and y_i = c2[i] + sum_{r: r//e <= i} W2[i, r] g_r, as loops; also in steps."""
        for e in (2, 3):
            layer = self.random_masked(mixer.ExpandedMixing, expansion=e)
            x = torch.randn(2, 7, 10)
            z = heads(layer, x)                                              # the heads [2, 2, 7, 5]
            ref = torch.zeros(2, 2, 7, 5)
            for h in range(2):
                hidden = []
                for r in range(7 * e):
                    acc = layer.c[h, r, 0] + sum(layer.W[h, r, j] * z[:, h, j] for j in range(r // e + 1))
                    hidden.append(torch.nn.functional.gelu(acc))
                for i in range(7):
                    ref[:, h, i] = layer.c2[h, i, 0] + sum(layer.W2[h, i, r] * hidden[r]
                                                           for r in range(7 * e) if r // e <= i)
            with self.subTest(e=e):
                self.assert_forward_and_steps(layer, x, merge(layer, ref), 4)

    def test_linear_mixer_is_linear_in_the_embeddings(self):
        model = tiny_model('linear_mixer')
        self.assertFalse(any(isinstance(m, (torch.nn.LayerNorm, torch.nn.GELU)) for m in model.modules()))
        h = model.blocks
        x1, x2 = torch.randn(2, 1, 24, 32).unbind(0)

        def trunk(x):
            for b in h:
                x = b(x)
            return x
        zero = trunk(torch.zeros_like(x1))     # the affine part (biases)
        torch.testing.assert_close(trunk(x1 + 2 * x2) - zero, (trunk(x1) - zero) + 2 * (trunk(x2) - zero),
                                   atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- recurrent mixer
    def test_fresh_hybrid_is_the_transformer(self):
        """The serial hybrid's mixing starts at the identity, so a fresh hybrid's logits
        are the transformer's when the shared weights are copied across (Badger 2024's
        hybrid, initialised so that it learns what to mix)."""
        for mixing in ('flat', 'toeplitz'):
            torch.manual_seed(0)
            hybrid = mixer.build_model(mixer.variant_config('hybrid', **{**TINY, 'token_mixing': mixing,
                                                                          'fft_threshold': 10 ** 6})).eval()
            mix = hybrid.blocks[0].mixing.token_mixing
            x = torch.randn(2, 24, 32)
            with self.subTest(mixing=mixing):
                self.assertTrue(torch.equal(mix(x), x))
            transformer = mixer.build_model(mixer.variant_config('transformer', **TINY)).eval()
            state = {k.replace('mixing.attn.', 'mixing.'): v for k, v in hybrid.state_dict().items()
                     if '.mixing.token_mixing.' not in k}
            transformer.load_state_dict(state)
            idx = torch.randint(0, 64, (2, 24))
            with self.subTest(mixing=mixing):
                torch.testing.assert_close(hybrid(idx)[0], transformer(idx)[0], atol=1e-6, rtol=0)

    def test_parallel_hybrid_adds_the_two_branches(self):
        """hybrid_parallel: y = Attn(z) + Mix(z), each branch live."""
        model = tiny_model('hybrid_parallel')
        branch = model.blocks[0].mixing
        z = torch.randn(2, 24, 32)
        torch.testing.assert_close(branch(z), branch.attn(z) + branch.token_mixing(z), atol=0, rtol=0)
        for part in (branch.attn, branch.token_mixing):
            self.assertGreater(part(z).abs().max().item(), 1e-3)


class TestRecurrent(unittest.TestCase):

    def layer(self, form, decays, n_ctx=40, chunk_size=16):
        layer = mixer.RecurrentMixing(n_ctx, d_model=12, n_head=len(decays), form=form, chunk_size=chunk_size)
        with torch.no_grad():
            layer.a_logit.copy_(torch.logit(torch.tensor(decays)))
            layer.v.normal_()
            layer.c.normal_()
        return layer

    def test_parallel_equals_recurrence_and_definition(self):
        for form in ('column', 'row', 'mixed'):
            for decays in ([1e-3, 0.5, 0.999], [0.9999, 0.9, 0.01]):
                layer = self.layer(form, decays)
                for T in (1, 15, 16, 40):
                    z = torch.randn(2, 3, T, 4)
                    y_par = layer.scan(z, None, 0)[0]
                    # reference recurrence, token by token, written from the definition
                    a = torch.tensor(decays)[:, None]
                    h = torch.zeros(2, 3, 4)
                    ys = []
                    for t in range(T):
                        v = layer.v[:, t, None]
                        col = layer.column[:, :, 0]
                        h = a * h + torch.where(col, z[:, :, t], v * z[:, :, t])
                        ys.append(torch.where(col, v * h, h) + layer.c[:, t])
                    with self.subTest(form=form, decays=decays, T=T):
                        torch.testing.assert_close(y_par, torch.stack(ys, 2), atol=1e-4, rtol=1e-4)
                        M = look.recurrent_matrix(layer, T)
                        ref = torch.stack([(M[hh] @ z[:, hh]) for hh in range(3)], 1) + layer.c[:, :T]
                        torch.testing.assert_close(y_par, ref, atol=1e-4, rtol=1e-4)
                i, j = 30, 7
                M = look.recurrent_matrix(layer, 40)
                for hh in range(3):
                    vi = layer.v[hh, i] if layer.column[hh] else layer.v[hh, j]
                    self.assertAlmostEqual(M[hh, i, j].item(), (vi * decays[hh] ** (i - j)).item(), places=5)
                    self.assertEqual(M[hh, j, i].item(), 0.0)

    def test_state_size_does_not_grow(self):
        model = tiny_model('recurrent', n_ctx=4096)
        dec = sample.Decoder(model)
        dec.prefill(torch.randint(0, 64, (1, 8)))
        shapes = [tuple(s['h'].shape) for s in dec.state]
        buffers = [id(b) for b in sample.state_tensors(dec.state)]
        for _ in range(200):
            dec.step(torch.randint(0, 64, (1, 1)))
        self.assertEqual(dec.pos, 208)
        self.assertEqual([tuple(s['h'].shape) for s in dec.state], shapes)
        self.assertEqual([id(b) for b in sample.state_tensors(dec.state)], buffers)   # the same tensors
        self.assertEqual(shapes[0], (1, 4, 8))       # one vector of d / H per head per layer

    def test_linear_attention_state_size_does_not_grow(self):
        """Linear attention decodes with S [B, H, e, e] and s [B, H, e] per layer: the
        same bytes after 8 tokens and after 208 (no cache of past tokens)."""
        model = tiny_model('linear_attention')
        dec = sample.Decoder(model)
        dec.prefill(torch.randint(0, 64, (1, 8)))
        shapes = [{k: tuple(v.shape) for k, v in s.items()} for s in dec.state]
        buffers = list(sample.state_tensors(dec.state))
        for _ in range(200):
            dec.step(torch.randint(0, 64, (1, 1)))
        self.assertEqual(dec.pos, 208)                         # far past n_ctx = 24
        self.assertEqual([{k: tuple(v.shape) for k, v in s.items()} for s in dec.state], shapes)
        self.assertEqual([id(b) for b in sample.state_tensors(dec.state)], [id(b) for b in buffers])
        n_head = model.blocks[0].mixing.n_head
        e = TINY['d_model'] // n_head
        self.assertEqual(shapes[0], {'S': (1, n_head, e, e), 's': (1, n_head, e)})

    def test_long_context_is_finite_in_fp32_and_bf16(self):
        layer = self.layer('mixed', [1e-4, 0.5, 0.99999, 0.999], n_ctx=8192, chunk_size=1024)
        z = torch.randn(1, 4, 8192, 3)
        for dtype in (torch.float32, torch.bfloat16):
            with torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                y = layer.scan(z.to(dtype), None, 0)[0]
            self.assertTrue(torch.isfinite(y).all(), dtype)
        # the powers the scan multiplies each chunk by (powers(8192), 4 x 8192^2 floats, cost 7 s of CPU: its
        # lags past a chunk reach the output only through the state, which the scan above checks)
        self.assertTrue(torch.isfinite(layer.powers(1024)).all())




class TestOldCheckpoints(unittest.TestCase):

    def test_the_masked_mixings_older_names_load_to_the_same_logits(self):
        """A state dict of the layout before the masked mixings' W lost its tap axis (W1 [H, 1, x n_ctx, n_ctx]
        or [H, k, n_ctx, n_ctx], c1), as loading.read_checkpoint reads it (migrate_state), loads into
        today's model of every masked variant with the same logits."""
        from harness import loading
        for name in ('flat', 'multihead', 'expanded', 'kernel', 'hybrid'):
            model = tiny_model(name)
            old = {}
            for k, v in model.state_dict().items():
                if k.endswith(('.W', '.c')):
                    k, v = k + '1', v[:, None] if k.endswith('.W') and name != 'kernel' else v
                old[k] = v
            fresh = mixer.build_model(model.cfg).eval()
            fresh.load_state_dict(loading.migrate_state(old))
            idx = torch.randint(0, 64, (2, TINY['n_ctx']))
            with self.subTest(variant=name), torch.no_grad():
                self.assertTrue(any(k.endswith('.W1') for k in old))
                torch.testing.assert_close(fresh(idx)[0], model(idx)[0], atol=0, rtol=0)


# ----------------------------------------------------------------------------- autoencoder

class TestAutoencoder(unittest.TestCase):

    def test_decoder_sees_only_the_embedding(self):
        """The decoder's input is e = encode(idx) repeated over positions (plus the
        decoder's own position table for attention kinds) and nothing else: the tokens
        are embedded once, by the encoder."""
        for name in ('flat', 'transformer'):
            model = tiny_model(name, task='autoencode')
            idx = torch.randint(0, 64, (2, 16))
            seen, calls = {}, []
            h1 = model.decoder[0].register_forward_pre_hook(lambda m, args: seen.setdefault('x', args[0]))
            h2 = model.wte.register_forward_hook(lambda m, i, out: calls.append(1))
            logits, loss = model(idx, idx)
            h1.remove()
            h2.remove()
            e = model.encode(idx)
            expected = e[:, None, :].expand(-1, 16, -1)
            if model.wpe_dec is not None:
                expected = expected + model.wpe_dec[:16]
            with self.subTest(variant=name):
                self.assertEqual(len(calls), 1)                     # the token embedding is read once
                self.assertTrue(torch.equal(seen['x'], expected))
                self.assertEqual(logits.shape, (2, 16, 64))
                self.assertTrue(math.isfinite(loss.item()))
                if model.wpe_dec is None:                           # the mixer: all positions alike
                    self.assertTrue(torch.equal(seen['x'], seen['x'][:, :1].expand(-1, 16, -1)))

    def test_short_training_reconstructs_real_text(self):
        """150 steps on real text take the reconstruction accuracy of 8-token windows to
        more than 2.5 times the most-common-token rate, the best a decoder that ignores
        its input could do on windows at random offsets: the embedding carries the text."""
        data = prepared_data()
        train = torch.from_numpy(np.fromfile(os.path.join(data, 'train.bin'), dtype=np.uint16).astype(np.int64))
        val = torch.from_numpy(np.fromfile(os.path.join(data, 'val.bin'), dtype=np.uint16).astype(np.int64))
        T = 8
        val_x = torch.stack([val[s:s + T] for s in range(0, 64 * 200, 200)])
        common = (val_x == torch.bincount(train).argmax()).float().mean().item()
        torch.manual_seed(0)
        model = mixer.build_model(mixer.variant_config('flat', vocab_size=512, n_ctx=T, d_model=64, n_layer=1,
                                                       n_head=1, task='autoencode'))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        g = torch.Generator().manual_seed(0)
        for _ in range(150):
            starts = torch.randint(0, len(train) - T - 1, (32,), generator=g)
            batch = torch.stack([train[s:s + T] for s in starts])
            _, loss = model(batch, batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            acc = (model(val_x)[0].argmax(-1) == val_x).float().mean().item()
        self.assertGreater(acc, 2.5 * common, f'accuracy {acc:.3f}, most common token {common:.3f}')



# ----------------------------------------------------------------------------- real text

REAL_TEXT_STEPS = 80


class TestTrainingOnRealText(unittest.TestCase):

    def test_every_variant_learns_real_text(self):
        """A few dozen steps take every variant below the unigram cross entropy of
        the validation text: it predicts from context, not only token frequencies."""
        data = prepared_data()
        train = torch.from_numpy(np.fromfile(os.path.join(data, 'train.bin'), dtype=np.uint16).astype(np.int64))
        val = torch.from_numpy(np.fromfile(os.path.join(data, 'val.bin'), dtype=np.uint16).astype(np.int64))
        counts = torch.bincount(train, minlength=512).double() + 1
        unigram = -torch.log(counts / counts.sum())[val].mean().item()          # nats/token
        T = 64
        val_x = torch.stack([val[s:s + T + 1] for s in range(0, 64 * 200, 200)])
        for name in mixer.VARIANTS:
            torch.manual_seed(0)
            cfg = mixer.variant_config(name, vocab_size=512, n_ctx=T, d_model=64, n_layer=2, n_head=1,
                                       chunk_size=32)
            model = mixer.build_model(cfg)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
            g = torch.Generator().manual_seed(0)
            for _ in range(REAL_TEXT_STEPS):
                starts = torch.randint(0, len(train) - T - 1, (16,), generator=g)
                batch = torch.stack([train[s:s + T + 1] for s in starts])
                _, loss = model(batch[:, :-1], batch[:, 1:])
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            with torch.no_grad():
                after = model(val_x[:, :-1], val_x[:, 1:])[1].item()
            with self.subTest(variant=name):
                self.assertLess(after, unigram - 0.25, f'{name}: val loss {after:.3f}, unigram {unigram:.3f}')

    # train.py's own tests (resume, DDP, grad_accum, settings, Muon, summary) are in test_train.py

