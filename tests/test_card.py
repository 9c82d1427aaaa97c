"""The card's constraints where they live (issue "each in one form"): one causal rule in every mask, each
mixing's own decoding, one interface, every head size decodes, the Decoder's refusals, older names migrated.

    TestCausalRule     every mask of the models is mixer.causal_mask (a leaky rule leaks in each);
                       SDPA's is_causal equals it; the Toeplitz FFT is causal by its padding
    TestOwnDecoding    the recurrent and linear-attention steps are their recurrences, equal to the scans;
                       every identity_start is the identity; every mixing answers decays()
    TestHeadSizes      every kind decodes at an odd head size its config accepts (or refuses it in one line)
    TestDecoderInputs  what a Decoder cannot take is a ValueError; a step of t tokens advances t
    TestMigration      a checkpoint in the older names (settings and values) loads with the same logits
    TestReadingPath    one flat forward passes through at most 8 of the project's functions, one decode step
                       through 10, none in attention.py; Toeplitz, recurrent, transformer at most 2 more
    TestLayers         the model files import no harness, data/ nothing of experiments/; an autoencoder's
                       encoder sees the positions its kind uses
"""

import ast
import os
import sys
import tempfile
import unittest
from unittest import mock

import torch
import torch.nn.functional as F

import attention
import mixer
import sample
from harness import loading
from tests.common import ROOT, TINY, heads, merge, tiny_model

# every sequence mixing class, in forward form (attention naive: SDPA's flag is its own test below)
MIXING_VARIANTS = ('flat', 'expanded', 'multihead', 'kernel', 'toeplitz', 'recurrent', 'transformer_naive',
                   'hybrid', 'linear_attention')


def leaky_mask(T, rows=slice(None), device=None):
    """A wrong causal rule, j <= i + 1 (one future token readable), with causal_mask's signature."""
    pos = torch.arange(T, device=device)
    return pos <= pos[rows][:, None] + 1


class TestCausalRule(unittest.TestCase):

    def future_leaks(self, model, at=5):
        """Whether the logits at position `at` change when the token at+1 changes."""
        idx = torch.randint(0, 64, (1, 16))
        other = idx.clone()
        other[0, at + 1] = (other[0, at + 1] + 1) % 64
        with torch.no_grad():
            return not torch.allclose(model(idx)[0][0, at], model(other)[0][0, at])

    def test_every_mask_is_the_one_rule(self):
        """With mixer.causal_mask (and attention.py's import of it) replaced by a rule that lets a position read
        the next one, every mixing leaks the future (its mask is that function's); with the real rule none does."""
        for name in MIXING_VARIANTS:
            with self.subTest(variant=name):
                self.assertFalse(self.future_leaks(tiny_model(name, fft_threshold=1000)))
                with mock.patch.object(attention, 'causal_mask', leaky_mask), \
                        mock.patch.object(mixer, 'causal_mask', leaky_mask):
                    self.assertTrue(self.future_leaks(tiny_model(name, fft_threshold=1000)))

    def test_sdpa_is_causal_is_the_rule(self):
        """scaled_dot_product_attention(is_causal=True), which lets SDPA pick a fused implementation, equals
        it with attn_mask=causal_mask(T), at a full square and for the last rows of a longer key set."""
        q, k, v = torch.randn(3, 2, 4, 11, 8).unbind(0)
        torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                   F.scaled_dot_product_attention(q, k, v, attn_mask=attention.causal_mask(11)))
        with mock.patch.object(attention, 'causal_mask', leaky_mask):         # the check can fail
            self.assertFalse(torch.allclose(F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                            F.scaled_dot_product_attention(q, k, v, attn_mask=attention.causal_mask(11))))

    def test_the_fft_is_causal_by_its_padding(self):
        """The Toeplitz FFT path uses no mask: zero-padding to 2T keeps the circular convolution from
        wrapping around. Its outputs equal the masked matrix's, and a later token changes no earlier output;
        without the padding (n = T) the last tokens would reach the first outputs."""
        mix = mixer.ToeplitzMixing(32, 16, 2, fft_threshold=16, mixing_init='normal')
        z = torch.randn(2, 2, 20, 8)                                                # the heads [B, H, T, e]
        with torch.no_grad():
            y = mix.fft(z)
            torch.testing.assert_close(y, mix.mix(mix.matrix(20), z), atol=1e-5, rtol=1e-5)
            later = z.clone()
            later[:, :, 15:] += 1.0
            torch.testing.assert_close(mix.fft(later)[:, :, :15], y[:, :, :15], atol=1e-5, rtol=1e-5)
        z, w = z[0, 0, :, 0], mix.w[0, :20].detach()
        wrapped = torch.fft.irfft(torch.fft.rfft(z, n=20) * torch.fft.rfft(w, n=20), n=20)      # no padding
        later_z = z.clone()
        later_z[15:] += 1.0
        unpadded = torch.fft.irfft(torch.fft.rfft(later_z, n=20) * torch.fft.rfft(w, n=20), n=20)
        self.assertFalse(torch.allclose(wrapped[:15], unpadded[:15]))


