"""The tokenizer: a byte-level BPE (GPT-2's pre-tokenisation, <|endoftext|> its own id) trained on the
stories, and tiktoken's rank file, which data/prepare.py writes, checkpoints embed and everything loads.

    ranks = train_bpe(stories, 4096)           # {token bytes: rank}: the 256 bytes, then the merges
    save_tokenizer(ranks, 'tokenizer.tiktoken')
    enc = load_tokenizer('tokenizer.tiktoken')  # a tiktoken.Encoding, <|endoftext|> = 4095 (vocab_size - 1)
"""
import base64
import hashlib
import heapq
import os
import time
from collections import Counter

import regex
import tiktoken

EOT = "<|endoftext|>"
GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def train_bpe(text_or_stories, vocab_size, verbose=False):
    """Train a byte-level BPE on a str (split on <|endoftext|>) or a list of stories -> mergeable ranks
    {token bytes: rank} with exactly vocab_size-1 entries: the 256 single bytes (rank = byte value) and the
    merges in order (256..); rank vocab_size-1 is left for <|endoftext|>. Raises ValueError if vocab_size
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
        merged = vocab[pair[0]] + vocab[pair[1]]
        new_id = ranks.get(merged)  # same bytes made by another pair: reuse that token
        if new_id is None:
            new_id = len(vocab)
            vocab.append(merged)
            ranks[merged] = new_id
        n_merges += 1
        merge_pair(pair, new_id, words, freqs, pair_counts, where, heap)
        n_new = len(vocab) - 256
        if verbose and new_id == len(vocab) - 1 and (n_new % 500 == 0 or n_new == vocab_size - 257):
            print(f"bpe: {n_new}/{vocab_size - 257} merges ({n_merges} pairs merged, "
                  f"{len(words)} unique words), {time.time() - t0:.1f}s")
    return ranks


def merge_pair(pair, new_id, words, freqs, pair_counts, where, heap):
    """Apply one BPE merge in place: `pair` (two token ids) becomes new_id (int) at each non-overlapping
    occurrence, left to right, in every word holding it. words: lists of ids (the unique pre-tokens),
    freqs: their counts; pair_counts: Counter {pair: count weighted by freqs}; where: {pair: indices of
    words holding it}; heap: heapq list of (-count, pair), changed counts pushed (older entries go
    stale), pairs at 0 dropped. Raises KeyError if `pair` is not in where."""
    a, b = pair
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


def save_tokenizer(ranks, path):
    """Write mergeable ranks to path in tiktoken's format, one "base64 rank" line per token."""
    with open(path, "w", encoding="ascii") as f:
        for tok, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(tok).decode()} {r}\n")


def check_file(path, what="file"):
    """Raise FileNotFoundError (one line) unless `path` is a file: '{what} not found: PATH', or for a
    folder IsADirectoryError ('{what} PATH is a folder, not a file'), or for '' that the path is empty."""
    if os.path.isfile(path):
        return
    if not path:
        raise FileNotFoundError(f"the {what}'s path is empty")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{what} {path} is a folder, not a file")
    raise FileNotFoundError(f"{what} not found: {path}")


def load_tokenizer(path):
    """Load a tokenizer.tiktoken file as a tiktoken.Encoding (GPT-2 regex, <|endoftext|> = vocab_size-1,
    n_vocab = number of lines + 1). Parses the file itself: tiktoken.load.load_tiktoken_bpe caches
    files by path and can return a stale copy of a rewritten file. Raises FileNotFoundError if path
    is not a file (check_file), ValueError if the file is malformed (tokenizer_from_text)."""
    check_file(path, "tokenizer file")
    with open(path, "rb") as f:
        return tokenizer_from_text(f.read(), f"tokenizer file {path}")


def tokenizer_from_text(text, where="tokenizer"):
    """A tiktoken.Encoding from the content of a tokenizer.tiktoken file (str or bytes), as load_tokenizer
    builds it (a checkpoint's embedded tokenizer too); `where` names the source in errors (str). Raises
    ValueError if the content is malformed (bad line, duplicate, ranks not 0..n-1, single bytes not ranked
    by byte value)."""
    if isinstance(text, str):
        try:
            text = text.encode("ascii")
        except UnicodeEncodeError:
            raise ValueError(f"malformed {where}: not ASCII") from None
    ranks = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            tok, r = line.split()
            ranks[base64.b64decode(tok, validate=True)] = int(r)
        except ValueError as e:
            raise ValueError(f"malformed {where}, line {n}: {line[:60]!r}") from e
    if sorted(ranks.values()) != list(range(len(ranks))) or len(ranks) < 256 or \
            any(ranks.get(bytes([b])) != b for b in range(256)):
        raise ValueError(f"malformed {where}: ranks must be 0..n-1 with "
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


if __name__ == "__main__":
    import sys
    print("tokenizer.py: error: the tokenizer's module, not a command: python data/prepare.py trains one", file=sys.stderr)
    sys.exit(2)
