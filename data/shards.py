"""Nothing lost, nothing redone: the resumable tokenizing of data/corpus.py (prepare.py --dataset).

The documents of a part (PART: "all", one stream split by the held-out rule; or "train" and "val", the
dataset's own splits with --val_split) are cut into shards of --shard_docs documents, and shard K is tokenized
into its own file --out/shards-KEY/PART-K.npz (KEY: a hash of every setting the outputs depend on), written
whole (a temporary name .NAME.tmpPID, then a rename) by one of --num_proc processes: tokens (each non-empty
document's ids, then <|endoftext|>), lengths and UTF-8 bytes of each document, and which are held out. After
reading shard K, the stream's position (datasets' IterableDataset.state_dict) is saved beside it as
PART-K.state.json; a part whose stream ended, or reached --max_tokens, gets PART-done.json (how many shards the
split files take). The split files are then assembled from the shards in order.

Killed at any moment (Ctrl-C, kill -9, a full disk), the same command goes on from the stream's position after
the last shard K whose shards 0..K are all written (resume_point), tokenizes only the shards that are missing,
and assembles: the same bytes as an uninterrupted run, since a shard's bytes depend only on its documents, the
tokenizer (saved in the shards folder before any shard) and the rule, never on --num_proc or on when it was
written. A pool worker left running by a kill -9 finishes at most its shard, whole, with the same bytes.

Memory: the main process holds at most --num_proc + 1 shards of text in flight, each worker one shard and its
tokens, the assembly one shard at a time: flat in the size of the corpus.
"""
import contextlib
import json
import os
import re
import signal
import time
from collections import deque, namedtuple

import numpy as np

from harness.cli import write_atomic
from data.tokenizer import load_tokenizer

# What produce() works with: the checked args, the shards folder, submit(path, docs, val) -> an AsyncResult-like
# task, ahead (tasks in flight at most), batches(split, start) -> iterator of (k, docs, state) from shard
# start[0] (corpus.shard_batches), total(split) -> the number of documents if known, else None
Context = namedtuple("Context", "args folder submit ahead batches total")
TEMP_NAME = re.compile(r"^\..+\.tmp\d+$")


def remove_temps(folder):
    """Remove every temporary file (.NAME.tmpPID) of the shards folder: --out is locked, so they are a stopped
    run's (or a worker's that a kill -9 left running: its shard is then written again, the same bytes)."""
    for f in os.listdir(folder) if os.path.isdir(folder) else ():
        if TEMP_NAME.match(f):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, f))


def held_out(args, part, k, n):
    """Which of shard k's n documents are validation ones -> bool numpy [n]: all of PART 'val', none of
    'train', the seeded rule (module docstring) for 'all'."""
    if part != "all":
        return np.full(n, part == "val")
    return np.random.default_rng([args.seed, k]).random(args.shard_docs)[:n] < args.val_fraction


def shard_path(folder, part, k):
    return os.path.join(folder, f"{part}-{k:07d}.npz")


def write_whole(path, write):
    """Call write(file) on a temporary file beside `path` (.NAME.tmpPID), then rename it to `path`: the file
    is whole or absent. Raises OSError; the temporary file is removed on failure."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


_ENCODINGS = {}


def encode_shard(tokenizer_path, path, docs, val):
    """Tokenize one shard (a worker's task; in the main process with --num_proc 1): docs (list of str), val
    (bool [n], the held-out ones) -> the file `path` (np.savez, written whole): tokens (uint16, or uint32 for a
    vocabulary over 65,536) = each non-empty document's ids then <|endoftext|>, lengths (uint32 [n]: tokens of
    each document, 0 for an empty one), nbytes (uint64 [n]: UTF-8 bytes), val. Returns summary()."""
    st = os.stat(tokenizer_path)
    key = (tokenizer_path, st.st_size, st.st_mtime_ns)      # a file rewritten at the same path is read again
    enc = _ENCODINGS.get(key)
    if enc is None:
        enc = _ENCODINGS[key] = load_tokenizer(tokenizer_path)
    dtype = np.uint16 if enc.n_vocab <= 65536 else np.uint32
    eot = np.array([enc.eot_token], dtype=np.uint32)
    lengths, nbytes = np.zeros(len(docs), np.uint32), np.zeros(len(docs), np.uint64)
    pieces = []
    for i, d in enumerate(docs):
        if d:
            ids = enc.encode_to_numpy(d, disallowed_special=())
            pieces += [ids, eot]
            lengths[i], nbytes[i] = ids.size + 1, len(d.encode("utf-8"))
    tokens = np.concatenate(pieces).astype(dtype) if pieces else np.zeros(0, dtype)
    write_whole(path, lambda f: np.savez(f, tokens=tokens, lengths=lengths, nbytes=nbytes, val=val))
    return summary(lengths, nbytes, val)


def summary(lengths, nbytes, val):
    """A shard's counts -> {docs (non-empty), empty, train_tokens, val_tokens, bytes} (ints)."""
    return {"docs": int((lengths > 0).sum()), "empty": int((lengths == 0).sum()),
            "train_tokens": int(lengths[~val].sum()), "val_tokens": int(lengths[val].sum()),
            "bytes": int(nbytes.sum())}


