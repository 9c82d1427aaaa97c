"""Tests for real scale (issue 12): data/prepare.py streams in bounded chunks, a
checkpoint carries its tokenizer, and the papers' configs build and train.

    python test_mixer.py test_scale

Real text comes from $TINYSTORIES_DIR or ../shared/data/tinystories (skipped if absent).
"""
import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np
import torch

from data import prepare
from data.tokenizer import save_tokenizer, train_bpe
from tests.common import (HAVE_TEXT, NO_TEXT, ROOT, TEXT_DIR, assert_samples, encode_split, prepared_data, run,
                          run_in_process, tiny_checkpoint)

PREPARE = os.path.join(ROOT, 'data', 'prepare.py')
EOT = prepare.EOT
_TMP = {}


def need_text():
    if not HAVE_TEXT:
        raise unittest.SkipTest(NO_TEXT)


def real_path(name):
    need_text()
    return os.path.join(TEXT_DIR, name)


def shared_tmp():
    if 'dir' not in _TMP:
        _TMP['dir'] = tempfile.mkdtemp(prefix='test_scale_')
    return _TMP['dir']


def tearDownModule():
    if 'dir' in _TMP:
        shutil.rmtree(_TMP['dir'], ignore_errors=True)
    _TMP.clear()


def slice_file(src, dst, nbytes):
    """The leading whole stories of src up to about nbytes, written to dst."""
    with open(src, encoding='utf-8') as f:
        text = f.read(nbytes)
    with open(dst, 'w', encoding='utf-8') as f:
        f.write(text[:text.rindex(EOT) + len(EOT)] + '\n')
    return dst


def tokenizer():
    """A 400-token tokenizer trained once on 200 kB of the real text: (path, Encoding)."""
    if 'tok' not in _TMP:
        with open(real_path('train.txt'), encoding='utf-8') as f:
            ranks = train_bpe(f.read(200_000), 400)
        path = os.path.join(shared_tmp(), 'tok400.tiktoken')
        save_tokenizer(ranks, path)
        _TMP['tok'] = path
    return _TMP['tok'], prepare.load_tokenizer(_TMP['tok'])


def load_json(path):
    with open(path) as f:
        return json.load(f)


# Runs prepare.py and reports its peak resident memory as the kernel's high-water mark
# of its own address space (VmHWM): ru_maxrss of a child would also count the pages of
# this (torch-sized) test process it was forked from.
_MEASURE = """import runpy, sys
sys.argv = sys.argv[1:]
code = 0
try:
    runpy.run_path(sys.argv[0], run_name='__main__')
except SystemExit as e:
    code = e.code
hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]
print('VmHWM_KB', hwm, file=sys.stderr)
sys.exit(code)
"""


def run_measured(args):
    """Run prepare.py with args -> (peak resident memory of that process in MB, stdout).
    Skips the test where /proc/self/status is missing (not Linux)."""
    if not os.path.isfile('/proc/self/status'):
        raise unittest.SkipTest('peak memory is read from /proc/self/status (Linux only)')
    r = run('-c', _MEASURE, PREPARE, *args)
    assert r.returncode == 0, r.stderr
    hwm = [l for l in r.stderr.splitlines() if l.startswith('VmHWM_KB')][0].split()[1]
    return int(hwm) / 1024, r.stdout


# ----------------------------------------------------------------------------- 1. prepare.py streams

