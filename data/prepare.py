"""
Prepare TinyStories for training: train a byte-level BPE tokenizer on the
training text, encode both splits and write them as uint16 token streams.

    python data/prepare.py                       # download the two .txt files
    python data/prepare.py --train ../shared/data/tinystories/train.txt \\
                           --valid ../shared/data/tinystories/valid.txt

Outputs in --out (default data/tinystories next to this file):
    tokenizer.tiktoken  tiktoken rank file: "base64(token bytes) rank" per line
    train.bin, val.bin  uint16 token ids, each story followed by <|endoftext|>
    meta.json           vocab_size, eot_id, tokenizer sha256, per-split counts

Tokenizer: ranks 0..255 are the single bytes, merges get ranks 256.., and
<|endoftext|> is the special token vocab_size-1 (vocab_size-257 merges).
Bits per byte = (mean nats per token) / ln 2 / bytes_per_token.
All outputs are written to temporary names and renamed only at the end, so a
failed run never leaves a half-written file behind.
"""
import argparse
import base64
import hashlib
import heapq
import json
import os
import sys
import time
import urllib.request
from collections import Counter

import numpy as np
import regex
import tiktoken

EOT = "<|endoftext|>"
GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
URL = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/"
DATA_DIR = os.path.dirname(os.path.abspath(__file__))


def split_stories(text):
    """Split text on <|endoftext|> into a list of stripped, non-empty stories (str).
    A text without any separator is returned as one story, with a warning on stderr."""
    if EOT not in text:
        print("prepare.py: warning: no <|endoftext|> separator found, "
              "treating the whole text as one story", file=sys.stderr)
    return [s.strip() for s in text.split(EOT) if s.strip()]


def train_bpe(text_or_stories, vocab_size, verbose=False):
    """Train a byte-level BPE on a str (split on <|endoftext|>) or a list of stories.
    Returns mergeable ranks {token bytes: rank} with exactly vocab_size-1 entries:
    the 256 single bytes (rank = byte value) and the merges in order (256..);
    rank vocab_size-1 is left for <|endoftext|>. Raises ValueError if vocab_size
    is out of range or the text runs out of pairs to merge before that."""
    if not 257 <= vocab_size <= 65536:
        raise ValueError(f"vocab_size must be in [257, 65536], got {vocab_size}")
    t0 = time.time()
    stories = text_or_stories.split(EOT) if isinstance(text_or_stories, str) else text_or_stories
    pat = regex.compile(GPT2_PAT)
    counts = Counter()
    for s in stories:
        counts.update(pat.findall(s))
    words = [list(w.encode("utf-8")) for w in counts]  # unique pre-tokens as token ids
    freqs = list(counts.values())

    # pair -> total count (weighted by word frequency), pair -> indices of words holding it
    pair_counts, where = Counter(), {}
    for i, w in enumerate(words):
        for p in zip(w, w[1:]):
            pair_counts[p] += freqs[i]
            where.setdefault(p, set()).add(i)
    heap = [(-c, p) for p, c in pair_counts.items()]  # ties: smallest pair of ids first
    heapq.heapify(heap)

    vocab = [bytes([b]) for b in range(256)]  # id -> token bytes
    ranks = {tok: i for i, tok in enumerate(vocab)}  # token bytes -> id
    n_merges = 0
    while len(vocab) < vocab_size - 1:
        # pop the best pair, skipping heap entries whose count is stale
        while heap:
            negc, pair = heapq.heappop(heap)
            if pair_counts.get(pair, 0) == -negc:
                break
        else:
            raise ValueError(f"training text too small: only {len(vocab)} tokens "
                             f"could be made, vocab_size {vocab_size} asked for")
        a, b = pair
        merged = vocab[a] + vocab[b]
        new_id = ranks.get(merged)  # same bytes made by another pair: reuse that token
        if new_id is None:
            new_id = len(vocab)
            vocab.append(merged)
            ranks[merged] = new_id
        n_merges += 1
        changed = set()
        for i in where.pop(pair):
            w, f = words[i], freqs[i]
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(new_id)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            old_pairs, new_pairs = Counter(zip(w, w[1:])), Counter(zip(out, out[1:]))
            for p, n in old_pairs.items():
                pair_counts[p] -= n * f
                changed.add(p)
                if p not in new_pairs and p != pair:
                    where[p].discard(i)
            for p, n in new_pairs.items():
                pair_counts[p] += n * f
                changed.add(p)
                where.setdefault(p, set()).add(i)
            words[i] = out
        for p in changed:
            c = pair_counts[p]
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                del pair_counts[p]
                where.pop(p, None)
        n_new = len(vocab) - 256
        if verbose and new_id == len(vocab) - 1 and (n_new % 500 == 0 or n_new == vocab_size - 257):
            print(f"bpe: {n_new}/{vocab_size - 257} merges ({n_merges} pairs merged, "
                  f"{len(words)} unique words), {time.time() - t0:.1f}s")
    return ranks


