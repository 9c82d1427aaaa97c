"""(query, target) pairs of texts for retrieval.py (Badger 2024, "Masked Mixers for Language Generation and
Retrieval", arXiv 2409.01482).

A pair is a dict {'query': str, 'target': str, 'cut': int or None, 'story': int}. A retrieval model must
find a query's target among N candidates: the true target and the targets of other stories. 'story' names
the story the pair came from: the train / test split is by story (split_by_story), so no story is on both
sides, and negatives never come from the query's own story. 'cut' is the character offset in the target
where the query was taken out (None for pairs read from a file).

Inverse cloze task (Lee et al. 2019; ict_pairs): the query is one sentence (split_sentences) taken out of
a story, the target is the story without it, so the query never appears in its target. The stories are
those of a prepared data dir's {split}.bin (read_data_dir_stories) or of a raw text file split on
<|endoftext|> (read_text_stories); a pairs file (read_pairs_file) instead holds {"query": ...,
"target": ...} objects, one per line. encode_pairs makes the token ids.

load_pairs makes the pairs that retrieval.py's options ask for; plan_splits splits them by story (train,
test, and training stories held out for early stopping) and fixes the candidate draws every method is
scored on (candidate_draws). Bad input raises UsageError with a one-line message.
"""

import hashlib
import json
import os
import re
import sys
from types import SimpleNamespace

import numpy as np

if __name__ == '__main__':       # before the imports that need the repository root on the path
    print("pairs.py: error: retrieval.py's pairs, not a command: python retrieval.py --help", file=sys.stderr)
    sys.exit(2)

from data.tokens import read_prepared  # noqa: E402
from data.prepare import check_file, load_tokenizer, split_stories, tokenizer_sha256  # noqa: E402


class UsageError(Exception):
    """Bad input (a missing or malformed file, too few stories): a one-line message that
    retrieval.py reports as 'retrieval.py: error: ...' with exit code 2."""


SENTENCE_END = re.compile(r'[.!?]+[\"\'\u201d\u2019)\]]*(?=\s|$)')


def split_sentences(text):
    """Sentences of `text` (str) as a list of (start, end) character spans (int), in order, whitespace
    excluded; [] for a blank text. Raises nothing. A sentence ends at a run of '.', '!' or '?' (with any
    closing quotes or brackets) followed by whitespace or the end of the text ("Mr." too); trailing text
    without such an ending is a last sentence."""
    spans, start = [], 0
    for end in [m.end() for m in SENTENCE_END.finditer(text)] + [len(text)]:   # the rest: a last sentence
        piece = text[start:end]
        s, e = end - len(piece.lstrip()), start + len(piece.rstrip())
        if s < e:
            spans.append((s, e))
        start = end
    return spans


def remove_span(text, start, end):
    """`text` (str) without text[start:end], the whitespace around the cut merged into one (a newline if
    there was one) -> (new text: str, offset of the cut in it: int). Raises nothing."""
    left, right = text[:start].rstrip(), text[end:].lstrip()
    gap = text[len(left):start] + text[end:len(text) - len(right)]
    sep = ('\n' if '\n' in gap else ' ') if left and right else ''
    return left + sep + right, len(left)


def ict_pairs(stories, seed=1337, max_pairs=None, per_story=1, min_sentences=3, min_words=4):
    """Inverse cloze pairs from `stories`, a sequence of str (a list, or a TokenStories) -> a list of pair
    dicts ('story': the story's index in `stories`), at most max_pairs (None: no limit); [] if no story has
    enough sentences. Stories are visited in a seeded random order; each story with >= min_sentences
    sentences gives up to per_story pairs with distinct query sentences, chosen among sentences of
    >= min_words words (all sentences if none has that many) that do not occur in the target. Raises
    nothing itself."""
    rng = np.random.default_rng(seed)
    out = []
    for si in rng.permutation(len(stories)).tolist():
        story = stories[si]
        spans = split_sentences(story)
        if len(spans) < min_sentences:
            continue
        long_ = [(a, b) for a, b in spans if len(story[a:b].split()) >= min_words]
        options = [(story[a:b], *remove_span(story, a, b)) for a, b in long_ or spans]   # (query, target, cut)
        options = [(q, target, cut) for q, target, cut in options if q not in target]
        for k in rng.permutation(len(options))[:per_story].tolist():
            q, target, cut = options[k]
            out.append({'query': q, 'target': target, 'cut': cut, 'story': si})
        if max_pairs is not None and len(out) >= max_pairs:
            return out[:max_pairs]
    return out


