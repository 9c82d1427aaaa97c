"""Any corpus in: the --dataset half of data/prepare.py. A Hugging Face dataset (read streaming, so FineWeb-edu's
sample-10BT never has to fit on disk or in memory) or a local parquet, jsonl or arrow file or folder (what
datasets.load_dataset reads, streamed too: no cache copy), tokenized into the same four files as the text path.

    python data/prepare.py --dataset HuggingFaceFW/fineweb-edu --name sample-10BT --vocab_size 8000 \\
                           --max_tokens 200000000 --out data/fineweb_edu
    python data/prepare.py --dataset corpus.jsonl --out data/mine          # a local file: text in its "text" field

Documents: the --text_field of each record (None, "" or whitespace only: skipped, counted), each followed by
<|endoftext|> (its id; the text "<|endoftext|>" in a document is encoded as text). Validation: the dataset's own
--val_split, or the documents held out by a seeded rule: in shard k (documents k*S .. k*S+S-1, S = --shard_docs),
document i is held out iff numpy.random.default_rng([seed, k]).random(S)[i] < --val_fraction. --max_tokens N: the
training documents up to the one whose tokens bring the total to N. The tokenizer and the outputs: as the text
path's (data/outputs.py: write_tokenizer, keep_outputs, write_outputs); past 65,536 tokens the token files are
uint32. Reading the source (a local file or folder, or the hub, probed first): data/source.py.

Nothing lost, nothing redone: shard K of a part (PART "all", split by the held-out rule; or "val" and "train",
the dataset's own splits) is tokenized by one of --num_proc processes into --out/shards-KEY/PART-K.npz (KEY:
a hash of the settings), written whole (cli.written) with the stream's position after it. Killed at any moment,
the same command reads on from the position in the last shard K whose shards 0..K are all written, tokenizes
only the missing shards and assembles the same bytes (a shard's depend on its documents, the tokenizer, saved
there first, and the rule only). The shards folder is removed once the outputs are in place; another run's is
refused without --overwrite. Memory is flat: --num_proc + 1 shards in flight. Offline, a hub name fails at once
in one line (the Hub is probed first, so datasets' retries never run). Errors: ValueError or OSError.
"""
import contextlib
import functools
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
from collections import deque

import numpy as np

if __name__ == "__main__":       # before the imports that need the repository root on the path
    print("corpus.py: error: data/prepare.py's --dataset, not a command: python data/prepare.py --help", file=sys.stderr)
    sys.exit(2)

from data.outputs import VERSION, Progress, keep_outputs, room_for, write_outputs, write_tokenizer
from data.source import COMPRESSED, LOCAL_FORMATS, known_docs, open_split, read_shards, source_id
from data.tokenizer import file_sha256, load_tokenizer
from harness.cli import remove_stale_temps, write_atomic, written
from harness.flags import number, random_seed

CORPUS_VERSION = "corpus 3"     # the shard format and the rules above: a change makes every shards folder "other"
CORPUS_FLAGS = {"name": None, "split": "train", "text_field": "text", "val_split": None, "val_fraction": 0.005,
                "seed": 0, "max_tokens": None, "num_proc": None, "shard_docs": 1024}   # --dataset's own flags


def add_flags(parser):
    """The --dataset path's flags, as a group of prepare.py's parser (`parser`, its flags.ArgumentParser); check_args
    checks them."""
    c = parser.add_argument_group("any corpus (data/corpus.py)")
    c.add_argument("--dataset", metavar="NAME_OR_PATH",
                   help="a Hugging Face dataset (streamed) or a local parquet/jsonl/arrow file or folder")
    c.add_argument("--name", help="the dataset's config (e.g. sample-10BT)")
    c.add_argument("--split", default="train", help="the split to train on (default train)")
    c.add_argument("--text_field", default="text",
                   help="the field of a record that holds its text (default text)")
    c.add_argument("--val_split", help="validate on this split of the dataset (default: hold documents out)")
    c.add_argument("--val_fraction", type=float, default=0.005,
                   help="documents held out for validation, seeded (default 0.005)")
    c.add_argument("--seed", type=random_seed, default=0, help="the seed of the held-out rule (default 0)")
    c.add_argument("--max_tokens", type=number(int, 1),
                   help="stop after this many training tokens (whole documents; default: all)")
    c.add_argument("--num_proc", type=number(int, 1), help="tokenizing processes (default: the cores)")
    c.add_argument("--shard_docs", type=number(int, 1), default=1024,
                   help="documents per shard, the unit of resuming (default 1024)")