def save_tokenizer(ranks, path):
    """Write mergeable ranks to path in tiktoken's format, one "base64 rank" line per token."""
    with open(path, "w", encoding="ascii") as f:
        for tok, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(tok).decode()} {r}\n")


def load_tokenizer(path):
    """Load a tokenizer.tiktoken file as a tiktoken.Encoding (GPT-2 regex,
    <|endoftext|> = vocab_size-1, n_vocab = vocab_size = number of lines + 1).
    Parses the file itself rather than with tiktoken.load.load_tiktoken_bpe, which
    caches files by path in a temp dir and can return a stale copy of a rewritten
    file; the format is the same. Raises FileNotFoundError if path does not exist
    and ValueError if the file is malformed (bad line, duplicate, ranks not 0..n-1,
    single bytes not ranked by byte value)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    ranks = {}
    with open(path, "rb") as f:
        for n, line in enumerate(f.read().splitlines(), 1):
            if not line.strip():
                continue
            try:
                tok, r = line.split()
                ranks[base64.b64decode(tok, validate=True)] = int(r)
            except ValueError as e:
                raise ValueError(f"malformed tokenizer file {path}, line {n}: {line[:60]!r}") from e
    if sorted(ranks.values()) != list(range(len(ranks))) or len(ranks) < 256 or \
            any(ranks.get(bytes([b])) != b for b in range(256)):
        raise ValueError(f"malformed tokenizer file {path}: ranks must be 0..n-1 with "
                         "the 256 single bytes first (rank = byte value), no duplicates")
    vocab_size = len(ranks) + 1
    return tiktoken.Encoding(f"tinystories-bpe-{vocab_size}", pat_str=GPT2_PAT,
                             mergeable_ranks=ranks, special_tokens={EOT: vocab_size - 1},
                             explicit_n_vocab=vocab_size)


def file_sha256(path):
    """Hex sha256 digest (str) of a file's bytes, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


tokenizer_sha256 = file_sha256   # the tokenizer file's identity in meta.json and checkpoints


