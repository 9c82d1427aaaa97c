"""The tokenizer: a byte-level BPE (GPT-2's pre-tokenisation, <|endoftext|> its own id) trained on the
stories, and tiktoken's rank file, which data/prepare.py writes, checkpoints embed and everything loads.

    ranks = train_bpe(stories, 4096)           # {token bytes: rank}: the 256 bytes, then the merges
    save_tokenizer(ranks, 'tokenizer.tiktoken')
    enc = load_tokenizer('tokenizer.tiktoken')  # a tiktoken.Encoding, <|endoftext|> = 4095 (vocab_size - 1)
"""
import base64
import hashlib
import heapq
import json
import os
import sys
import time
from collections import Counter

import regex
import tiktoken

from harness.cli import one_line

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


# ----------------------------------------------------------------------------- a Hugging Face tokenizer.json
# read as a rank file (experiments/convert.py's import of the paper's model, data/prepare.py --tokenizer)

# Texts both tokenizers must split alike (the import checks them; tests add real stories)
PROBES = ('Once upon a time, there was a little girl named Lily. She loved to play outside!',
          '  two  spaces,\ttabs\t\tand\n\nnew lines \n  \n', 'digits 0 12 345 6789 3.14 1,000,000 2024-09-03',
          "It's, I'm, you're, we've, they'll, he'd, DON'T", 'caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e '
          '\U0001F642 \u00df \u0416\u0436 \u00a0nbsp', 'end<|endoftext|>start <|endoftext|>\n', '   ', '')



class ConvertError(ValueError):
    """An input that cannot be converted (the message is one line, naming what and why)."""



def byte_alphabet():
    """GPT-2's byte-level alphabet, the characters a byte-level tokenizer.json writes bytes as -> {byte
    (int): char}, in byte order: the printable Latin-1 bytes stand for themselves, the other 68, in byte
    order, for chr(256), chr(257), ..."""
    hidden = iter(range(256, 512))
    return {b: chr(b) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255 else chr(next(hidden))
            for b in range(256)}


def bpe_split(piece, ranks):
    """tiktoken's merge rule on bytes `piece`: merge the adjacent pair whose concatenation has the lowest
    rank in `ranks` ({bytes: int}; leftmost first) until none has one -> list of bytes."""
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        found = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:])) if a + b in ranks]
        if not found:
            break
        _, i = min(found)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


def check_split(spec):
    """Raise ConvertError (one line) unless the tokenizer.json dict `spec` splits text as this project's
    tokenizer can: a BPE model without dropout, affixes or byte fallback, the ByteLevel pre-tokenizer with
    GPT-2's regex and no prefix space, no normalizer."""
    model, pre, norm = (spec.get(k) or {} for k in ('model', 'pre_tokenizer', 'normalizer'))
    for name, part in (('model', model), ('pre_tokenizer', pre), ('normalizer', norm)):
        if not isinstance(part, dict):
            raise ConvertError(f"tokenizer.json's {name} is a JSON {json_type(part)}, not an object")
    if model.get('type') != 'BPE':
        raise ConvertError(f"tokenizer.json's model is {model.get('type')!r}, not a BPE; only a byte-level "
                           'BPE converts to a rank file')
    for key, off in (('dropout', (None, 0, 0.0)), ('continuing_subword_prefix', (None, '')),
                     ('end_of_word_suffix', (None, '')), ('byte_fallback', (None, False))):
        if model.get(key) not in off:
            raise ConvertError(f"tokenizer.json's BPE has {key}={model[key]!r}; a rank file has no such option")
    if pre.get('type') != 'ByteLevel' or pre.get('add_prefix_space') or not pre.get('use_regex', True):
        raise ConvertError(f"tokenizer.json's pre-tokenizer is {json.dumps(pre) if pre else None}, not ByteLevel "
                           "(add_prefix_space=false, use_regex=true): not byte-level or not GPT-2's split")
    if spec.get('normalizer') is not None:
        raise ConvertError(f"tokenizer.json has a normalizer ({norm.get('type')}); this project's "
                           'tokenizer encodes the text as it is')