def read_pairs_file(path, max_pairs=None, seed=1337):
    """Pairs (list of dicts, see the module docstring; 'cut' None, 'story' the 1-based line number) from a
    JSONL file of {"query": str, "target": str} objects (blank lines skipped); each line is its own story.
    With max_pairs, a seeded random subset in file order. Raises UsageError if the file is missing, not
    UTF-8 or has no pairs, and naming the line of the first malformed line."""
    if not os.path.isfile(path):
        raise UsageError(f'pairs file {path!r} not found')
    out = []
    try:
        with open(path, encoding='utf-8') as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError as e:
        raise UsageError(f'pairs file {path!r} is not valid UTF-8 (byte offset {e.start})')
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f'{path} line {n}: not valid JSON ({e.msg})')
        if not isinstance(obj, dict) or not all(isinstance(obj.get(k), str) and obj[k].strip()
                                                for k in ('query', 'target')):
            raise UsageError(f'{path} line {n}: expected an object with non-empty string fields '
                             f'"query" and "target"')
        out.append({'query': obj['query'], 'target': obj['target'], 'cut': None, 'story': n})
    if not out:
        raise UsageError(f'pairs file {path!r} has no pairs')
    if max_pairs is not None and len(out) > max_pairs:
        keep = np.sort(np.random.default_rng(seed).permutation(len(out))[:max_pairs])
        out = [out[i] for i in keep.tolist()]
    return out


class TokenStories:
    """The non-empty stories of a token file as a read-only sequence of str, each decoded when indexed: ids
    is the file's uint16 memmap, spans [N, 2] int64 the token range of each story (the eot separators
    excluded). Only the stories that ict_pairs visits are ever decoded: a split of any size costs its memmap."""

    def __init__(self, ids, spans, enc):
        self.ids, self.spans, self.enc = ids, spans, enc

    def __len__(self):
        return len(self.spans)

    def __getitem__(self, i):
        a, b = self.spans[i]
        return self.enc.decode(self.ids[a:b].tolist()).strip()


def read_data_dir_stories(data_dir, split):
    """Stories of data_dir's {split}.bin ('train' or 'val': read_prepared's ids, stories separated by the eot
    id of meta.json), decoded with the data dir's tokenizer (byte-level BPE: the exact text): a TokenStories.
    Raises UsageError (one line) for what read_prepared refuses (meta.json or a token file missing or damaged,
    ids the vocabulary has not), a tokenizer that cannot be loaded or is not the one meta.json records."""
    try:
        meta, *ids = read_prepared(data_dir, 0)
        tok_path = os.path.join(data_dir, meta['tokenizer'])
        enc, found = load_tokenizer(tok_path), tokenizer_sha256(tok_path)
    except (OSError, ValueError) as e:
        raise UsageError(f'{e}' + ('; or pass --text or --pairs' if 'meta.json not found' in str(e) else ''))
    if found != meta['tokenizer_sha256']:
        raise UsageError(f'{tok_path} (sha256 {found}) is not the tokenizer meta.json records (sha256 '
                         f'{meta["tokenizer_sha256"]}): the token files were encoded with another; run '
                         'data/prepare.py again')
    ids = ids[('train', 'val').index(split)]
    ends = np.flatnonzero(ids == int(meta['eot_id']))
    starts = np.concatenate([[0], ends + 1])
    stops = np.concatenate([ends, [len(ids)]])
    keep = stops > starts
    return TokenStories(ids, np.stack([starts[keep], stops[keep]], 1), enc)


def read_text_stories(path):
    """Stories (list of str) of a raw UTF-8 text file separated by <|endoftext|> (data/prepare.py's
    split_stories). Raises UsageError if the file is missing, not UTF-8 or has no story."""
    try:
        check_file(path)
        with open(path, 'rb') as f:
            text = f.read().decode('utf-8')
    except OSError as e:
        raise UsageError(str(e))
    except UnicodeDecodeError as e:
        raise UsageError(f'{path} is not valid UTF-8 (byte offset {e.start})') from None
    stories = split_stories(text)
    if not stories:
        raise UsageError(f'{path} has no text (empty file or only separators)')
    return stories


