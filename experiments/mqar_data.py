"""MQAR's data: Zoology's multi-query associative recall task (Arora et al. 2023, HazyResearch/zoology,
zoology/data/associative_recall.py), its draws and its files, for experiments/mqar.py.

    inputs, targets = mqar(n=16_000, T=64, kv=4, vocab_size=256, seed=0)     # int64 [n, T] each
"""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print("mqar_data.py: error: mqar.py's data, not a command: python -m experiments.mqar --help", file=sys.stderr)
    sys.exit(2)

import io
import os
import zipfile

import numpy as np
import torch

from harness.cli import write_atomic
from experiments.runner import say

POWER_A = 0.01            # Zoology's train_power_a = test_power_a
FILLER = 0                # Zoology's figure-2 data (random_non_queries=False): every other position is token 0


def check_cell(T, kv, vocab_size):
    """Raise ValueError (one line) unless kv key-value pairs and their kv queries fit a sequence of
    T tokens (4 kv <= T, as Zoology asserts) and kv distinct keys and values fit each half of the
    vocabulary (keys from [1, V/2), values from [V/2, V))."""
    if kv < 1 or T < 4 * kv:
        raise ValueError(f'T={T}, kv={kv}: MQAR needs kv >= 1 and T >= 4 kv (the pairs, then room for the queries)')
    if vocab_size // 2 - 1 < kv:
        raise ValueError(f'vocab_size={vocab_size} has {max(0, vocab_size // 2 - 1)} keys, fewer than kv={kv}')


def distinct_draws(rng, n, k, low, high):
    """k distinct integers from [low, high) in each of n rows, each drawn uniformly among those not yet
    drawn (numpy's choice without replacement, one draw after another; a clash is drawn again)
    -> int64 [n, k]."""
    out = np.empty((n, k), np.int64)
    for j in range(k):
        col = rng.integers(low, high, n)
        clash = (out[:, :j] == col[:, None]).any(1)
        while clash.any():
            col[clash] = rng.integers(low, high, int(clash.sum()))
            clash = (out[:, :j] == col[:, None]).any(1)
        out[:, j] = col
    return out


def mqar(n, T, kv, vocab_size, seed, power_a=POWER_A):
    """n MQAR sequences (Arora et al. 2023, "Zoology", arXiv 2312.04927, section 4.1; as
    zoology/data/associative_recall.py builds them, filler 0) from np.random.default_rng(seed) ->
    (inputs int64 [n, T], targets int64 [n, T]): targets[i, t] is the value of the key asked at
    position t, -1 elsewhere (exactly kv answers a row). Keys: [1, V/2), values: [V/2, V), kv
    distinct of each a row; the pairs at positions 0..2kv-1 (key j at 2j, its value at 2j + 1); the
    kv queries at 2 kv + 2 g, the gaps g drawn without replacement from 0..(T - 2 kv) / 2 - 1 with
    probability proportional to (g + 1)^(power_a - 1), the j-th gap drawn asking the j-th key.
    Raises ValueError when the cell does not fit (check_cell)."""
    check_cell(T, kv, vocab_size)
    rng = np.random.default_rng(seed)
    half = vocab_size // 2
    keys = distinct_draws(rng, n, kv, 1, half)
    values = distinct_draws(rng, n, kv, half, vocab_size)
    space = (T - 2 * kv) // 2
    logp = (power_a - 1) * np.log(np.arange(1, space + 1))
    # kv gaps without replacement, each drawn with probability p among those left: the Gumbel top-k trick
    gaps = np.argsort(-(logp + rng.gumbel(size=(n, space))), axis=1, kind='stable')[:, :kv]
    rows, pos = np.arange(n)[:, None], 2 * kv + 2 * gaps
    inputs = np.full((n, T), FILLER, np.int64)
    inputs[:, 0:2 * kv:2], inputs[:, 1:2 * kv:2] = keys, values
    inputs[rows, pos] = keys
    targets = np.full((n, T), -1, np.int64)
    targets[rows, pos] = values
    return inputs, targets


def split_files(s, T, kv, seed):
    """{'train': file name, 'test': file name} of a cell (named by its cell, vocabulary, size and seed):
    train from seed, test from seed + 10 (another stream, as Zoology does)."""
    return {split: f'mqar-T{T}-kv{kv}-V{s["vocab_size"]}-n{n}-seed{sd}-{split}.npz'
            for split, n, sd in (('train', s['n_train'], seed), ('test', s['n_test'], seed + 10))}


def make_data(data_dir, s, seed):
    """Generate (once) and cache every cell's train and test split under data_dir, int16 in .npz files
    written whole (a temporary file, then os.replace); the same files serve every model. A damaged
    file is generated again -> list of the file names generated now."""
    os.makedirs(data_dir, exist_ok=True)
    made = []
    for T, kv in s['cells']:
        for split, name in split_files(s, T, kv, seed).items():
            path = os.path.join(data_dir, name)
            if os.path.isfile(path):
                try:
                    load_split(path)
                    continue
                except ValueError as e:
                    say(f'warning: {e}')
            n, sd = (s['n_train'], seed) if split == 'train' else (s['n_test'], seed + 10)
            x, y = mqar(n, T, kv, s['vocab_size'], sd)
            blob = io.BytesIO()
            np.savez(blob, inputs=x.astype(np.int16), targets=y.astype(np.int16))
            write_atomic(path, blob.getvalue())
            made.append(name)
    return made


def load_split(path):
    """A cached split -> (inputs long [n, T], targets long [n, T]); ValueError if it is damaged."""
    try:
        with np.load(path) as z:
            return torch.from_numpy(z['inputs'].astype(np.int64)), torch.from_numpy(z['targets'].astype(np.int64))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise ValueError(f'{path}: a damaged data file ({type(e).__name__}); it is generated again') from None