class TestStreamingPrepare(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp(dir=shared_tmp())

    def prepare(self, *args):
        return run(PREPARE, *args)

    def test_chunked_stories_equal_whole_text_at_every_kind_of_boundary(self):
        path = real_path('valid.txt')
        with open(path, 'rb') as f:
            data = f.read()
        whole = prepare.split_stories(data.decode('utf-8'))
        sep = prepare.EOT_BYTES
        first = data.index(sep)
        seps = []                                   # (start, end) of every separator
        i = first
        while i >= 0:
            seps.append((i, i + len(sep)))
            i = data.find(sep, i + 1)
        kinds = set()
        for cb in (first, first + 5, first + len(sep), 4099):
            for b in range(cb, len(data), cb):      # where a chunk boundary falls
                k = np.searchsorted([s for s, _ in seps], b, side='right') - 1
                s, e = seps[k] if k >= 0 else (-1, -1)
                kinds.add('at separator' if b == s else 'inside separator' if s < b < e
                          else 'after separator' if b == e else 'inside story')
            st = prepare.StoryStream(path, cb)
            got = [s for chunk in st for s in chunk]
            with self.subTest(chunk_bytes=cb):
                self.assertEqual(got, whole)
                self.assertGreater(st.chunks, 100)
        self.assertEqual(kinds, {'at separator', 'inside separator', 'after separator', 'inside story'})

    def test_stream_output_byte_identical_to_whole_text_encoding(self):
        tok, enc = tokenizer()
        for name in ('train.txt', 'valid.txt'):
            with open(real_path(name), encoding='utf-8') as f:
                ref = encode_split(enc, prepare.split_stories(f.read())).tobytes()
            out = os.path.join(self.tmp, name)
            r = self.prepare('--train', real_path(name), '--valid', real_path('valid.txt'), '--out', out,
                             '--tokenizer', tok, '--chunk_bytes', '4099')
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(out, 'train.bin'), 'rb') as f:
                got = f.read()
            with self.subTest(name=name):
                self.assertEqual(len(got), len(ref))
                self.assertTrue(got == ref)
            meta = load_json(os.path.join(out, 'meta.json'))
            self.assertGreater(int(meta['train']['bytes']) // 4099, 100)   # really many chunks
            self.assertIn(' chunks', r.stdout)

    def test_tokenizer_stage_uses_the_given_tokenizer(self):
        tok, _ = tokenizer()
        out = os.path.join(self.tmp, 'out')
        va = real_path('valid.txt')
        r = self.prepare('--train', va, '--valid', va, '--out', out, '--tokenizer', tok)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn('bpe:', r.stdout)                        # no BPE trained
        with open(tok, 'rb') as a, open(os.path.join(out, 'tokenizer.tiktoken'), 'rb') as b:
            self.assertEqual(a.read(), b.read())
        meta = load_json(os.path.join(out, 'meta.json'))
        self.assertEqual(meta['vocab_size'], 400)
        self.assertEqual(meta['tokenizer_sha256'], prepare.tokenizer_sha256(tok))
        for args, msg in ((['--tokenizer', tok, '--vocab_size', '512'], 'has 400 tokens'),
                          (['--tokenizer', tok + '.missing'], 'not found')):
            r = self.prepare('--train', va, '--valid', va, '--out', os.path.join(self.tmp, 'bad'), *args)
            with self.subTest(args=args):
                self.assertEqual(r.returncode, 2)
                self.assertIn(msg, r.stderr)
                self.assertNotIn('Traceback', r.stderr)
                self.assertFalse(os.path.exists(os.path.join(self.tmp, 'bad', 'meta.json')))

    def test_bpe_trains_on_the_leading_bpe_max_bytes(self):
        """--bpe_max_bytes counts UTF-8 bytes, not characters: a first story of 3-byte characters ends the
        sample sooner than characters would."""
        src = slice_file(real_path('train.txt'), os.path.join(self.tmp, 't.txt'), 150_000)
        with open(src, encoding='utf-8') as f:
            text = '日本語の話 ' * 2000 + '\n<|endoftext|>\n' + f.read()          # 12,000 characters, 32,000 bytes
        with open(src, 'w', encoding='utf-8') as f:
            f.write(text)
        out = os.path.join(self.tmp, 'out')
        r = self.prepare('--train', src, '--valid', src, '--out', out, '--vocab_size', '300',
                         '--bpe_max_bytes', '40000', '--chunk_bytes', '5000')
        self.assertEqual(r.returncode, 0, r.stderr)
        stories = prepare.split_stories(text)
        total, n = 0, 0
        while total <= 40_000:                      # the leading stories up to 40,000 bytes
            total += len(stories[n].encode('utf-8'))
            n += 1
        sample = stories[:n]
        self.assertLess(len(sample), len(stories) / 2)
        expect = os.path.join(self.tmp, 'expect.tiktoken')
        save_tokenizer(train_bpe(sample, 300), expect)
        with open(expect, 'rb') as a, open(os.path.join(out, 'tokenizer.tiktoken'), 'rb') as b:
            self.assertEqual(a.read(), b.read())

    def test_bad_utf8_located_then_stop_or_skip(self):
        stories = [f'Story number {i} about a cat named Tom who liked fish. ' * 3 for i in range(40)]
        raw = [s.encode() for s in stories]
        raw[17] = raw[17][:50] + b'\xff' + raw[17][50:]        # story 18 has one bad byte
        blob = b''.join(s + b'\n' + prepare.EOT_BYTES + b'\n' for s in raw)
        bad_offset = blob.index(b'\xff')
        bad = os.path.join(self.tmp, 'bad.txt')
        with open(bad, 'wb') as f:
            f.write(blob)
        tok, enc = tokenizer()
        out = os.path.join(self.tmp, 'out')
        common = ['--train', bad, '--valid', real_path('valid.txt'), '--out', out, '--tokenizer', tok,
                  '--chunk_bytes', '700']
        r = self.prepare(*common)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertNotIn('Traceback', r.stderr)
        err = r.stderr.strip().splitlines()
        self.assertEqual(len(err), 1, r.stderr)
        self.assertIn(f'byte offset {bad_offset} (story 18)', err[0])
        self.assertIn('--skip_bad_utf8', err[0])
        self.assertFalse(os.path.exists(out) and os.listdir(out))

        r = self.prepare(*common, '--skip_bad_utf8')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f'story 18 skipped, not valid UTF-8 at byte offset {bad_offset}', r.stderr)
        meta = load_json(os.path.join(out, 'meta.json'))
        self.assertEqual(meta['train']['skipped_bad_utf8'], 1)
        self.assertEqual(meta['val']['skipped_bad_utf8'], 0)
        self.assertEqual(meta['train']['stories'], 39)
        kept = [s.strip() for i, s in enumerate(stories) if i != 17]
        ids = np.fromfile(os.path.join(out, 'train.bin'), dtype=np.uint16)
        self.assertEqual(enc.decode(ids.tolist()), EOT.join(kept) + EOT)

    def test_progress_reports_mb_rate_and_eta(self):
        _, enc = tokenizer()
        buf = io.StringIO()
        st = prepare.StoryStream(real_path('valid.txt'), 100_000)
        sys_stdout, sys.stdout = sys.stdout, buf
        try:
            prepare.encode_stream(enc, st, io.BytesIO(), label='val', progress_s=0)
        finally:
            sys.stdout = sys_stdout
        lines = buf.getvalue().splitlines()         # tqdm's, a line each (stdout is not a terminal here)
        self.assertGreater(len(lines), 5)
        self.assertRegex(lines[1], r'^val: \d+% \[\d\d:\d\d<\d\d:\d\d, [\d.]+/[\d.]+ MB, [\d.]+ MB/s\]$')   # ETA
        self.assertRegex(lines[-1], r'^val: 100% \[\d\d:\d\d<00:00, ([\d.]+)/\1 MB, [\d.]+ MB/s\]$')      # done
        self.assertEqual(len(set(lines)), len(lines))

    def test_progress_ended_by_an_error_or_ctrl_c_prints_no_last_line(self):
        """outputs.Progress as a context: its last line when the work ends, none when an error or a Ctrl-C ends
        it (the command's own line is then the last; tqdm printed its final state after it, at exit)."""
        from data.outputs import Progress
        for stop in (None, KeyboardInterrupt, OSError):
            name = getattr(stop, '__name__', None)              # a subtest's parameters travel as text
            with self.subTest(stop=name), contextlib.redirect_stdout(io.StringIO()) as out:
                with contextlib.suppress(KeyboardInterrupt, OSError), Progress('val', 2.0, every=600) as progress:
                    progress.update(1.0)                # its line not yet due (every 600 s)
                    if stop:
                        raise stop
                lines = out.getvalue().splitlines()
                self.assertRegex(lines[0], r'^val: 0% ')          # tqdm's first
                self.assertEqual(len(lines), 1 if stop else 2, lines)
                self.assertRegex(lines[-1], r'^val: 0% ' if stop else r'^val: 50% \[.*, 1\.0/2\.0 MB, ')

    def test_peak_memory_does_not_grow_with_input(self):
        tok, _ = tokenizer()
        src = real_path('train.txt')
        with open(src, 'rb') as f:
            data = f.read()
        small, big = os.path.join(self.tmp, 'small.txt'), os.path.join(self.tmp, 'big.txt')
        with open(small, 'wb') as f:
            f.write(data)
        with open(big, 'wb') as f:
            for _ in range(7):                      # about 39 MB
                f.write(data)
        peaks = {}
        for name, path in (('small', small), ('big', big)):
            peaks[name], _ = run_measured(
                ['--train', path, '--valid', real_path('valid.txt'), '--out', os.path.join(self.tmp, name),
                 '--tokenizer', tok, '--chunk_bytes', str(1 << 20)])
        os.remove(big)
        sizes = {n: load_json(os.path.join(self.tmp, n, 'meta.json'))['train']['bytes'] for n in peaks}
        self.assertGreater(sizes['big'], 6.9 * sizes['small'])
        # 33 MB more text: reading it whole would add well over 100 MB (bytes, str, stories, tokens)
        self.assertLess(peaks['big'] - peaks['small'], 15, peaks)
        self.assertLess(peaks['big'], 150, peaks)


