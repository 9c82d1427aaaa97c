"""Tests of experiments/convert.py: the paper's masked mixer imported computes the paper's logits, its
tokenizer.json converted splits real text into the same tokens, a checkpoint exported to safetensors loads
(unpickling nothing) with the same logits and the same greedy text, and bad input is one line, exit 2, with
nothing written.

The paper's model is built here from its state dict's key table (blbadger/maskedmixers,
mixer_lm/mixer_trainer_tinystories.py: LanguageMixer, MixerBlock) and run by a forward written here after
that code (paper_forward), never by the project's model: the mapping under test is the only bridge. Its
tokenizer is a byte-level BPE trained here with the `tokenizers` library on real TinyStories text.
"""

import json
import os
import shutil
import tempfile
import unittest
from unittest import mock

import torch
import torch.nn.functional as F

from harness import checkpoint, loading
from data import tokenizer
from experiments import convert
from tests.common import HAVE_TEXT, NO_TEXT, TEXT_DIR, run_in_process

D, N_CTX, N_LAYER = 16, 12, 2          # the paper's model, tiny: width, context, blocks
TRICKY = ('', ' ', '  leading and trailing  ', 'a  b   c\n\n\nd \n e', '\t\ttabs\n', 'x' * 40, '0123456789 42 3.5',
          "you're we'll it's I'M", 'caf\u00e9 \u00fcber \u0416\u0436 \u65e5\u672c \U0001F600\U0001F642 \u00a0 \u200b',
          'stop.<|endoftext|>Once', '<|endoftext|><|endoftext|>', '\r\n\r\n')