def check_args(args):
    """Check the --dataset flags of prepare.py's parsed `args` (argparse.Namespace; their types checked there)
    -> args, --num_proc set. Raises ValueError (one line) for a corpus flag without --dataset; with it:
    --train/--valid, the text files' flags, an --out inside a --dataset folder, an empty --dataset, --split or
    --text_field, a local path (by its form) that does not exist, --name with a local path, --val_split equal to
    --split or beside --val_fraction, a --val_fraction outside (0, 1)."""
    given = [f"--{k}" for k, v in CORPUS_FLAGS.items() if getattr(args, k) != v]
    if args.dataset is None:
        if given:
            raise ValueError(f"{given[0]} applies to a --dataset only")
        return args
    if args.train is not None or args.valid is not None:
        raise ValueError("--dataset and --train/--valid are two sources: pass one of them")
    if args.skip_bad_utf8 or args.chunk_bytes != 8 << 20:
        raise ValueError("--skip_bad_utf8 and --chunk_bytes read text files: they apply to --train/--valid only")
    if os.path.isdir(args.dataset) and not os.path.relpath(os.path.abspath(args.out),
                                                           os.path.abspath(args.dataset)).startswith(".."):
        raise ValueError(f"--out {args.out} lies inside --dataset {args.dataset}: choose another --out")
    for name in ("dataset", "text_field", "split"):
        if not getattr(args, name):
            raise ValueError(f"--{name} is empty")
    path_like = (args.dataset.startswith(("/", ".", "~")) or args.dataset.count("/") > 1
                 or args.dataset.lower().endswith(tuple(LOCAL_FORMATS) + COMPRESSED + (".txt",)))
    if path_like and not os.path.exists(args.dataset):
        raise ValueError(f"--dataset {args.dataset}: no such file or folder (a hub name is NAME or OWNER/NAME)")
    if args.name is not None and os.path.exists(args.dataset):
        raise ValueError(f"--name {args.name} names a configuration of a hub dataset; --dataset {args.dataset} is a "
                         f"local {'folder' if os.path.isdir(args.dataset) else 'file'}: leave --name out")
    if args.val_split is not None:
        if args.val_split == args.split:
            raise ValueError(f"--val_split {args.val_split} is the training split too")
        if args.val_fraction != CORPUS_FLAGS["val_fraction"]:
            raise ValueError("--val_split and --val_fraction are two validation rules: pass one of them")
    elif not 0 < args.val_fraction < 1:
        raise ValueError(f"--val_fraction must be in (0, 1), got {args.val_fraction}")
    args.num_proc = args.num_proc or os.cpu_count() or 1
    return args


# ----------------------------------------------------------------------------- the shards

def held_out(args, part, k, n):
    """Which of shard k's n documents are validation ones -> bool numpy [n]: all of PART 'val', none of
    'train', the seeded rule (module docstring) for 'all'."""
    if part != "all":
        return np.full(n, part == "val")
    return np.random.default_rng([args.seed, k]).random(args.shard_docs)[:n] < args.val_fraction


def shard_path(folder, part, k):
    return os.path.join(folder, f"{part}-{k:07d}.npz")


def summary(lengths, nbytes, val):
    """A shard's counts -> {docs (non-empty), empty, train_tokens, val_tokens, bytes} (ints)."""
    return {"docs": int((lengths > 0).sum()), "empty": int((lengths == 0).sum()),
            "train_tokens": int(lengths[~val].sum()), "val_tokens": int(lengths[val].sum()),
            "bytes": int(nbytes.sum())}