def json_type(value):
    """The JSON name of a parsed JSON value's type: 'string', 'number', 'array', 'object', 'boolean', 'null'."""
    names = {str: 'string', bool: 'boolean', int: 'number', float: 'number', list: 'array', dict: 'object'}
    return 'null' if value is None else names.get(type(value), type(value).__name__)


def tokenizer_ids(spec):
    """The ids of a tokenizer.json dict: {token: id} of its vocabulary and added tokens. Raises ConvertError
    (one line) for a vocabulary that is not an object of integer ids, added tokens that are not a list of
    objects, an added token other than <|endoftext|> or none, or ids that are not 0..N-1, each once."""
    vocab, added = spec['model'].get('vocab', {}), spec.get('added_tokens') or []
    if not isinstance(vocab, dict):
        raise ConvertError(f"tokenizer.json's vocab is a JSON {json_type(vocab)}, not an object of token: id")
    for tok, i in vocab.items():
        if not isinstance(i, int) or isinstance(i, bool):
            raise ConvertError(f"tokenizer.json's vocab gives {tok!r} the id {i!r}, not an integer")
    if not isinstance(added, list) or not all(isinstance(t, dict) for t in added):
        raise ConvertError("tokenizer.json's added_tokens is not a list of objects ({\"id\": ..., \"content\": ...})")
    ids, eot = dict(vocab), False
    for tok in added:
        if not isinstance(tok.get('id'), int) or isinstance(tok.get('id'), bool):
            raise ConvertError(f"tokenizer.json's added token {tok.get('content')!r} has the id {tok.get('id')!r}, "
                               'not an integer')
        if tok.get('content') != EOT:
            raise ConvertError(f"tokenizer.json's added token {tok.get('content')!r} (id {tok.get('id')}) has no "
                               f"place in this project's tokenizer, whose one special token is {EOT}")
        if ids.setdefault(EOT, tok.get('id')) != tok.get('id'):
            raise ConvertError(f'tokenizer.json gives {EOT} two ids, {ids[EOT]} and {tok.get("id")}')
        eot = True
    if not eot:
        raise ConvertError(f"tokenizer.json has no {EOT} special token; this project's tokenizer needs it")
    if sorted(ids.values()) != list(range(len(ids))):
        raise ConvertError(f"tokenizer.json's {len(ids)} ids are not 0..{len(ids) - 1}, each once")
    return ids


def convert_tokenizer(spec):
    """A byte-level BPE tokenizer.json (its parsed dict) -> (the rank file's text, str; hf_ids, list of V int:
    the tokenizer.json id of each of this project's ids 0..V-1). Ranks: the 256 bytes (rank = byte value),
    each merge in order (256..), <|endoftext|> V - 1. tiktoken merges the pair whose concatenation has the
    lowest rank, so a merge converts only if the ranks before it split its token into exactly its two
    halves. Raises ConvertError (one line, naming the token or merge) otherwise, for a split check_split
    refuses, a byte missing from the vocabulary, or a vocabulary token no merge makes."""
    check_split(spec)
    ids, alphabet = tokenizer_ids(spec), byte_alphabet()
    char_byte = {c: b for b, c in alphabet.items()}
    ranks, hf_ids = {}, []
    for b, c in alphabet.items():              # in byte order
        if c not in ids:
            raise ConvertError(f'tokenizer.json lacks the byte 0x{b:02x} ({c!r}; trained without '
                               'ByteLevel.alphabet()): a text holding it would have no token')
        ranks[bytes([b])] = b
        hf_ids.append(ids[c])
    merges = spec['model'].get('merges', [])
    if not isinstance(merges, list):
        raise ConvertError(f"tokenizer.json's merges are a JSON {json_type(merges)}, not a list of pairs "
                           '("a b" or ["a", "b"])')
    for k, merge in enumerate(merges):
        try:
            a, b = merge.split(' ') if isinstance(merge, str) else merge
            if not (isinstance(a, str) and isinstance(b, str) and a and b):
                raise TypeError('not two tokens')
            ta, tb = (bytes(char_byte[c] for c in s) for s in (a, b))
        except (ValueError, TypeError, KeyError):
            raise ConvertError(f'tokenizer.json merge {k} {merge!r} is not a pair of byte-level tokens') from None
        where = f'tokenizer.json merge {k} ({a} {b})'
        if ta + tb in ranks:
            raise ConvertError(f'{where} makes {a + b!r} a second time: a rank file ranks a token once')
        split = bpe_split(ta + tb, ranks)
        if split != [ta, tb]:
            raise ConvertError(f'{where} is not expressible as a rank: the ranks before it split {a + b!r} into '
                               f'{[t.decode("utf-8", "replace") for t in split]}')
        if a + b not in ids:
            raise ConvertError(f'{where} makes {a + b!r}, which its vocabulary lacks')
        ranks[ta + tb] = len(ranks)
        hf_ids.append(ids[a + b])
    hf_ids.append(ids[EOT])
    made = set(hf_ids)
    for tok, i in ids.items():
        if i not in made:
            raise ConvertError(f"tokenizer.json's token {tok!r} (id {i}) is made by no merge and is no byte")
    text = ''.join(f'{base64.b64encode(t).decode()} {r}\n' for t, r in ranks.items())
    return text, hf_ids