def read_summary(path):
    """summary() of the shard file `path` (its small arrays only)."""
    with np.load(path) as z:
        return summary(z["lengths"], z["nbytes"], z["val"])


def worker_init(lock):
    """A pool worker (forked) ignores Ctrl-C (the main process stops it) and closes its copy of --out's locked
    descriptor `lock` (int or None), so the lock goes with the main process: the same command can run again
    at once after a kill -9, while a worker left over finishes (at most) its shard, whole."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if lock is not None:
        os.close(lock)


class Progress:
    """Progress of one part, printed every `every` seconds: documents, MB of text, tokens, MB/s and tokens/s
    of this run's tokenizing, and an ETA where the end is known: the number of documents (known_docs) or
    --max_tokens. Shards written by an earlier run count as done and not in the rates."""

    def __init__(self, label, total_docs=None, max_tokens=None, every=5.0):
        self.label, self.total_docs, self.max_tokens, self.every = label, total_docs, max_tokens, every
        self.t0 = self.last = time.time()     # begin() sets them again once the stream is open
        self.n = {"docs": 0, "empty": 0, "train_tokens": 0, "val_tokens": 0, "bytes": 0}
        self.done0 = 0.0                    # the fraction an earlier run had done
        self.fresh = {"bytes": 0, "tokens": 0, "shards": 0}
        self.kept = 0                       # shards an earlier run wrote

    def begin(self):
        """Start the clock of the rates: the stream has given its first shard."""
        self.t0 = self.last = time.time()

    def add(self, s, kept):
        """Count a shard's summary `s`; kept: written by an earlier run (not tokenized now)."""
        for key in self.n:
            self.n[key] += s[key]
        if kept:
            self.kept += 1
            self.done0 = self.fraction()
        else:
            self.fresh["bytes"] += s["bytes"]
            self.fresh["tokens"] += s["train_tokens"] + s["val_tokens"]
            self.fresh["shards"] += 1
        if time.time() - self.last >= self.every:
            self.last = time.time()
            self.show()

    def fraction(self):
        """The fraction of the part done (0 if the end is unknown)."""
        f = 0.0
        if self.total_docs:
            f = (self.n["docs"] + self.n["empty"]) / self.total_docs
        if self.max_tokens:
            f = max(f, self.n["train_tokens"] / self.max_tokens)
        return min(f, 1.0)

    def show(self, final=False):
        dt = max(time.time() - self.t0, 1e-9)
        line = (f"{self.label}: {self.n['docs']:,} documents, {self.n['bytes'] / 1e6:,.1f} MB, "
                f"{(self.n['train_tokens'] + self.n['val_tokens']) / 1e6:,.2f} M tokens; tokenized now "
                f"{self.fresh['shards']} shards at {self.fresh['bytes'] / 1e6 / dt:.2f} MB/s, "
                f"{self.fresh['tokens'] / 1e6 / dt:.3f} M tokens/s")
        f = self.fraction()
        if final:
            line += f", {dt:.1f}s" + (f" ({self.kept} shards written by an earlier run kept)" if self.kept else "")
        elif f > self.done0:
            line += f", {100 * f:.1f}% done, ETA {dt * (1 - f) / (f - self.done0):.0f}s"
        print(line, flush=True)


class Done:
    """A task run in this process (--num_proc 1), shaped like the pool's AsyncResult."""

    def __init__(self, value):
        self.value = value

    def ready(self):
        return True

    def get(self):
        return self.value


def resume_point(folder, part):
    """Where an earlier run of these settings left `part`: ((K + 1, the stream's state after shard K), [summary
    of shards 0..K]) for the largest K whose state file and shards 0..K are all written; ((0, None), []) if none."""
    names = set(os.listdir(folder))
    k, good = 0, 0
    while os.path.basename(shard_path(folder, part, k)) in names:
        k += 1
        if f"{part}-{k - 1:07d}.state.json" in names:
            good = k
    if not good:
        return (0, None), []
    with open(os.path.join(folder, f"{part}-{good - 1:07d}.state.json")) as f:
        state = json.load(f)
    return (good, state), [read_summary(shard_path(folder, part, i)) for i in range(good)]


def save_state(folder, part, k, state):
    """Save the stream's position after shard k (a JSON dict) beside it; one that is not JSON is not saved
    (a later run then reads from the start, tokenizing nothing written)."""
    try:
        text = json.dumps(state)
    except (TypeError, ValueError):
        return
    write_atomic(os.path.join(folder, f"{part}-{k:07d}.state.json"), text)