def read_shard(path):
    """The shard file `path` -> (its summary(), the stream's position after it: a JSON str, or "")."""
    with np.load(path) as z:
        return summary(z["lengths"], z["nbytes"], z["val"]), str(z["position"])


@functools.lru_cache(maxsize=2)
def encoding(path, size, mtime):
    """The tokenizer at `path`, loaded once a process for its size and mtime (a file rewritten is read again)."""
    return load_tokenizer(path)


def encode_shard(tokenizer_path, path, docs, val, position):
    """Tokenize one shard (a worker's task; in the main process with --num_proc 1): docs (list of str), val
    (bool [n], the held-out ones), position (str: the stream's after the shard) -> the file `path` (np.savez,
    written whole): tokens (uint16, or uint32 for a vocabulary over 65,536) = each non-empty document's ids then
    <|endoftext|>, lengths (uint32 [n]: each document's tokens, 0 for an empty one), nbytes (uint64 [n]: UTF-8
    bytes), val, position. Returns summary(). Raises outputs.NoRoom naming `path` on a full disk, OSError if writing
    fails otherwise."""
    st = os.stat(tokenizer_path)
    enc = encoding(tokenizer_path, st.st_size, st.st_mtime_ns)
    eot = np.array([enc.eot_token], dtype=np.uint32)
    lengths, nbytes, pieces = np.zeros(len(docs), np.uint32), np.zeros(len(docs), np.uint64), []
    for i, d in enumerate(docs):
        if d:
            ids = enc.encode_to_numpy(d, disallowed_special=())
            pieces += [ids, eot]
            lengths[i], nbytes[i] = ids.size + 1, len(d.encode("utf-8"))
    dtype = np.uint16 if enc.n_vocab <= 65536 else np.uint32
    tokens = np.concatenate(pieces).astype(dtype) if pieces else np.zeros(0, dtype)
    with room_for(path), written(path) as tmp, open(tmp, "wb") as f:
        np.savez(f, tokens=tokens, lengths=lengths, nbytes=nbytes, val=val, position=np.array(position))
    return summary(lengths, nbytes, val)