# ----------------------------------------------------------------------------- 2. checkpoints that travel

class TestCheckpointTravels(unittest.TestCase):
    """sample.py from the checkpoint alone runs as a process (a fresh one: anywhere); the other
    commands here in this process (tests.common.run_in_process)."""

    @classmethod
    def setUpClass(cls):
        """tests.common's tiny checkpoint, copied alone into a folder of its own and with
        the tokenizer file it records pointing nowhere: only the embedded text can serve."""
        need_text()
        cls.tmp = tempfile.mkdtemp(dir=shared_tmp())
        with open(os.path.join(prepared_data(), 'tokenizer.tiktoken'), 'rb') as f:
            cls.tok_bytes = f.read()
        ckpt = torch.load(tiny_checkpoint(), map_location='cpu', weights_only=True)
        ckpt['tokenizer']['file'] = os.path.join(cls.tmp, 'gone', 'tokenizer.tiktoken')
        cls.alone = os.path.join(tempfile.mkdtemp(dir=cls.tmp), 'model.pt')
        torch.save(ckpt, cls.alone)
        assert os.listdir(os.path.dirname(cls.alone)) == ['model.pt']

    def test_checkpoint_embeds_tokenizer_and_its_sha256(self):
        tok = torch.load(self.alone, map_location='cpu', weights_only=True)['tokenizer']
        self.assertEqual(tok['text'].encode(), self.tok_bytes)
        self.assertEqual(tok['sha256'], hashlib.sha256(self.tok_bytes).hexdigest())

    def test_sample_from_checkpoint_alone(self):
        r = run_in_process('sample.py', '--ckpt', self.alone, '--start', 'Once upon a time', '--num_samples', '2',
                           '--max_new_tokens', '10')
        self.assertEqual(r.returncode, 0, r.stderr)
        assert_samples(self, r.stdout, 'Once upon a time', 2, 10)

    def test_retrieval_from_checkpoint_alone(self):
        text = slice_file(real_path('valid.txt'), os.path.join(self.tmp, 'ret.txt'), 60_000)
        r = run_in_process('retrieval.py', '--ckpt', self.alone, '--text', text, '--max_pairs', '40', '--steps',
                           '2', '--n_candidates', '4', '--eval_rounds', '1', '--no_cache')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('4', r.stdout)

    def test_prompt_longer_than_context_keeps_its_tail(self):
        n_ctx = torch.load(self.alone, map_location='cpu', weights_only=True)['model_config']['n_ctx']
        r = run_in_process('sample.py', '--ckpt', self.alone, '--start', 'HEAD START ' + 'word ' * 200 + 'THE END',
                           '--num_samples', '1', '--max_new_tokens', '3', '--temperature', '0')
        self.assertEqual(r.returncode, 0, r.stderr)
        warn = [l for l in r.stderr.splitlines() if 'warning' in l]
        self.assertEqual(len(warn), 1, r.stderr)
        self.assertIn(f'keeping its last {n_ctx} tokens', warn[0])
        self.assertIn('THE END', r.stdout)                   # the tail was kept, not the head
        self.assertNotIn('HEAD START', r.stdout)

    def test_old_checkpoints_and_damaged_tokenizers(self):
        from harness import checkpoint, loading
        ckpt = torch.load(self.alone, map_location='cpu', weights_only=True)
        tok_file = os.path.join(self.tmp, 'tok.tiktoken')
        with open(tok_file, 'wb') as f:
            f.write(self.tok_bytes)
        old = {**ckpt, 'tokenizer': {'file': tok_file, 'sha256': ckpt['tokenizer']['sha256']}}
        enc = loading.checkpoint_tokenizer(old)
        self.assertEqual(enc.n_vocab, ckpt['model_config']['vocab_size'])
        self.assertEqual(enc.encode_ordinary('Once upon'),
                         loading.checkpoint_tokenizer(ckpt).encode_ordinary('Once upon'))
        damaged = {**ckpt, 'tokenizer': {**ckpt['tokenizer'], 'text': ckpt['tokenizer']['text'][:-20]}}
        with self.assertRaisesRegex(checkpoint.CheckpointError, 'SHA-256'):
            loading.checkpoint_tokenizer(damaged)
        gone = {**ckpt, 'tokenizer': {'file': tok_file + '.gone', 'sha256': ckpt['tokenizer']['sha256']}}
        with self.assertRaisesRegex(checkpoint.CheckpointError, 'not found'):
            loading.checkpoint_tokenizer(gone)
        path = os.path.join(self.tmp, 'old.pt')
        torch.save(old, path)
        r = run_in_process('sample.py', '--ckpt', path, '--max_new_tokens', '3', '--num_samples', '1')
        self.assertEqual(r.returncode, 0, r.stderr)
        torch.save(damaged, path)
        r = run_in_process('sample.py', '--ckpt', path, '--max_new_tokens', '3', '--num_samples', '1')
        self.assertEqual(r.returncode, 2)
        self.assertIn('SHA-256', r.stderr)
        self.assertNotIn('Traceback', r.stderr)