def produce(ctx, part, split):
    """Make every shard of `part` (from the stream of `split`) exist in ctx.folder, tokenizing only those that
    do not, up to the stream's end or the shard whose training tokens bring the total to --max_tokens; then
    write PART-done.json {"shards": how many the split files take}. ctx: a Context. Raises ValueError, OSError
    (reading, a task)."""
    args, folder = ctx.args, ctx.folder
    done = os.path.join(folder, f"{part}-done.json")
    if os.path.exists(done):
        return
    start, earlier = resume_point(folder, part)
    progress = Progress(f"{part} ({split})" if part != "all" else f"{split} (training and held out)", ctx.total(split),
                        args.max_tokens if part != "val" else None)
    if start[0]:
        print(f"{part}: going on after shard {start[0] - 1}: {start[0]} shards written by an earlier run are "
              "not tokenized again", flush=True)
    for s in earlier:
        progress.add(s, kept=True)
    goal = args.max_tokens if part != "val" else None
    cut, n, pending = None, start[0], deque()

    def take():
        nonlocal cut
        k, result, kept = pending.popleft()
        done = result.get()                 # a task's error is raised here
        if cut is None:                     # shards past the cut were in flight: written, not counted
            progress.add(done, kept)
            if goal and progress.n["train_tokens"] >= goal:
                cut = k + 1
    if goal and progress.n["train_tokens"] >= goal:
        cut = n
    with contextlib.closing(ctx.batches(split, start)) as batches:
        for k, docs, state in batches if cut is None else ():
            if k == start[0]:
                progress.begin()
            path = shard_path(folder, part, k)
            if os.path.exists(path):
                pending.append((k, Done(read_summary(path)), True))
            else:
                pending.append((k, ctx.submit(path, docs, held_out(args, part, k, len(docs))), False))
            save_state(folder, part, k, state)
            n = k + 1
            while pending and (len(pending) > ctx.ahead or pending[0][1].ready()) and cut is None:
                take()
            if cut is not None:
                break
    while pending:
        take()
    progress.show(final=True)
    write_atomic(done, json.dumps({"shards": cut if cut is not None else n}))


def assemble(args, folder, parts, tmp):
    """Write the split files from the shards in order (each part's PART-done.json shards; the training tokens
    cut after the document that brings them to --max_tokens): tmp("train.bin") and tmp("val.bin") (tmp: name
    -> a temporary path) -> {split: {tokens, bytes, stories (non-empty documents), empty, bytes_per_token}}.
    Raises ValueError if a split is empty, OSError if reading or writing fails."""
    stats = {s: {"tokens": 0, "bytes": 0, "stories": 0, "empty": 0} for s in ("train", "val")}
    last = time.time()
    with open(tmp("train.bin"), "wb") as ftrain, open(tmp("val.bin"), "wb") as fval:
        for part, _ in parts:
            with open(os.path.join(folder, f"{part}-done.json")) as f:
                n = json.load(f)["shards"]
            goal = args.max_tokens if part != "val" else None
            for k in range(n):
                with np.load(shard_path(folder, part, k)) as z:
                    tokens, lengths, nbytes, val = z["tokens"], z["lengths"], z["nbytes"], z["val"]
                keep = len(lengths)
                if goal:
                    room = goal - stats["train"]["tokens"]
                    hit = np.nonzero(np.cumsum(np.where(val, 0, lengths).astype(np.int64)) >= room)[0]
                    keep = int(hit[0]) + 1 if hit.size else keep
                lengths, nbytes, val = lengths[:keep], nbytes[:keep], val[:keep]
                mask = np.repeat(val, lengths)
                tokens = tokens[:mask.size]
                ftrain.write(tokens[~mask].tobytes())
                fval.write(tokens[mask].tobytes())
                for split, sel in (("train", ~val), ("val", val)):
                    st = stats[split]
                    st["tokens"] += int(lengths[sel].sum())
                    st["bytes"] += int(nbytes[sel].sum())
                    st["stories"] += int((lengths[sel] > 0).sum())
                    st["empty"] += int((lengths[sel] == 0).sum())
                if time.time() - last >= 5:
                    last = time.time()
                    print(f"assembling {part}: shard {k + 1}/{n}", flush=True)
                if goal and stats["train"]["tokens"] >= goal:
                    break
    for split, st in stats.items():
        if not st["tokens"]:
            raise ValueError(f"no {'validation' if split == 'val' else 'training'} text: " + (
                f"the held-out rule (--val_fraction {args.val_fraction}) kept none of the "
                f"{stats['train']['stories']} documents; give a larger --val_fraction" if split == "val" and
                args.val_split is None else f"{args.dataset} has no non-empty document in its {split} split"))
        st["bytes_per_token"] = st["bytes"] / st["tokens"]
    return stats