def worker_init(lock):
    """A pool worker (forked) ignores Ctrl-C (the main process stops it) and closes its copy of --out's locked
    descriptor `lock` (int or None), so the lock goes with the main process: the same command can run again
    at once after a kill -9, while a worker left over finishes (at most) its shard, whole."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if lock is not None:
        os.close(lock)


def resume_point(folder, part):
    """Where an earlier run of these settings left `part` -> (K + 1, the stream's position after shard K (a
    dict), [summary of shards 0..K]) for the last K whose shards 0..K are all written and whose position is
    kept; (0, None, []) if there is none."""
    kept, good, state = [], 0, None
    while os.path.exists(shard_path(folder, part, len(kept))):
        s, position = read_shard(shard_path(folder, part, len(kept)))
        kept.append(s)
        if position:
            good, state = len(kept), json.loads(position)
    return good, state, kept[:good]


def produce(args, folder, part, split, submit, ahead):
    """Make every shard of `part` (read from the stream of `split`) exist in `folder`, tokenizing only those that
    do not, up to the stream's end or the shard whose training tokens bring the total to --max_tokens.
    submit(path, docs, val, position) -> encode_shard's summary (dict), or a task (the pool's AsyncResult) that
    gives it; `ahead`: tasks in flight at most. Prints progress (outputs.Progress). Raises ValueError, OSError
    (reading, a task)."""
    goal, total = (args.max_tokens if part != "val" else None), known_docs(args)
    n, state, kept = resume_point(folder, part)
    if n:
        print(f"{part}: going on after shard {n - 1}: {n} shards written by an earlier run are not tokenized "
              "again", flush=True)
    label = f"{split} (training and held out)" if part == "all" else f"{part} ({split})"
    count, progress = dict.fromkeys(("docs", "empty", "train_tokens", "val_tokens", "bytes"), 0), None

    def now():              # (MB, documents, tokens, fraction done: of the documents if known, or the goal)
        done = max((count["docs"] + count["empty"]) / total if total else 0,
                   count["train_tokens"] / goal if goal else 0)
        return count["bytes"] / 1e6, count["docs"], count["train_tokens"] + count["val_tokens"], min(done, 1)

    def add(s):             # a shard's summary, in order
        for key, v in s.items():
            count[key] += v
        if progress:
            progress.update(*now())

    def take():
        task = pending.popleft()
        add(task if isinstance(task, dict) else task.get())

    def reached():
        return goal is not None and count["train_tokens"] >= goal
    for s in kept:
        add(s)
    pending = deque()
    with contextlib.closing(read_shards(args, split, n, state)) as shards, contextlib.ExitStack() as bar:
        for k, docs, position in () if reached() else shards:
            if k == n:                        # the rates count from the stream's first shard to tokenize
                progress = bar.enter_context(Progress(label, done=now(), fractions=bool(total or goal)))
            path = shard_path(folder, part, k)
            pending.append(read_shard(path)[0] if os.path.exists(path) else
                           submit(path, docs, held_out(args, part, k, len(docs)), position))
            while pending and (len(pending) > ahead or isinstance(pending[0], dict) or pending[0].ready()) \
                    and not reached():
                take()
            if reached():
                break
        while pending and not reached():          # shards past the --max_tokens cut are not counted
            take()
        progress = progress or bar.enter_context(Progress(label, done=now(), fractions=bool(total or goal)))


# ----------------------------------------------------------------------------- the run

def assemble(args, folder, parts, train_path, val_path):
    """Write the split files train_path and val_path from each part's shards in order (the training tokens cut
    after the document that brings them to --max_tokens) -> {split: {tokens, bytes, stories (non-empty
    documents), empty, bytes_per_token}}. Raises ValueError if a split is empty, OSError if reading or writing
    fails."""
    stats = {s: dict.fromkeys(("tokens", "bytes", "stories", "empty"), 0) for s in ("train", "val")}
    with open(train_path, "wb") as ftrain, open(val_path, "wb") as fval:
        for part, _ in parts:
            goal, k = args.max_tokens if part != "val" else None, 0
            with Progress(f"assembling {part}") as progress:
                while os.path.exists(shard_path(folder, part, k)) and not (goal and stats["train"]["tokens"]
                                                                          >= goal):
                    with np.load(shard_path(folder, part, k)) as z:
                        tokens, lengths, nbytes, val = z["tokens"], z["lengths"], z["nbytes"], z["val"]
                    if goal:
                        room = goal - stats["train"]["tokens"]
                        hit = np.nonzero(np.cumsum(np.where(val, 0, lengths).astype(np.int64)) >= room)[0]
                        keep = int(hit[0]) + 1 if hit.size else len(lengths)
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
                    k += 1
                    progress.update((ftrain.tell() + fval.tell()) / 1e6)
    cut = bool(args.max_tokens) and stats["train"]["tokens"] >= args.max_tokens
    for split, st in stats.items():
        if not st["tokens"]:
            raise ValueError(no_text(args, split, stats, cut))
        st["bytes_per_token"] = st["bytes"] / st["tokens"]
    return stats


def held_all(args, n):
    """The line of a held-out rule that left no training document of the `n` read."""
    return (f"no training text: the held-out rule (--val_fraction {args.val_fraction}) held out all {n} documents "
            "read; give a smaller --val_fraction")


def no_text(args, split, stats, cut):
    """Why split ('train' or 'val') has no token, assemble's stats {split: counts} in hand (`cut`: --max_tokens
    stopped the reading) -> one line."""
    if args.val_split is not None:
        name = args.val_split if split == "val" else args.split
        return f"no {'validation' if split == 'val' else 'training'} text: {args.dataset} has no non-empty document " \
               f"in its {name} split"
    if split == "train":
        return held_all(args, stats["val"]["stories"]) if stats["val"]["stories"] else \
            f"no training text: {args.dataset} has no non-empty document in its {args.split} split"
    read = stats["train"]["stories"]
    return (f"no validation text: the held-out rule (--val_fraction {args.val_fraction}) kept none of the {read} "
            "documents" + (f" read before --max_tokens {args.max_tokens} was reached; give a larger --max_tokens "
                           "or --val_fraction" if cut else "; give a larger --val_fraction"))


def corpus_settings(args):
    """What --out's outputs depend on (a JSON dict, kept in meta.json as "settings"; its hash names the shards
    folder): the source (source_id), the validation rule, --max_tokens, --shard_docs, the vocabulary, the BPE's
    sample or the --tokenizer file's sha256, and both format versions; not --num_proc. Raises ValueError,
    OSError (source_id)."""
    return {"version": VERSION, "corpus": CORPUS_VERSION, "source": source_id(args),
            "val_fraction": None if args.val_split else args.val_fraction,
            "seed": None if args.val_split else args.seed, "max_tokens": args.max_tokens,
            "shard_docs": args.shard_docs, "vocab_size": args.vocab_size or (None if args.tokenizer else 4096),
            "bpe_max_bytes": None if args.tokenizer else args.bpe_max_bytes,
            "tokenizer_sha256": file_sha256(args.tokenizer) if args.tokenizer else None}


def tokenize(args, folder, parts, lock):
    """Make every part's shards in `folder` (produce), after the tokenizer, saved there once (a later run
    reuses it): outputs.write_tokenizer on the training documents of the last part. --num_proc processes,
    forked where the system can (before datasets starts a thread; each closes its copy of the locked
    descriptor `lock`). Raises ValueError, OSError; KeyboardInterrupt goes through, the pool stopped."""
    pool = None
    if args.num_proc > 1:
        fork = "fork" in multiprocessing.get_all_start_methods()
        pool = multiprocessing.get_context("fork" if fork else None).Pool(args.num_proc, worker_init,
                                                                           (lock if fork else None,))
    try:
        for _, split in parts:          # a missing split or config fails before the BPE is trained
            open_split(args, split)
        tok_path = os.path.join(folder, "tokenizer.tiktoken")
        if not os.path.exists(tok_path):
            part, split = parts[-1]
            read = [0, 0]               # documents read (non-empty), of them held out

            def training(shards):
                for k, docs, _ in shards:
                    held = held_out(args, part, k, len(docs))
                    kept = np.array([bool(d) for d in docs], dtype=bool)
                    read[0], read[1] = read[0] + int(kept.sum()), read[1] + int(held[kept].sum())
                    yield [d for d, h in zip(docs, held) if d and not h]
            with contextlib.closing(read_shards(args, split)) as shards, room_for(tok_path), written(tok_path) as tmp:
                try:
                    write_tokenizer(args, training(shards), tmp, f"{args.dataset} --split {split}")
                except ValueError:
                    if read[0] and read[0] == read[1]:          # text there is, all of it held out
                        raise ValueError(held_all(args, read[0])) from None
                    raise

        def submit(path, docs, val, position):
            if pool is None:
                return encode_shard(tok_path, path, docs, val, position)
            return pool.apply_async(encode_shard, (tok_path, path, docs, val, position))
        for part, split in parts:
            produce(args, folder, part, split, submit, args.num_proc + 1)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()


def other_shards(out, name, settings):
    """The line refusing out's shards folder `name`, made with other settings than `settings`: when its
    settings.json differs only in the source's files (their sizes and sha256), the corpus changed under a stopped
    run of this very command; else it is another command's unfinished run."""
    try:
        with open(os.path.join(out, name, "settings.json")) as f:
            theirs = json.load(f)
        mine = [{**settings, "source": {**settings["source"], "files": None}}, settings["source"].get("files") or []]
        theirs = [{**theirs, "source": {**theirs["source"], "files": None}}, theirs["source"].get("files") or []]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):      # none (older shards), or damaged
        theirs = mine = None
    if mine is not None and mine[0] == theirs[0]:
        old, new = ({f.get("path"): f for f in files} for files in (theirs[1], mine[1]))
        changed = sorted(p for p in old.keys() | new.keys() if old.get(p) != new.get(p))
        return (f"{out} holds the shards of a stopped run of this command, made before its corpus changed "
                f"({', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}: other contents now); they cannot be "
                "used: pass --overwrite to drop them and start again")
    return (f"{out} holds the shards of an unfinished --dataset run of other settings ({name}): run the command that "
            "made them again to finish it, or pass --overwrite to drop them")