def download(name, raw_dir):
    """Download URL+name into raw_dir (skipped if already there), via a .part file
    renamed when complete. Returns the local path; raises OSError on failure."""
    path = os.path.join(raw_dir, name)
    if os.path.exists(path):
        return path
    os.makedirs(raw_dir, exist_ok=True)
    tmp = path + ".part"
    try:
        with urllib.request.urlopen(URL + name, timeout=30) as r, open(tmp, "wb") as f:
            total, done = int(r.headers.get("Content-Length") or 0), 0
            while chunk := r.read(1 << 20):
                f.write(chunk)
                done += len(chunk)
                pct = f" ({100 * done / total:.1f}%)" if total else ""
                print(f"\rdownloading {name}: {done / 1e6:.1f} MB{pct}", end="", flush=True)
        print()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def read_stories(path):
    """Read a UTF-8 text file and return its stories (see split_stories). Raises
    FileNotFoundError, ValueError if not UTF-8 or no non-empty story."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"file not found: {path}")
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not valid UTF-8 (byte offset {e.start})") from None
    stories = split_stories(text)
    if not stories:
        raise ValueError(f"{path} has no text (empty file or only separators)")
    return stories


def encode_split(enc, stories, chunk=10_000):
    """Encode stories, each followed by <|endoftext|>; returns a uint16 numpy array.
    Works through `chunk` stories at a time so the full 2 M-story split never
    holds more than one chunk of Python ints."""
    parts = []
    for start in range(0, len(stories), chunk):
        ids = []
        for toks in enc.encode_ordinary_batch(stories[start:start + chunk], num_threads=os.cpu_count() or 1):
            ids.extend(toks)
            ids.append(enc.eot_token)
        arr = np.array(ids, dtype=np.int64)
        assert arr.max() < 65536, "token ids do not fit in uint16"
        parts.append(arr.astype(np.uint16))
    return np.concatenate(parts)


def bpe_sample(stories, max_bytes):
    """The leading stories up to about max_bytes of UTF-8 text (all if max_bytes <= 0):
    the BPE is trained on this sample, as is usual for large corpora."""
    if max_bytes <= 0:
        return stories
    total = 0
    for n, s in enumerate(stories):
        total += len(s)
        if total > max_bytes:
            return stories[:n + 1]
    return stories


def main(argv=None):
    """Command line entry point. Returns 0 on success, 2 on bad input (one-line error)."""
    p = argparse.ArgumentParser(prog="prepare.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", help="local training text (default: download TinyStories-train.txt)")
    p.add_argument("--valid", help="local validation text (default: download TinyStories-valid.txt)")
    p.add_argument("--out", default=os.path.join(DATA_DIR, "tinystories"), help="output dir")
    p.add_argument("--vocab_size", type=int, default=4096, help="tokens incl. <|endoftext|>")
    p.add_argument("--bpe_max_bytes", type=int, default=100_000_000,
                   help="train the BPE on the first stories up to this many bytes (0: all)")
    args = p.parse_args(argv)
    t0 = time.time()
    tmps = []
    try:
        if not 257 <= args.vocab_size <= 65536:
            raise ValueError(f"--vocab_size must be in [257, 65536], got {args.vocab_size}")
        if (args.train is None) != (args.valid is None):
            raise ValueError("pass both --train and --valid, or neither (to download)")
        paths = [args.train, args.valid]
        if args.train is None:
            try:
                raw = os.path.join(args.out, "raw")
                paths = [download(f"TinyStories-{s}.txt", raw) for s in ("train", "valid")]
            except OSError as e:
                raise ValueError(f"download failed ({e}); pass --train/--valid to use local files")
        splits = {"train": read_stories(paths[0]), "val": read_stories(paths[1])}
        print(f"read {len(splits['train'])} train / {len(splits['val'])} val stories")

        ranks = train_bpe(bpe_sample(splits["train"], args.bpe_max_bytes), args.vocab_size, verbose=True)
        os.makedirs(args.out, exist_ok=True)

        def tmp(name):  # temp file in the out dir, renamed to name at the end
            tmps.append((os.path.join(args.out, f".{name}.tmp{os.getpid()}"), name))
            return tmps[-1][0]

        tok_tmp = tmp("tokenizer.tiktoken")
        save_tokenizer(ranks, tok_tmp)
        enc = load_tokenizer(tok_tmp)
        meta = {"vocab_size": enc.n_vocab, "eot_id": enc.eot_token,
                "tokenizer": "tokenizer.tiktoken", "tokenizer_sha256": tokenizer_sha256(tok_tmp)}
        for split, stories in splits.items():
            arr = encode_split(enc, stories)
            arr.tofile(tmp(f"{split}.bin"))
            nbytes = sum(len(s.encode("utf-8")) for s in stories)
            meta[split] = {"tokens": len(arr), "bytes": nbytes, "stories": len(stories),
                           "bytes_per_token": nbytes / len(arr)}
            print(f"{split}: {len(stories)} stories, {nbytes} bytes, {len(arr)} tokens, "
                  f"{nbytes / len(arr):.3f} bytes/token")
        with open(tmp("meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
        for t, name in tmps:
            os.replace(t, os.path.join(args.out, name))
        tmps.clear()
    except (OSError, ValueError) as e:
        print(f"prepare.py: error: {e}", file=sys.stderr)
        return 2
    finally:
        for t, _ in tmps:
            if os.path.exists(t):
                os.remove(t)
    print(f"wrote {args.out} in {time.time() - t0:.1f}s total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