# ----------------------------------------------------------------------------- 3. the papers' configs

CONFIGS = {'mixer_gpu': dict(variant='flat', d_model=1024, n_layer=8, n_ctx=512),
           'transformer_gpu': dict(variant='transformer', d_model=512, n_layer=8, n_head=4, n_ctx=512,
                                   learning_rate=5e-3),
           'hybrid_gpu': dict(variant='hybrid', d_model=512, n_layer=8, n_head=4, n_ctx=512),
           'transformer_cpu': dict(variant='transformer', d_model=128, n_layer=4, n_ctx=256,
                                   out_dir='out/transformer_cpu')}


class TestConfigs(unittest.TestCase):

    def test_transformer_cpu_is_tinystories_cpu_without_mixing_lr_mult(self):
        def settings(name):
            ns = {}
            exec(open(os.path.join(ROOT, 'config', f'{name}.py')).read(), {}, ns)
            return ns
        cpu, tr = settings('tinystories_cpu'), settings('transformer_cpu')
        self.assertNotIn('mixing_lr_mult', tr)
        self.assertEqual({k: v for k, v in cpu.items() if k not in ('mixing_lr_mult', 'out_dir')},
                         {k: v for k, v in tr.items() if k not in ('variant', 'out_dir')})

    def test_gpu_configs_keep_the_papers_tokens_per_step_in_one_compiled_micro_batch(self):
        """The GPU configs take the whole step of 128 windows of 512 tokens (65,536 tokens, the
        tokens per step the comparisons were planned with) in one micro-batch, compiled."""
        for name in ('mixer_gpu', 'transformer_gpu', 'hybrid_gpu'):
            ns = {}
            exec(open(os.path.join(ROOT, 'config', f'{name}.py')).read(), {}, ns)
            with self.subTest(config=name):
                self.assertEqual(ns['batch_size'] * ns.get('grad_accum', 1) * ns['n_ctx'], 65536)
                self.assertEqual((ns['batch_size'], ns.get('grad_accum', 1), ns.get('compile')), (128, 1, True))

    def test_each_config_builds_and_trains_two_steps(self):
        """In this process, one thread (train.py as a process: test_train, test_faults): a process each cost
        3.5 s of CPU more (torch's import and torch._dynamo's, which the optimiser's constructor makes)."""
        d = prepared_data()
        settings, outs = {}, {}
        for name, expect in CONFIGS.items():
            ns = {}
            exec(open(os.path.join(ROOT, 'config', f'{name}.py')).read(), {}, ns)
            for k, v in expect.items():
                self.assertEqual(ns.get(k), v, (name, k))
            settings[name], outs[name] = ns, tempfile.mkdtemp(dir=shared_tmp())

        def train(name):
            return run_in_process('train.py', os.path.join('config', f'{name}.py'), f'--data_dir={d}',
                                  f'--out_dir={outs[name]}', '--max_iters=2', '--batch_size=1', '--grad_accum=1',
                                  '--eval_windows=1', '--eval_interval=1000', '--warmup_iters=1', '--log_interval=1',
                                  '--device=cpu', '--save_checkpoint=False', '--compile=False',
                                  env={**os.environ, 'OMP_NUM_THREADS': '1'})
        results = {name: train(name) for name in CONFIGS}
        for name, r in results.items():
            ns, out = settings[name], outs[name]
            with self.subTest(config=name):
                self.assertEqual(r.returncode, 0, r.stderr[-2000:])
                with open(os.path.join(out, 'log.jsonl')) as f:
                    log = [json.loads(line) for line in f]
                mc = next(e for e in log if e['event'] == 'config')['model_config']
                for k in ('d_model', 'n_layer', 'n_ctx'):
                    self.assertEqual(mc[k], ns[k], k)
                self.assertEqual(mc['kind'], {'flat': 'mixer'}.get(ns['variant'], ns['variant']))
                if 'n_head' in ns or ns['variant'] != 'flat':
                    self.assertEqual(mc['n_head'], ns.get('n_head', 4))
                summary = [e for e in log if e['event'] == 'summary'][-1]
                self.assertEqual(summary['step'], 2)
                self.assertTrue(math.isfinite(summary['final_val_loss']))
            shutil.rmtree(out)


if __name__ == '__main__':
    unittest.main()