def check_same_tokens(path, enc, hf_ids, texts=PROBES):
    """Raise ConvertError (one line) unless the converted tokenizer `enc` (tiktoken.Encoding) and the
    tokenizer.json at `path` (read by `tokenizers`) split each of `texts` into the same tokens:
    hf_ids[enc's ids] (hf_ids from convert_tokenizer: V ints) == its ids (add_special_tokens=False).
    Without `tokenizers` installed: ConvertError saying so (an unchecked conversion is not made)."""
    try:
        from tokenizers import Tokenizer        # here: only this check needs it
    except ImportError as e:
        raise ConvertError('checking the conversion of a tokenizer.json needs the tokenizers package, which '
                           f'does not import ({one_line(e)}): pip install tokenizers') from None
    try:
        hf = Tokenizer.from_file(path)
    except Exception as e:                      # tokenizers raises its own exception types
        raise ConvertError(f'tokenizers cannot read {path} ({one_line(e)})') from None
    for text in texts:
        ours = [int(hf_ids[i]) for i in enc.encode(text, allowed_special='all')]
        theirs = hf.encode(text, add_special_tokens=False).ids
        if ours != theirs:
            raise ConvertError(f'the converted tokenizer splits {text[:40]!r} otherwise than {path} (ids '
                               f'{ours[:8]} against {theirs[:8]}): not convertible')


def read_tokenizer_json(path):
    """A Hugging Face tokenizer.json file -> (tiktoken.Encoding, its rank file's text, hf_ids: list of int,
    the tokenizer.json id of each id 0..V-1 of the Encoding); checked on PROBES. Raises ConvertError (one
    line): a missing or unreadable file, one convert_tokenizer refuses."""
    if not os.path.isfile(path):
        raise ConvertError(f'--tokenizer {path} ' + ('is a folder; give its tokenizer.json' if os.path.isdir(path)
                                                     else 'not found'))
    try:
        with open(path, encoding='utf-8') as f:
            spec = json.load(f)
        if not isinstance(spec, dict) or not isinstance(spec.get('model'), dict):
            raise ValueError('not a tokenizers JSON (no "model")')
    except (OSError, ValueError, RecursionError) as e:       # RecursionError: lists nested thousands deep
        raise ConvertError(f'cannot read the tokenizer {path} ({one_line(e)})') from None
    text, hf_ids = convert_tokenizer(spec)
    enc = tokenizer_from_text(text, f'tokenizer converted from {path}')
    check_same_tokens(path, enc, hf_ids)
    return enc, text, hf_ids


def file_sha256(path):
    """Hex sha256 digest (str) of a file's bytes, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


tokenizer_sha256 = file_sha256   # the tokenizer file's identity in meta.json and checkpoints


if __name__ == "__main__":
    print("tokenizer.py: error: the tokenizer's module, not a command: python data/prepare.py trains one", file=sys.stderr)
    sys.exit(2)
