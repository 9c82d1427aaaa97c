"""The prepared data as train.py and the experiments read it: the token files and meta.json that
data/prepare.py writes (data/outputs.py), checked against each other before a step is trained.

    meta, train_ids, val_ids = read_prepared('data/tinystories', n_ctx=256)
"""
import json
import os
import sys

if __name__ == "__main__":       # before numpy: a module of train.py's, not a command
    print("tokens.py: error: the prepared data's reader, not a command: python data/prepare.py --help",
          file=sys.stderr)
    sys.exit(2)

import numpy as np  # noqa: E402


def read_prepared(data_dir, n_ctx):
    """The prepared data of data_dir as train.py reads it -> (meta dict, train ids, val ids: numpy memmaps
    of meta.json's "dtype", uint16 where it names none). Raises ValueError (one line) for a missing or damaged
    meta.json, a token file that is missing, holds another number of ids than meta.json counts (a file cut
    short, or written in another dtype), or ids at or above vocab_size (a tokenizer other than meta.json's),
    or a split shorter than n_ctx + 2 tokens."""
    meta_path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(meta_path):
        raise ValueError(f"{meta_path} not found: run data/prepare.py first (or set --data_dir)")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        meta["vocab_size"], meta["val"]["bytes_per_token"], meta["tokenizer_sha256"]
        counts = {s: int(meta[s]["tokens"]) for s in ("train", "val")}
        dtype = np.dtype(meta.get("dtype", "uint16"))
        if dtype not in (np.uint16, np.uint32):
            raise ValueError(f'dtype {meta["dtype"]!r} is not uint16 or uint32')
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{meta_path} is damaged ({type(e).__name__}: {e}); run data/prepare.py again") \
            from None
    splits = []
    for split, n in counts.items():
        path = os.path.join(data_dir, f"{split}.bin")
        if not os.path.isfile(path):
            raise ValueError(f"{path} not found: run data/prepare.py first (or set --data_dir)")
        if os.path.getsize(path) != n * dtype.itemsize:
            raise ValueError(f"{path} holds {os.path.getsize(path):,} bytes, but meta.json counts {n:,} "
                             f"{dtype} ids ({n * dtype.itemsize:,} bytes): a file cut short or written "
                             "otherwise; run data/prepare.py again")
        data = np.memmap(path, dtype=dtype, mode="r") if n else np.zeros(0, dtype)
        if n and int(data.max()) >= meta["vocab_size"]:
            raise ValueError(f"{path} holds token id {int(data.max())}, but the vocabulary has "
                             f"{meta['vocab_size']} tokens (meta.json and the token files are from different "
                             "runs of data/prepare.py)")
        splits.append(data)
    if min(len(s) for s in splits) < n_ctx + 2:
        raise ValueError(f"token files are shorter than n_ctx + 2 = {n_ctx + 2} tokens")
    return meta, *splits


def token_dtype(data_dir):
    """The dtype of data_dir's token files (train.bin, val.bin) as its meta.json says: uint16, or uint32 for a
    vocabulary over 65,536 -> numpy dtype; uint16 where meta.json names none (written before "dtype") or
    cannot be read (its readers check it themselves)."""
    try:
        with open(os.path.join(data_dir, "meta.json")) as f:
            return np.dtype(json.load(f).get("dtype", "uint16"))
    except (OSError, ValueError, TypeError, AttributeError):
        return np.dtype(np.uint16)