def prepare_corpus(args, lock=None):
    """prepare.py --dataset's work on checked `args` (check_args), with --out made and locked (`lock`: the
    locked descriptor, int, or None): keep what --out holds (prepare.keep_outputs, and the shards folders:
    module docstring), tokenize the missing shards, assemble the split files and put the four outputs in place
    (prepare.write_outputs), then remove the shards folder -> True, or False if --out holds this data already.
    Raises ValueError (bad input, one line) or OSError (reading or writing failed); KeyboardInterrupt goes
    through."""
    settings = corpus_settings(args)
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    folder = os.path.join(args.out, f"shards-{key}")
    if not keep_outputs(args, settings, resuming=os.path.isdir(folder)):
        shutil.rmtree(folder, ignore_errors=True)       # a run stopped after its outputs were in place
        return False
    others = sorted(d for d in os.listdir(args.out) if d.startswith("shards-") and d != os.path.basename(folder))
    if others and not args.overwrite:
        raise ValueError(other_shards(args.out, others[0], settings))
    for d in others:
        shutil.rmtree(os.path.join(args.out, d))
        print(f"prepare.py: note: removed {d}, the shards of an unfinished run of other settings", file=sys.stderr)
    os.makedirs(folder, exist_ok=True)
    if not os.path.exists(os.path.join(folder, "settings.json")):      # what the shards were made of (other_shards)
        with room_for(folder):
            write_atomic(os.path.join(folder, "settings.json"), json.dumps(settings))
    remove_stale_temps(folder, "prepare.py")            # shards a killed run (or its workers) was writing
    parts = [("val", args.val_split), ("train", args.split)] if args.val_split else [("all", args.split)]
    try:
        tokenize(args, folder, parts, lock)
    except ValueError:                 # bad input: a folder without a shard is no run to go on with
        if not any(f.endswith(".npz") for f in os.listdir(folder)):
            shutil.rmtree(folder)
        raise

    def fill(tmp):
        shutil.copyfile(os.path.join(folder, "tokenizer.tiktoken"), tmp("tokenizer.tiktoken"))
        stats = assemble(args, folder, parts, tmp("train.bin"), tmp("val.bin"))
        rule = ({"rule": "the dataset's own split", "split": args.val_split} if args.val_split else
                {"rule": "document i of shard k held out iff numpy.random.default_rng([seed, k]).random(shard_docs)[i]"
                         " < val_fraction", "val_fraction": args.val_fraction, "seed": args.seed,
                 "shard_docs": args.shard_docs})
        rule["documents"] = stats["val"]["stories"]
        return {"train": stats["train"], "val": stats["val"], "held_out": rule, "settings": settings}
    try:
        meta = write_outputs(args.out, fill)
    except ValueError:
        shutil.rmtree(folder)          # no split can be made of these settings: nothing to go on from
        raise
    shutil.rmtree(folder)
    for split in ("train", "val"):
        st = meta[split]
        print(f"{split}: {st['stories']} documents, {st['bytes']} bytes, {st['tokens']} {meta['dtype']} tokens, "
              f"{st['bytes_per_token']:.3f} bytes/token" + (f", {st['empty']} empty skipped" if st["empty"] else ""))
    return True