def load_pairs(args):
    """(pairs, source): the pairs that retrieval.py's options ask for (`args`, a namespace with pairs, text,
    data_dir, split, max_pairs, per_story, seed): --pairs FILE's, or else inverse cloze pairs of the stories
    of --text or of --data_dir's --split.bin; source (str) describes them in one line. Raises UsageError
    for a bad source or when no story has 3 or more sentences."""
    if args.pairs:
        return read_pairs_file(args.pairs, args.max_pairs, args.seed), f'pairs file {args.pairs}'
    if args.text:
        stories, src = read_text_stories(args.text), args.text
    else:
        stories, src = read_data_dir_stories(args.data_dir, args.split), f'{args.data_dir}/{args.split}.bin'
    pairs = ict_pairs(stories, args.seed, args.max_pairs, args.per_story)
    if not pairs:
        raise UsageError(f'no story in {src} has 3 or more sentences')
    return pairs, f'inverse cloze on {src} ({len(stories)} stories)'


def split_by_story(pairs, test_frac=0.2, seed=1337):
    """Indices (train, test), two lists of int, of `pairs`: a seeded random test_frac of the distinct
    stories (at least one, and at least one left for training) go to test, with all their pairs; no story
    is on both sides. Raises UsageError if the pairs come from fewer than 2 stories."""
    stories = sorted({p['story'] for p in pairs})
    if len(stories) < 2:
        raise UsageError(f'need pairs from at least 2 stories, got {len(stories)}')
    perm = np.random.default_rng(seed + 1).permutation(len(stories))
    n_test = min(len(stories) - 1, max(1, round(test_frac * len(stories))))
    test_stories = {stories[i] for i in perm[:n_test].tolist()}
    train = [i for i, p in enumerate(pairs) if p['story'] not in test_stories]
    test = [i for i, p in enumerate(pairs) if p['story'] in test_stories]
    return train, test