def paper_state(V, tied=False, seed=0):
    """A random state dict in the paper's layout (the issue's key table: wte, mixerblocks.N.{seq_layernorm,
    conv, patch_layernorm, patch_ff.0, patch_ff.2}, lm_head) -> {key: float tensor}. Every tensor differs
    from every other (norm gains near 1, yet apart), and the conv weight's upper triangle is large and
    nonzero, as a saved file may hold it (the paper's forward masks it)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0, around=0.0):
        return around + scale * torch.randn(*shape, generator=g)
    s = {'wte.weight': rand(V, D)}
    for i in range(N_LAYER):
        b = f'mixerblocks.{i}.'
        for norm in ('seq_layernorm', 'patch_layernorm'):
            s[f'{b}{norm}.weight'], s[f'{b}{norm}.bias'] = rand(D, scale=0.3, around=1.0), rand(D, scale=0.3)
        s[b + 'conv.weight'] = rand(N_CTX, N_CTX, 1, scale=0.3) + 10 * torch.ones(N_CTX, N_CTX, 1).triu(1)
        s[b + 'conv.bias'] = rand(N_CTX, scale=0.3)
        s[b + 'patch_ff.0.weight'], s[b + 'patch_ff.0.bias'] = rand(4 * D, D, scale=0.25), rand(4 * D, scale=0.1)
        s[b + 'patch_ff.2.weight'], s[b + 'patch_ff.2.bias'] = rand(D, 4 * D, scale=0.12), rand(D, scale=0.1)
    s['lm_head.weight'] = s['wte.weight'] if tied else rand(V, D)
    return s


def paper_forward(s, idx):
    """The paper's LanguageMixer.forward on its state dict `s`: idx long [B, N_CTX] (the paper's model reads
    exactly its context: its Conv1d's channels are positions) -> logits float [B, N_CTX, V]. Each block:
    x += conv(seq_layernorm(x)) with the conv weight's lower triangle (tril, as its forward writes it);
    x += patch_ff(patch_layernorm(x)), patch_ff Linear -> GELU -> Linear; no final norm."""
    x = F.embedding(idx, s['wte.weight'])
    for i in range(N_LAYER):
        def p(k):
            return s[f'mixerblocks.{i}.{k}']
        z = F.layer_norm(x, (D,), p('seq_layernorm.weight'), p('seq_layernorm.bias'))
        x = F.conv1d(z, torch.tril(p('conv.weight')[..., 0])[..., None], p('conv.bias')) + x
        z = F.layer_norm(x, (D,), p('patch_layernorm.weight'), p('patch_layernorm.bias'))
        x = F.linear(F.gelu(F.linear(z, p('patch_ff.0.weight'), p('patch_ff.0.bias'))), p('patch_ff.2.weight'),
                     p('patch_ff.2.bias')) + x
    return F.linear(x, s['lm_head.weight'])


_MADE = {}


def hf_tokenizer():
    """A byte-level BPE of 320 tokens (<|endoftext|> its special token, the 256 bytes, 63 merges) trained
    with the tokenizers library on the first 100 kB of the real training text, as the paper's code would
    have one, made once -> (path of its tokenizer.json, tokenizers.Tokenizer)."""
    if not HAVE_TEXT:
        raise unittest.SkipTest(NO_TEXT)
    if 'tok' not in _MADE:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        with open(os.path.join(TEXT_DIR, 'train.txt'), encoding='utf-8') as f:
            stories = [s.strip() for s in f.read(100_000).split('<|endoftext|>') if s.strip()]
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(stories, trainers.BpeTrainer(
            vocab_size=320, special_tokens=['<|endoftext|>'], show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        path = os.path.join(tempfile.mkdtemp(prefix='convert_tok_'), 'tokenizer.json')
        tok.save(path)
        _MADE['tok'] = path, tok
    return _MADE['tok']


def valid_text(size=20_000):
    """The first `size` characters of the real validation text, <|endoftext|> separators included."""
    with open(os.path.join(TEXT_DIR, 'valid.txt'), encoding='utf-8') as f:
        return f.read(size)


def files_in(folder):
    """Every name in `folder`, temporary ones included, sorted."""
    return sorted(os.listdir(folder))


class OneLine:
    def assert_one_line_error(self, r, code, msg):
        self.assertEqual(r.returncode, code, r.stdout[-500:] + r.stderr[-2000:])
        self.assertIn(msg, r.stderr)
        self.assertNotIn('Traceback', r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertTrue(r.stderr.startswith('convert.py: error: '), r.stderr)


class TestTokenizer(unittest.TestCase, OneLine):

    def setUp(self):
        self.path, self.hf = hf_tokenizer()
        with open(self.path, encoding='utf-8') as f:
            self.spec = json.load(f)

    def test_same_tokens_on_real_text(self):
        """The converted tokenizer (this project's rank file: byte values, merges, <|endoftext|> last) splits
        real stories and tricky strings into the tokenizer.json's tokens: its ids renumbered by hf_ids are
        the tokenizers library's own ids, text by text."""
        enc, _, hf_ids = convert.read_tokenizer(self.path)
        self.assertEqual(enc.n_vocab, self.hf.get_vocab_size())
        self.assertEqual(enc.encode('<|endoftext|>', allowed_special='all'), [enc.n_vocab - 1])
        texts = [valid_text(), *valid_text().split('<|endoftext|>')[:40], *TRICKY]
        for text in texts:
            ours = hf_ids[enc.encode(text, allowed_special='all')].tolist()
            self.assertEqual(ours, self.hf.encode(text, add_special_tokens=False).ids, repr(text[:60]))
            self.assertEqual(enc.decode(enc.encode(text, allowed_special='all')), text)
        self.assertGreater(len(enc.encode(valid_text(), allowed_special='all')), 4000)

    def refused(self, spec, msg):
        with self.assertRaises(tokenizer.ConvertError) as e:
            tokenizer.convert_tokenizer(spec)
        self.assertIn(msg, str(e.exception))
        self.assertEqual(len(str(e.exception).splitlines()), 1)

    def test_what_cannot_be_converted_is_refused_saying_why(self):
        """Not a BPE, not byte-level, another split (a prefix space, a normalizer), an added token other than
        <|endoftext|>, a missing byte, merges no rank file can express (a merge before its halves exist, a
        token made twice), ids that are not 0..N-1: each refused in one line saying which."""
        def changed(**kw):
            spec = json.loads(json.dumps(self.spec))
            for path, value in kw.items():
                *head, last = path.split('__')
                d = spec
                for k in head:
                    d = d[k]
                d[last] = value
            return spec
        self.refused(changed(model__type='WordPiece'), "model is 'WordPiece', not a BPE")
        self.refused(changed(pre_tokenizer={'type': 'Metaspace', 'replacement': '\u2581'}), 'not ByteLevel')
        self.refused(changed(pre_tokenizer__add_prefix_space=True), 'not ByteLevel')
        self.refused(changed(normalizer={'type': 'Lowercase'}), 'has a normalizer (Lowercase)')
        self.refused(changed(model__dropout=0.1), 'dropout=0.1')
        pad = dict(self.spec['added_tokens'][0], id=len(self.spec['model']['vocab']), content='<pad>')
        self.refused(changed(added_tokens=self.spec['added_tokens'] + [pad]), "added token '<pad>'")
        self.refused(changed(added_tokens=[]), 'no <|endoftext|> special token')
        vocab = dict(self.spec['model']['vocab'])
        merges = [m.split(' ') if isinstance(m, str) else m for m in self.spec['model']['merges']]
        late = next(k for k, (a, b) in enumerate(merges) if len(a) > 1)   # a merge whose half a merge makes
        maker = next(k for k, (a, b) in enumerate(merges) if a + b == merges[late][0])
        early = merges[:maker] + [merges[late]] + [m for k, m in enumerate(merges[maker:], maker) if k != late]
        self.refused(changed(model__merges=early), 'is not expressible as a rank')
        self.refused(changed(model__merges=merges + [merges[0]]), 'a second time')
        gone = vocab.pop('\u0100')                                    # byte 0x00, whose id leaves a gap
        self.refused(changed(model__vocab=vocab), 'each once')
        vocab = {t: i - (i > gone) for t, i in vocab.items()}        # the ids closed up: 0x00 has no token
        eot = [dict(self.spec['added_tokens'][0], id=vocab['<|endoftext|>'])]
        self.refused(changed(model__vocab=vocab, added_tokens=eot), 'lacks the byte 0x00')

    def test_a_split_that_differs_is_caught_by_encoding(self):
        """The conversion is checked against the tokenizers library itself (check_same_tokens): a mapping
        of ids with two tokens' ids exchanged splits the probe texts otherwise -> refused in one line."""
        enc, _, hf_ids = convert.read_tokenizer(self.path)
        swapped = hf_ids.clone()
        swapped[[ord('a'), ord('b')]] = swapped[[ord('b'), ord('a')]]
        with self.assertRaises(tokenizer.ConvertError) as e:
            tokenizer.check_same_tokens(self.path, enc, swapped)
        self.assertIn('splits', str(e.exception))


class TestImport(unittest.TestCase, OneLine):

    def test_same_logits_as_the_papers_model(self):
        """A state dict in the paper's layout, imported with renumbered token rows (a random permutation of
        the vocabulary), gives the paper's forward's logits (untied and tied, the mask over a nonzero upper
        triangle); a prefix of T < n_ctx tokens gives the first T positions of the full input's."""
        V = 40
        for tied in (False, True):
            state = paper_state(V, tied=tied, seed=int(tied))
            hf_ids = torch.randperm(V, generator=torch.Generator().manual_seed(1))
            model = convert.paper_to_model(state, {}, hf_ids)
            self.assertEqual((model.cfg.tie_embeddings, model.cfg.final_norm, model.cfg.n_head), (tied, False, 1))
            self.assertEqual((model.cfg.n_ctx, model.cfg.d_model, model.cfg.n_layer, model.cfg.vocab_size),
                             (N_CTX, D, N_LAYER, V))
            paper_idx = torch.randint(0, V, (3, N_CTX), generator=torch.Generator().manual_seed(2))
            ours_idx = torch.argsort(hf_ids)[paper_idx]                 # the same tokens, our ids
            with torch.no_grad():
                want = paper_forward(state, paper_idx)[..., hf_ids]
                got, _ = model(ours_idx)
                head, _ = model(ours_idx[:, :5])
            self.assertLess((got - want).abs().max().item(), 1e-4, f'tied={tied}')
            self.assertGreater(want.std().item(), 0.5)
            torch.testing.assert_close(head, want[:, :5], atol=1e-4, rtol=0)

    def test_tied_is_read_from_the_file(self):
        """Tied is what the file says: one tensor under both names (a .bin), equal data, or (safetensors'
        shared tensors) one name stored and the other in the metadata; an untied file stays untied."""
        from safetensors.torch import save_file
        V, hf_ids = 30, torch.arange(30)
        state = paper_state(V)
        self.assertFalse(convert.paper_to_model(state, {}, hf_ids).cfg.tie_embeddings)
        same = {**state, 'lm_head.weight': state['wte.weight'].clone()}
        self.assertTrue(convert.paper_to_model(same, {}, hf_ids).cfg.tie_embeddings)
        folder = tempfile.mkdtemp(prefix='convert_tied_')
        path = os.path.join(folder, 'model.safetensors')
        save_file({k: v for k, v in same.items() if k != 'lm_head.weight'}, path,
                  metadata={'lm_head.weight': 'wte.weight'})
        model = convert.paper_to_model(*convert.read_reference(folder), hf_ids)
        self.assertTrue(model.cfg.tie_embeddings)
        self.assertIs(model.lm_head.weight, model.wte.weight)

    def test_cli_import_then_sample_look_and_export(self):
        """The command line imports model.safetensors and tokenizer.json into a checkpoint that
        load_checkpoint reads with the paper's logits, sample.py and look.py run on, and whose saved settings
        are the paper's architecture; a pytorch_model.bin (torch.load, weights_only) gives the same."""
        tok_path, hf = hf_tokenizer()
        from safetensors.torch import save_file
        V = hf.get_vocab_size()
        state = paper_state(V, seed=3)
        folder = tempfile.mkdtemp(prefix='convert_cli_')
        save_file(state, os.path.join(folder, 'model.safetensors'))
        out = os.path.join(folder, 'imported', 'ckpt.pt')
        r = run_in_process('-m', 'experiments.convert', '--reference', folder, '--tokenizer', tok_path, '--out', out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('untied embeddings', r.stdout)
        model, enc, ckpt = loading.load_checkpoint(out)
        text = valid_text(400)
        paper_idx = torch.tensor([hf.encode(text, add_special_tokens=False).ids[:N_CTX]])
        ours_idx = torch.tensor([enc.encode(text, allowed_special='all')[:N_CTX]])
        _, _, hf_ids = convert.read_tokenizer(tok_path)
        self.assertEqual(hf_ids[ours_idx].tolist(), paper_idx.tolist())
        with torch.no_grad():
            got = model(ours_idx)[0][..., torch.argsort(hf_ids)]          # back to the paper's numbering
        torch.testing.assert_close(got, paper_forward(state, paper_idx), atol=1e-4, rtol=0)
        config = ckpt['config']
        self.assertEqual((ckpt['step'], config['variant'], config['n_ctx'], config['final_norm']),
                         (0, 'flat', N_CTX, False))
        self.assertNotIn('optimizer', ckpt)
        torch.save(state, os.path.join(folder, 'pytorch_model.bin'))
        bin_out = os.path.join(folder, 'from_bin.pt')
        r = run_in_process('-m', 'experiments.convert', '--reference', os.path.join(folder, 'pytorch_model.bin'),
                           '--tokenizer', tok_path, '--out', bin_out)
        self.assertEqual(r.returncode, 0, r.stderr)
        for k, v in loading.load_checkpoint(bin_out)[0].state_dict().items():
            torch.testing.assert_close(v, model.state_dict()[k], atol=0, rtol=0)
        r = run_in_process('sample.py', '--ckpt', out, '--start', 'Once upon', '--num_samples', '1',
                           '--max_new_tokens', '5', '--temperature', '0')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('(flat, step 0, 5 new tokens)', r.stdout)
        r = run_in_process('-m', 'experiments.look', '--ckpt', out, '--no_figure')
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_resume_from_an_import_starts_a_fresh_optimizer(self):
        """train.py --init_from=resume continues an imported checkpoint (no optimiser state) on data prepared
        with its tokenizer: a note says the optimiser starts fresh, the run takes its steps from the imported
        weights (not a fresh init: after two warm-up steps they are within 0.01 of the import's), at the
        paper's learning rate its saved settings give."""
        from safetensors.torch import save_file
        from data import prepare
        from tests.common import captured_output
        tok_path, hf = hf_tokenizer()
        folder = tempfile.mkdtemp(prefix='convert_resume_')
        save_file(paper_state(hf.get_vocab_size(), seed=4), os.path.join(folder, 'model.safetensors'))
        out_dir = os.path.join(folder, 'run')
        ckpt = os.path.join(out_dir, 'ckpt.pt')
        r = run_in_process('-m', 'experiments.convert', '--reference', folder, '--tokenizer', tok_path, '--out', ckpt)
        self.assertEqual(r.returncode, 0, r.stderr)
        export = os.path.join(folder, 'export')
        r = run_in_process('-m', 'experiments.convert', '--ckpt', ckpt, '--out', export)
        self.assertEqual(r.returncode, 0, r.stderr)
        text = os.path.join(folder, 'text.txt')
        with open(text, 'w', encoding='utf-8') as f:
            f.write(valid_text(30_000))
        data = os.path.join(folder, 'data')
        with captured_output() as got:
            code = prepare.main(['--train', text, '--valid', text, '--out', data,
                                 '--tokenizer', os.path.join(export, 'tokenizer.tiktoken')])
        self.assertEqual(code, 0, got.stderr)
        r = run_in_process('train.py', '--init_from=resume', f'--out_dir={out_dir}', f'--data_dir={data}',
                           '--max_iters=2', '--eval_interval=2', '--eval_windows=2', '--batch_size=2',
                           '--log_interval=1')
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        self.assertIn('note: the checkpoint holds no optimizer state (an imported model): a fresh one starts', r.stdout)
        imported, resumed = loading.read_checkpoint(os.path.join(export)), loading.read_checkpoint(ckpt)
        self.assertEqual((resumed['step'], resumed['config']['learning_rate']), (2, convert.PAPER_LR))
        for k, v in imported['model'].items():
            self.assertLess((resumed['model'][k] - v).abs().max().item(), 0.01, k)
        self.assertGreater(imported['model']['wte.weight'].std().item(), 0.5)     # not a fresh N(0, 0.02) init

    def test_bad_files_are_refused_in_one_line_and_nothing_is_written(self):
        """A truncated safetensors, a wrong shape, a missing key, the expanded layout, an unknown key, a
        model whose vocabulary is not the tokenizer's, an --out that exists (without --overwrite): one line
        naming what, exit 2, and the output folder as it was (no checkpoint, no temporary file)."""
        from safetensors.torch import save_file
        tok_path, hf = hf_tokenizer()
        V = hf.get_vocab_size()
        state = paper_state(V)
        folder = tempfile.mkdtemp(prefix='convert_bad_')
        good = os.path.join(folder, 'good.safetensors')
        save_file(state, good)
        with open(good, 'rb') as f:
            data = f.read()
        cases = {'truncated': (data[:len(data) // 2], 'damaged or not a model file'),
                 'shape': ({**state, 'mixerblocks.1.conv.weight': torch.zeros(N_CTX, N_CTX + 1, 1)},
                           'mixerblocks.1.conv.weight is torch.float32 [12, 13, 1]; expected a float tensor of shape '
                           '[12, 12, 1]'),
                 'missing': ({k: v for k, v in state.items() if k != 'mixerblocks.1.patch_layernorm.bias'},
                             'missing key mixerblocks.1.patch_layernorm.bias'),
                 'expanded': ({**{k: v for k, v in state.items() if '.conv.' not in k},
                               'mixerblocks.0.conv.0.weight': torch.zeros(N_CTX, N_CTX, 1)},
                              'unknown key mixerblocks.0.conv.0.weight (the expanded layout'),
                 'unknown': ({**state, 'norm_f.weight': torch.ones(D)}, 'unknown key norm_f.weight'),
                 'vocab': ({**state, **{k: state[k][:-1] for k in ('wte.weight', 'lm_head.weight')}},
                           f'the model has {V - 1} token rows (wte.weight) and the tokenizer {V} tokens')}
        out_folder = os.path.join(folder, 'out')
        os.makedirs(out_folder)
        for name, (content, msg) in cases.items():
            with self.subTest(name):
                path = os.path.join(folder, f'{name}.safetensors')
                if isinstance(content, bytes):
                    with open(path, 'wb') as f:
                        f.write(content)
                else:
                    save_file(content, path)
                r = run_in_process('-m', 'experiments.convert', '--reference', path, '--tokenizer', tok_path,
                                   '--out', os.path.join(out_folder, 'ckpt.pt'))
                self.assert_one_line_error(r, 2, msg)
                self.assertEqual(files_in(out_folder), [])
        with open(os.path.join(folder, 'truncated.bin'), 'wb') as f:
            f.write(b'PK\x03\x04 not a whole file')
        r = run_in_process('-m', 'experiments.convert', '--reference', os.path.join(folder, 'truncated.bin'),
                           '--tokenizer', tok_path, '--out', os.path.join(out_folder, 'ckpt.pt'))
        self.assert_one_line_error(r, 2, 'damaged or not a model file')
        mine = os.path.join(out_folder, 'mine.pt')
        with open(mine, 'w') as f:
            f.write('a file of the user')
        r = run_in_process('-m', 'experiments.convert', '--reference', good, '--tokenizer', tok_path, '--out', mine)
        self.assert_one_line_error(r, 2, 'exists; remove it, choose another path, or pass --overwrite')
        with open(mine) as f:
            self.assertEqual(f.read(), 'a file of the user')
        self.assertEqual(files_in(out_folder), ['mine.pt'])
        r = run_in_process('-m', 'experiments.convert', '--reference', good, '--tokenizer', tok_path, '--out', mine,
                           '--overwrite')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(loading.read_checkpoint(mine)['model_config']['n_ctx'], N_CTX)
        self.assertEqual(files_in(out_folder), ['mine.pt'])


class TestExport(unittest.TestCase, OneLine):

    @classmethod
    def setUpClass(cls):
        """An imported checkpoint (tied: the paper's tie_weights=True) to export."""
        from safetensors.torch import save_file
        tok_path, hf = hf_tokenizer()
        cls.folder = tempfile.mkdtemp(prefix='convert_export_')
        state = paper_state(hf.get_vocab_size(), tied=True, seed=5)
        save_file({k: v for k, v in state.items() if k != 'lm_head.weight'},
                  os.path.join(cls.folder, 'model.safetensors'), metadata={'lm_head.weight': 'wte.weight'})
        cls.ckpt = os.path.join(cls.folder, 'ckpt.pt')
        r = run_in_process('-m', 'experiments.convert', '--reference', cls.folder, '--tokenizer', tok_path,
                           '--out', cls.ckpt)
        assert r.returncode == 0, r.stderr

    def export(self, ckpt, out, *flags):
        return run_in_process('-m', 'experiments.convert', '--ckpt', ckpt, '--out', out, *flags)

    def test_round_trip_same_logits_and_greedy_text_without_unpickling(self):
        """checkpoint -> folder -> load: the same logits and the same greedy text from sample.py; the
        folder is config.json, model.safetensors (the tied matrix stored once) and tokenizer.tiktoken, and
        loading it calls neither torch.load nor pickle."""
        from safetensors import safe_open
        out = os.path.join(tempfile.mkdtemp(prefix='convert_rt_'), 'exported')
        r = self.export(self.ckpt, out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(files_in(out), sorted(convert.EXPORT_FILES))
        with safe_open(os.path.join(out, 'model.safetensors'), 'pt') as f:
            stored = set(f.keys())
        self.assertEqual(len(stored & {'wte.weight', 'lm_head.weight'}), 1, stored)
        with mock.patch('torch.load', side_effect=AssertionError('torch.load')), \
                mock.patch('pickle.load', side_effect=AssertionError('pickle')), \
                mock.patch('pickle.loads', side_effect=AssertionError('pickle')):
            model, enc, ckpt = loading.load_checkpoint(out)
        model0, enc0, ckpt0 = loading.load_checkpoint(self.ckpt)
        self.assertIs(model.lm_head.weight, model.wte.weight)
        self.assertEqual(ckpt['model_config'], ckpt0['model_config'])
        self.assertEqual(ckpt['tokenizer']['sha256'], ckpt0['tokenizer']['sha256'])
        idx = torch.tensor([enc0.encode(valid_text(300), allowed_special='all')[:N_CTX]])
        with torch.no_grad():
            torch.testing.assert_close(model(idx)[0], model0(idx)[0], atol=0, rtol=0)
        texts = []
        for path in (self.ckpt, out):
            r = run_in_process('sample.py', '--ckpt', path, '--start', 'Once upon a time', '--num_samples', '1',
                               '--max_new_tokens', '8', '--temperature', '0')
            self.assertEqual(r.returncode, 0, r.stderr)
            texts.append(r.stdout)
        self.assertEqual(texts[0], texts[1])

    def test_retrieval_and_represent_read_the_folder(self):
        """retrieval.py and experiments/represent.py take an exported folder for --ckpt (sample.py and look.py:
        the tests above): retrieval's scores from the folder are the checkpoint's, and its embedding cache
        is keyed by the folder's weights (it once hashed the --ckpt path as a file)."""
        folder = tempfile.mkdtemp(prefix='convert_cmds_')
        out = os.path.join(folder, 'exported')
        self.assertEqual(self.export(self.ckpt, out).returncode, 0)
        text = os.path.join(folder, 'stories.txt')
        with open(text, 'w', encoding='utf-8') as f:
            f.write(valid_text(20_000))
        tables = []
        for path in (self.ckpt, out):
            r = run_in_process('retrieval.py', '--ckpt', path, '--text', text, '--max_pairs', '24', '--steps', '5',
                               '--d_r', '16', '--train_n', '4', '--cache_dir', os.path.join(folder, 'cache'))
            self.assertEqual(r.returncode, 0, r.stderr[-2000:])
            tables.append([line.replace(path, 'CKPT') for line in r.stdout.splitlines() if line.startswith('| ')])
        self.assertEqual(tables[0], tables[1])
        self.assertTrue(any('CKPT' in line for line in tables[0]), tables[0])
        r = run_in_process('-m', 'experiments.represent', '--ckpt', out, '--variants', '', '--steps', '5',
                           '--windows', '1', '--positions', '2', '--depths', '1', '--T', '12')
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertIn(f'flat ({out})', r.stdout)

    def test_any_kind_exports(self):
        """Another kind (a tiny transformer, untied) goes through the same folder with the same logits."""
        from tests.common import tiny_model
        from tests.test_look import make_data, save
        folder = tempfile.mkdtemp(prefix='convert_kind_')
        tok, sha = make_data(os.path.join(folder, 'data'))
        model0 = tiny_model('transformer', tie_embeddings=False)
        save(model0, os.path.join(folder, 'ckpt.pt'), tok, sha, os.path.join(folder, 'data'), 'transformer')
        r = self.export(os.path.join(folder, 'ckpt.pt'), os.path.join(folder, 'exported'))
        self.assertEqual(r.returncode, 0, r.stderr)
        model, _, _ = loading.load_checkpoint(os.path.join(folder, 'exported'))
        idx = torch.randint(0, 64, (2, 10))
        with torch.no_grad():
            torch.testing.assert_close(model(idx)[0], model0(idx)[0], atol=0, rtol=0)

    def test_existing_out_and_damaged_folders(self):
        """An existing --out is kept without --overwrite, and with it replaced only when it is an export; a
        folder without model.safetensors keeps read_checkpoint's message; a truncated model.safetensors in an
        exported folder is one line from sample.py, exit 2."""
        parent = tempfile.mkdtemp(prefix='convert_out_')
        out = os.path.join(parent, 'exported')
        self.assertEqual(self.export(self.ckpt, out).returncode, 0)
        before = {f: os.path.getmtime(os.path.join(out, f)) for f in files_in(out)}
        self.assert_one_line_error(self.export(self.ckpt, out), 2, 'exists; remove it, choose another path, or pass '
                                   '--overwrite')
        self.assertEqual({f: os.path.getmtime(os.path.join(out, f)) for f in files_in(out)}, before)
        r = self.export(self.ckpt, out, '--overwrite')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(files_in(parent), ['exported'])            # no temporary or old folder left
        mine = os.path.join(parent, 'mine')
        os.makedirs(mine)
        with open(os.path.join(mine, 'notes.txt'), 'w') as f:
            f.write('the user\'s')
        self.assert_one_line_error(self.export(self.ckpt, mine, '--overwrite'), 2,
                                   'is not a folder this command exported')
        self.assertEqual(files_in(mine), ['notes.txt'])
        with self.assertRaisesRegex(checkpoint.CheckpointError, 'is a folder, not a checkpoint file'):
            loading.read_checkpoint(mine)
        damaged = os.path.join(parent, 'damaged')
        shutil.copytree(out, damaged)
        path = os.path.join(damaged, 'model.safetensors')
        with open(path, 'rb') as f:
            data = f.read()
        with open(path, 'wb') as f:
            f.write(data[:len(data) - 100])
        r = run_in_process('sample.py', '--ckpt', damaged, '--max_new_tokens', '2')
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn('cannot be read', r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == '__main__':
    unittest.main()
