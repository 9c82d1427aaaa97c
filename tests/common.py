"""What the test modules share: paths, the real text, tiny models, prepared data and a
tiny checkpoint made once per run, and a helper to run the project's scripts.

Real text comes from $TINYSTORIES_DIR (train.txt, valid.txt), by default
../shared/data/tinystories beside the repository; tests that need it are skipped
with the reason NO_TEXT if it is absent, and with CI=true such a skip counts as a
failure (test_mixer.summarize).
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch

import mixer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository root
TEXT_DIR = os.environ.get('TINYSTORIES_DIR', os.path.join(ROOT, '..', 'shared', 'data', 'tinystories'))
HAVE_TEXT = all(os.path.isfile(os.path.join(TEXT_DIR, f)) for f in ('train.txt', 'valid.txt'))
NO_TEXT = f'no real text: set TINYSTORIES_DIR to a folder with train.txt and valid.txt (tried {TEXT_DIR})'
torch.set_num_threads(min(2, torch.get_num_threads()))

TINY = dict(vocab_size=64, n_ctx=24, d_model=32, n_layer=2, chunk_size=8, fft_threshold=16)


def tiny_model(name, seed=0, **kw):
    """A small random model of variant `name` whose biases and per-position vectors are
    perturbed away from their init, so that every parameter matters."""
    torch.manual_seed(seed)
    model = mixer.build_model(mixer.variant_config(name, **{**TINY, **kw})).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.split('.')[-1] in ('c', 'c1', 'c2', 'v', 'w', 'W1', 'W2', 'wpe', 'wpe_dec', 'bias'):
                p.add_(0.05 * torch.randn_like(p))
    return model


def assert_samples(test, stdout, prompt, count, new_tokens):
    """sample.py's output holds `count` samples, each `new_tokens` tokens past the
    prompt (the count sample.py reads off the generated tensor) and longer than it."""
    parts = stdout.split('--- sample ')[1:]
    test.assertEqual(len(parts), count, stdout)
    for part in parts:
        header, _, text = part.partition('\n')
        test.assertIn(f'{new_tokens} new tokens)', header)
        test.assertTrue(text.startswith(prompt), text[:200])
        test.assertGreater(len(text.strip()), len(prompt), text)


def run(*args, **kw):
    """Run a project script with the current Python -> CompletedProcess (text)."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, **kw)



_DATA = {}


def prepared_data(whole=False):
    """The tests' data dir, prepared once by data/prepare.py (512-token BPE): from
    slices of the real text (400 kB train, 100 kB valid), or with whole=True from all
    of it (claims.py's retrieval rows need its 1,841 validation stories). -> path of a
    dir with train.bin, val.bin, meta.json, tokenizer.tiktoken."""
    if not HAVE_TEXT:
        raise unittest.SkipTest(NO_TEXT)
    key = 'whole' if whole else 'dir'
    if key not in _DATA:
        tmp = tempfile.mkdtemp(prefix='mixer_test_')
        src = {name: os.path.join(TEXT_DIR if whole else tmp, name) for name in ('train.txt', 'valid.txt')}
        for name, size in (('train.txt', 400_000), ('valid.txt', 100_000)) if not whole else ():
            with open(os.path.join(TEXT_DIR, name), encoding='utf-8') as f:
                text = f.read(size)
            with open(src[name], 'w', encoding='utf-8') as f:
                f.write(text[:text.rindex('<|endoftext|>')])
        out = os.path.join(tmp, 'data')
        r = run('data/prepare.py', '--train', src['train.txt'], '--valid', src['valid.txt'], '--out', out,
                '--vocab_size', '512')
        assert r.returncode == 0, r.stderr
        _DATA[key] = out
    return _DATA[key]


def tiny_checkpoint():
    """A checkpoint made once by train.py on prepared_data(): a flat mixer, d_model 32,
    2 layers, n_ctx 128, after 2 steps (still in the learning-rate warm-up, so close to
    its init, whose uniform causal mixing makes the last token's vector a bag of the
    text's words: a small but clear retrieval signal). -> path of ckpt.pt"""
    if 'tiny_ckpt' not in _DATA:
        out = os.path.join(os.path.dirname(prepared_data()), 'tiny_ckpt')
        r = run('train.py', f'--data_dir={prepared_data()}', '--d_model=32', '--n_layer=2', '--n_ctx=128',
                '--batch_size=8', '--max_iters=2', '--eval_interval=2', '--eval_windows=4', '--log_interval=2',
                f'--out_dir={out}')
        assert r.returncode == 0, r.stderr
        _DATA['tiny_ckpt'] = os.path.join(out, 'ckpt.pt')
    return _DATA['tiny_ckpt']


def read_log(out_dir):
    with open(os.path.join(out_dir, 'log.jsonl')) as f:
        return [json.loads(line) for line in f]


def cached_results(out):
    """The result.json of every job an experiment's runner cached under folder `out` -> list of paths."""
    return [os.path.join(d, 'result.json') for d, _, files in os.walk(out) if 'result.json' in files]