def encode_pairs(pairs, enc, n_ctx, prefix_eot=True):
    """Token id lists (queries, targets), each a list of len(pairs) lists of int, of `pairs` for a model of
    context n_ctx, encoded by `enc` (a tiktoken.Encoding). Each text is [eot] + tokens (without the eot if
    prefix_eot is False), at most n_ctx ids. A query, or a target without a 'cut', keeps its first tokens;
    a target with a 'cut' (inverse cloze) keeps a window centred on the cut. Raises UsageError if n_ctx
    leaves no room for text."""
    pre = [enc.eot_token] if prefix_eot else []
    room = n_ctx - len(pre)
    if room < 1:
        raise UsageError(f'n_ctx={n_ctx} leaves no room for text')
    queries = [pre + enc.encode_ordinary(p['query'])[:room] for p in pairs]
    targets = []
    for p in pairs:
        toks = enc.encode_ordinary(p['target'])
        start = 0
        if len(toks) > room and p.get('cut') is not None:
            at = len(enc.encode_ordinary(p['target'][:p['cut']]))
            start = min(max(0, at - room // 2), len(toks) - room)
        targets.append(pre + toks[start:start + room])
    return queries, targets


def pairs_sha256(pairs):
    """Hex sha256 (str) of the pairs' queries, targets and cuts, in order: the pairs'
    identity in retrieval.py's embedding cache key."""
    blob = json.dumps([[p['query'], p['target'], p['cut']] for p in pairs], ensure_ascii=False)
    return hashlib.sha256(blob.encode('utf-8')).hexdigest()


# ----------------------------------------------------------------------------- splits and candidates

DEFAULT_NS = (2, 8, 32, 128)      # candidate counts N evaluated by default


def draw_candidates(rng, stories, pos, n):
    """Candidates for the queries of pairs `pos` (int array [B]): each query's own target and n - 1 targets
    of pairs from other stories (stories: int array, one per pair), drawn uniformly without replacement, in
    random order -> (indices int [B, n], labels int [B] = the position of the own target)."""
    pos = np.asarray(pos)
    if n > 1:
        keys = rng.random((len(pos), len(stories)))
        keys[stories[None, :] == stories[pos][:, None]] = np.inf      # never the query's own story
        neg = np.argpartition(keys, n - 2, axis=1)[:, :n - 1]
        cands = np.concatenate([neg, pos[:, None]], 1)
    else:
        cands = pos[:, None]
    perm = np.argsort(rng.random((len(pos), n)), axis=1)
    return np.take_along_axis(cands, perm, 1), np.argmax(perm == n - 1, axis=1)


def candidate_draws(stories, n, rounds, seed):
    """Fixed evaluation draws: every query `rounds` times -> (queries [K], cands [K, n], labels [K])."""
    rng = np.random.default_rng([seed, n])
    qs = np.tile(np.arange(len(stories)), rounds)
    cs, ls = zip(*(draw_candidates(rng, stories, qs[i:i + 256], n) for i in range(0, len(qs), 256)))
    return qs, np.concatenate(cs), np.concatenate(ls)


def candidate_counts(args, n_train_stories, n_test_stories):
    """(ns: sorted list of int, the N to evaluate: --n_candidates or the defaults that fit the test set;
    train_n: int, --train_n at most n_train_stories; notes: list of str). Raises UsageError if an asked-for
    N exceeds n_test_stories, no default N fits, or there are fewer than 2 training stories."""
    notes = []
    if args.n_candidates:
        ns = sorted(set(args.n_candidates))
        if ns[-1] > n_test_stories:
            raise UsageError(f'--n_candidates {ns[-1]} is larger than the test set ({n_test_stories} stories); '
                             f'raise --max_pairs or --test_frac')
    else:
        ns = [n for n in DEFAULT_NS if n <= n_test_stories]
        skipped = [n for n in DEFAULT_NS if n > n_test_stories]
        if skipped:
            notes.append(f'N={", ".join(map(str, skipped))} skipped: the test set has only {n_test_stories} stories')
        if not ns:
            raise UsageError(f'the test set has only {n_test_stories} stories, too few for N=2')
    train_n = min(args.train_n, n_train_stories)
    if train_n < args.train_n:
        notes.append(f'training used N={train_n} (only {n_train_stories} training stories)')
    if train_n < 2:
        raise UsageError(f'only {n_train_stories} training stories; need at least 2')
    return ns, train_n, notes


def plan_splits(args, pairs):
    """A SimpleNamespace of the run's splits of `pairs` (lists of indices: train, test;
    fit, val = train less / only the stories held out for early stopping), stories (int
    [P]), n_train_stories, n_test_stories, candidate_counts' ns, train_n (at most the fit
    stories) and notes, and fixed candidate_draws: draws {N: test}, train_draws {N: fit},
    val_draws (None without 2 val stories) at val_n candidates (train_n, or fewer: the val stories),
    test_draws (at train_n). Raises UsageError."""
    train_idx, test_idx = split_by_story(pairs, args.test_frac, args.seed)
    stories = np.array([p['story'] for p in pairs])
    tr_st, te_st = stories[train_idx], stories[test_idx]
    n_test_stories, n_train_stories = len(set(te_st.tolist())), len(set(tr_st.tolist()))
    ns, train_n, notes = candidate_counts(args, n_train_stories, n_test_stories)
    fit_idx, val_idx = list(train_idx), []
    if args.val_frac > 0 and n_train_stories >= 4:     # early stopping on stories held out of training
        fit, val = split_by_story([pairs[i] for i in train_idx], args.val_frac, args.seed + 1)
        fit_idx, val_idx = [train_idx[i] for i in fit], [train_idx[i] for i in val]
    fit_st, val_st = stories[fit_idx], stories[val_idx]
    n_fit, n_val = len(set(fit_st.tolist())), len(set(val_st.tolist()))
    train_n = min(train_n, n_fit)
    val_n = min(train_n, n_val)
    return SimpleNamespace(
        train=train_idx, test=test_idx, fit=fit_idx, val=val_idx, stories=stories, ns=ns, train_n=train_n,
        notes=notes, n_train_stories=n_train_stories, n_test_stories=n_test_stories, val_n=val_n,
        draws={n: candidate_draws(te_st, n, args.eval_rounds, args.seed) for n in ns},
        train_draws={n: candidate_draws(fit_st, n, 1, args.seed) for n in ns if n <= n_fit},
        val_draws=candidate_draws(val_st, val_n, 1, args.seed) if n_val >= 2 else None,
        test_draws=candidate_draws(te_st, min(train_n, n_test_stories), 1, args.seed))