class TestOwnDecoding(unittest.TestCase):

    def test_recurrent_step_is_the_recurrence_and_equals_the_scan(self):
        """RecurrentMixing.step of one token at a time is h = a h + u (checked by hand for a column and a
        row head), and after T tokens its state and outputs equal the chunked scan's."""
        mix = tiny_model('recurrent').blocks[0].mixing
        z = torch.randn(2, 11, TINY['d_model'])
        state = mix.init_state(2)
        with torch.no_grad():
            ys = torch.cat([mix.step(z[:, t:t + 1], state, t) for t in range(11)], 1)
            y_scan, h_scan = mix.scan(heads(mix, z), None, 0)
            torch.testing.assert_close(ys, merge(mix, y_scan), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(state['h'], h_scan, atol=1e-5, rtol=1e-5)
            u, a = heads(mix, z), torch.sigmoid(mix.a_logit)
            h = torch.zeros_like(u[:, :, 0])
            for t in range(11):                               # column heads u = z_t, row heads u = v_t z_t
                h = a[:, None] * h + torch.where(mix.column[:, 0], u[:, :, t], mix.v[:, t, None] * u[:, :, t])
            torch.testing.assert_close(state['h'], h, atol=1e-5, rtol=1e-5)

    def test_linear_attention_step_is_its_recurrence(self):
        """LinearAttention.step of one token at a time ends in S = sum phi(k) v^T and s = sum phi(k), as the
        scan's state, with the same outputs."""
        mix = tiny_model('linear_attention').blocks[0].mixing
        x = torch.randn(2, 13, TINY['d_model'])
        state = mix.init_state(2)
        with torch.no_grad():
            ys = torch.cat([mix.step(x[:, t:t + 1], state, t) for t in range(13)], 1)
            y = mix.scan(x, None, None)[0]
            _, k, v = mix.features(x)
        torch.testing.assert_close(ys, y, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(state['S'], k.transpose(-1, -2) @ v, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(state['s'], k.sum(2), atol=1e-5, rtol=1e-5)

    def test_every_identity_start_is_the_identity(self):
        """Each mixing that has identity_start (the serial hybrid's start) passes its input through,
        one head and no bias; a mixing without one has none to inherit (the expanded mixer's GELU)."""
        x = torch.randn(2, 10, 12)
        mixings = {'flat': mixer.FlatMixing(16, 12, 1), 'kernel': mixer.KernelMixing(16, 12, 1, 3),
                   'toeplitz': mixer.ToeplitzMixing(16, 12, 1, fft_threshold=16, mixing_init='normal')}
        for name, mix in mixings.items():
            with self.subTest(mixing=name), torch.no_grad():
                torch.testing.assert_close(mix.identity_start()(x), x)
        self.assertFalse(hasattr(mixer.ExpandedMixing(16, 12, 1, expansion=2), 'identity_start'))

    def test_every_sequence_mixing_has_the_five_faces(self):
        """forward, init_state, step, flops and decays on every block's mixing of every variant; decays()
        holds only the mixing's own parameters."""
        for name in mixer.VARIANTS:
            mixing = tiny_model(name).blocks[0].mixing
            with self.subTest(variant=name):
                for face in ('forward', 'init_state', 'step', 'flops', 'decays'):
                    self.assertTrue(callable(getattr(mixing, face, None)), face)
                own = {id(p) for p in mixing.parameters()}
                self.assertLessEqual({id(p) for p in mixing.decays()}, own)


class TestHeadSizes(unittest.TestCase):

    def test_every_kind_decodes_at_an_odd_head_size(self):
        """d_model 36, 4 heads (head size 9) for every variant: the config refuses it in one line (RoPE
        needs an even head size), or the decoder's steps give the full forward's logits."""
        idx = torch.randint(0, 64, (2, 14))
        for name in mixer.VARIANTS:
            with self.subTest(variant=name):
                try:
                    cfg = mixer.variant_config(name, **{**TINY, 'd_model': 36, 'n_head': 4})
                except ValueError as e:
                    self.assertIn('even head size', str(e))
                    self.assertIn(name, ('transformer', 'transformer_naive', 'hybrid', 'hybrid_parallel'))
                    continue
                model = mixer.build_model(cfg).eval()
                dec = sample.Decoder(model, 2)
                with torch.no_grad():
                    full = model(idx)[0]
                    got = torch.stack([dec.prefill(idx[:, :6])] + [dec.step(idx[:, t:t + 1]) for t in range(6, 14)], 1)
                torch.testing.assert_close(got, full[:, 5:], atol=1e-5, rtol=1e-5)


class TestDecoderInputs(unittest.TestCase):

    def test_what_a_decoder_cannot_take_is_a_value_error(self):
        """A prefill of 0 tokens, tokens of another batch, and a step under another autocast than the one
        the state was made for: each a ValueError saying why, the state untouched."""
        model = tiny_model('flat')
        dec = sample.Decoder(model, 2)
        dec.prefill(torch.zeros(2, 3, dtype=torch.long))
        with self.assertRaisesRegex(ValueError, r't >= 1'):
            dec.prefill(torch.zeros(2, 0, dtype=torch.long))
        with self.assertRaisesRegex(ValueError, 'batch of 2'):
            dec.step(torch.zeros(3, 1, dtype=torch.long))
        with torch.autocast('cpu', dtype=torch.bfloat16):
            made_under = sample.Decoder(model, 2)
        with self.assertRaisesRegex(ValueError, 'bfloat16'):
            made_under.prefill(torch.zeros(2, 3, dtype=torch.long))
        with torch.autocast('cpu', dtype=torch.bfloat16), self.assertRaisesRegex(ValueError, 'float32'):
            dec.step(torch.zeros(2, 1, dtype=torch.long))
        self.assertEqual(dec.pos, 3)

    def test_a_prefill_starts_fresh_sequences(self):
        """A decoder that has read other sequences (a prefill and steps) prefills new ones as a fresh decoder
        would: the logits after the prompt and after the next tokens are the forward's, for every kind
        (the recurrent and linear-attention states are zeroed first, not added to)."""
        idx = torch.randint(0, 64, (2, 12))
        for name in ('flat', 'toeplitz', 'recurrent', 'transformer', 'linear_attention', 'hybrid'):
            model = tiny_model(name)
            dec = sample.Decoder(model, 2)
            with torch.no_grad():
                full = model(idx)[0]
                dec.prefill(torch.randint(0, 64, (2, 9)))
                dec.step(torch.randint(0, 64, (2, 1)))
                got = torch.stack([dec.prefill(idx[:, :5])] + [dec.step(idx[:, t:t + 1]) for t in range(5, 12)],
                                  1)
            with self.subTest(variant=name):
                torch.testing.assert_close(got, full[:, 4:], atol=1e-5, rtol=1e-5)

    def test_a_step_of_t_tokens_advances_t(self):
        """step(idx [B, t]) reads t tokens and moves the position by t, eager and compiled (a step of more
        than one token runs eager): the logits after it, and after the next token, are the forward's."""
        model = tiny_model('recurrent')
        idx = torch.randint(0, 64, (2, 12))
        with torch.no_grad():
            full = model(idx)[0]
        for compiled in (False, True):
            torch._dynamo.reset()
            dec = sample.Decoder(model, 2, compile=compiled, backend='eager')
            dec.prefill(idx[:, :4])
            with self.subTest(compiled=compiled):
                torch.testing.assert_close(dec.step(idx[:, 4:7]), full[:, 6], atol=1e-5, rtol=1e-5)
                self.assertEqual(dec.pos, 7)
                torch.testing.assert_close(dec.step(idx[:, 7:8]), full[:, 7], atol=1e-5, rtol=1e-5)


class TestMigration(unittest.TestCase):

    def test_older_names_load_with_the_same_logits(self):
        """A checkpoint written with the older names (model_config and settings 'mixing': 'dense' or
        'recurrent', mixing_init 'decay', the recurrent mixing's decay_logit) reads as today's
        (loading.read_checkpoint) and gives the same logits."""
        idx = torch.randint(0, 64, (1, 10))
        tmp = tempfile.mkdtemp()
        for name, old_mixing in (('flat', 'dense'), ('recurrent', 'recurrent')):
            model = tiny_model(name)
            cfg = {k: v for k, v in vars(model.cfg).items() if k != 'token_mixing'}
            cfg.update(mixing=old_mixing, mixing_init='decay')
            state = {k.replace('a_logit', 'decay_logit'): v for k, v in model.state_dict().items()}
            path = os.path.join(tmp, f'{name}.pt')
            torch.save({'model': state, 'model_config': cfg, 'config': dict(cfg), 'step': 1}, path)
            ckpt = loading.read_checkpoint(path)
            with self.subTest(variant=name):
                self.assertEqual(ckpt['model_config']['token_mixing'], model.cfg.token_mixing)
                self.assertEqual((ckpt['model_config']['mixing_init'], ckpt['config']['mixing_init']), ('average',) * 2)
                again = mixer.build_model(mixer.ModelConfig(**ckpt['model_config'])).eval()
                again.load_state_dict(ckpt['model'])
                with torch.no_grad():
                    torch.testing.assert_close(again(idx)[0], model(idx)[0])

    def test_kernel_hybrid_and_linear_read_as_their_new_names(self):
        """A checkpoint written before issue 88's renames (the settings 'kernel' and 'hybrid', the variant
        'linear') reads with feature_kernel, hybrid_form and 'linear_mixer' in its model_config and settings
        (loading.read_checkpoint; the variant named 'kernel' stays 'kernel') and gives the same logits."""
        idx = torch.randint(0, 64, (1, 10))
        tmp = tempfile.mkdtemp()
        old_names = {'feature_kernel': 'kernel', 'hybrid_form': 'hybrid'}
        for name, old_variant in (('kernel', 'kernel'), ('hybrid_parallel', 'hybrid_parallel'),
                                  ('linear_mixer', 'linear')):
            model = tiny_model(name)
            cfg = {old_names.get(k, k): v for k, v in vars(model.cfg).items()}
            path = os.path.join(tmp, f'{name}.pt')
            torch.save({'model': model.state_dict(), 'model_config': cfg,
                        'config': {**cfg, 'variant': old_variant}, 'step': 1}, path)
            ckpt = loading.read_checkpoint(path)
            with self.subTest(variant=name):
                for saved in (ckpt['model_config'], ckpt['config']):
                    self.assertFalse({'kernel', 'hybrid'} & set(saved))
                    self.assertEqual((saved['feature_kernel'], saved['hybrid_form']),
                                     (model.cfg.feature_kernel, model.cfg.hybrid_form))
                self.assertEqual(ckpt['config']['variant'], name)
                again = mixer.build_model(mixer.ModelConfig(**ckpt['model_config'])).eval()
                again.load_state_dict(ckpt['model'])
                with torch.no_grad():
                    torch.testing.assert_close(again(idx)[0], model(idx)[0], atol=0, rtol=0)


def traced(call):
    """The project's functions (files of the repository but tests/) that call() passes through, in the order
    first entered (sys.setprofile) -> list of (file relative to the root, qualified name)."""
    seen = []

    def profile(frame, event, arg):
        path = frame.f_code.co_filename
        if event == 'call' and path.startswith(ROOT) and not path.startswith(os.path.join(ROOT, 'tests')):
            name = (os.path.relpath(path, ROOT), frame.f_code.co_qualname)
            if name not in seen:
                seen.append(name)
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


class TestReadingPath(unittest.TestCase):
    """The teaching layer as a student follows it: one forward pass with targets (logits and loss) and one
    eager decode step (sample.Decoder.step after a prefill), traced."""

    def paths(self, name):
        """(forward path, decode step path) of a tiny model of variant `name`, each traced()'s list."""
        model = tiny_model(name)
        idx = torch.randint(0, 64, (2, 12))
        dec = sample.Decoder(model, 2)
        dec.prefill(idx[:, :5])
        return traced(lambda: model(idx, idx)), traced(lambda: dec.step(idx[:, 5:6]))

    def test_the_flat_mixer_reads_in_mixer_py(self):
        """Flat: its forward through at most 8 functions in at most 2 files, its decode step through at most
        10, none of either in attention.py (the baselines' file). Toeplitz, recurrent and transformer: at
        most 2 more than the flat mixer's on each path."""
        flat = self.paths('flat')
        for path, most in zip(flat, (8, 10)):
            files = {f for f, _ in path}
            with self.subTest(path=' > '.join(q for _, q in path)):
                self.assertLessEqual(len(path), most)
                self.assertNotIn('attention.py', files)
        self.assertLessEqual(len({f for f, _ in flat[0]}), 2)
        for name in ('toeplitz', 'recurrent', 'transformer'):
            for path, of_flat in zip(self.paths(name), flat):
                with self.subTest(variant=name, path=' > '.join(q for _, q in path)):
                    self.assertLessEqual(len(path), len(of_flat) + 2)


def imports(path):
    """The modules a Python file imports, anywhere in it (a function's imports too) -> set of dotted names."""
    with open(os.path.join(ROOT, path), encoding='utf-8') as f:
        tree = ast.parse(f.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f'{node.module}.{a.name}' for a in node.names}
    return names


class TestLayers(unittest.TestCase):

    def test_the_teaching_files_fit_a_laptop_screen(self):
        """No line of the teaching files (mixer.py, attention.py, train.py, sample.py, retrieval.py,
        data/prepare.py) is over 110 characters: a student reads them on a laptop screen."""
        for path in ('mixer.py', 'attention.py', 'train.py', 'sample.py', 'retrieval.py', 'data/prepare.py'):
            with open(os.path.join(ROOT, path), encoding='utf-8') as f:
                long = [n for n, line in enumerate(f.read().splitlines(), 1) if len(line) > 110]
            with self.subTest(path=path):
                self.assertEqual(long, [], 'lines over 110 characters')

    def test_what_each_layer_imports(self):
        """mixer.py and attention.py import torch, einops and each other only (no harness module); data/
        imports nothing of experiments/ (the tokenizer.json conversion is data/tokenizer.py's)."""
        for path in ('mixer.py', 'attention.py'):
            with self.subTest(path=path):
                self.assertEqual({n.split('.')[0] for n in imports(path)} - {'torch', 'einops', 'math', 'functools',
                                                                             'dataclasses', 'sys', 'mixer', 'attention'},
                                 set())
        for f in sorted(os.listdir(os.path.join(ROOT, 'data'))):
            if f.endswith('.py'):
                with self.subTest(path=f'data/{f}'):
                    self.assertEqual({n for n in imports(f'data/{f}') if n.startswith('experiments')}, set())

    def test_an_autoencoders_encoder_sees_positions(self):
        """With learned positions (gpt, posenc) the encoder adds them as the language model does: one token
        repeated 5 and 9 times embeds differently (without them attention over equal vectors could not tell).
        An autoencoder saved before its encoder had positions (no 'wpe') reads with wpe = 0: its own logits."""
        idx = torch.full((1, 9), 7)
        for name in ('gpt', 'posenc'):
            model = tiny_model(name, task='autoencode')
            with self.subTest(variant=name), torch.no_grad():
                self.assertIsNotNone(model.wpe)
                self.assertGreater((model.encode(idx[:, :5]) - model.encode(idx)).abs().max().item(), 1e-3)
        with torch.no_grad():
            model.wpe.zero_()
            want = model(idx)[0]
        state = {k: v for k, v in model.state_dict().items() if k != 'wpe'}
        path = os.path.join(tempfile.mkdtemp(), 'old.pt')
        torch.save({'model': state, 'model_config': vars(model.cfg), 'config': {}, 'step': 1}, path)
        ckpt = loading.read_checkpoint(path)
        again = mixer.build_model(mixer.ModelConfig(**ckpt['model_config'])).eval()
        again.load_state_dict(ckpt['model'])
        with torch.no_grad():
            torch.testing.assert_close(again(idx)[0], want)


if __name__ == '__main__':
    unittest.main()
