"""Any corpus in: the --dataset half of data/prepare.py. A Hugging Face dataset (read streaming, so FineWeb-edu's
sample-10BT never has to fit on disk or in memory) or a local parquet, jsonl or arrow file or folder (what
datasets.load_dataset reads, streamed too: no cache copy), tokenized into the same four files as the text path.

    python data/prepare.py --dataset HuggingFaceFW/fineweb-edu --name sample-10BT --vocab_size 8000 \\
                           --max_tokens 200000000 --out data/fineweb_edu
    python data/prepare.py --dataset corpus.jsonl --out data/mine          # a local file: text in its "text" field

Documents: the --text_field of each record (None or "" skipped, counted), each followed by <|endoftext|> (its id;
the text "<|endoftext|>" in a document is encoded as text). Validation: the dataset's own --val_split, or the
documents held out by a seeded rule: in shard k (documents k*S .. k*S+S-1, S = --shard_docs), document i is
held out iff numpy.random.default_rng([seed, k]).random(S)[i] < --val_fraction. --max_tokens N: the training
documents up to the one whose tokens bring the total to N. The tokenizer and the outputs: as the text path's
(data/outputs.py: write_tokenizer, keep_outputs, write_outputs); past 65,536 tokens the token files are uint32.

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
import threading
import urllib.error
import urllib.request
from collections import deque

import numpy as np

if __name__ == "__main__":       # before the imports that need the repository root on the path
    print("corpus.py: error: data/prepare.py's --dataset, not a command: python data/prepare.py --help", file=sys.stderr)
    sys.exit(2)

from data.outputs import VERSION, Progress, keep_outputs, write_outputs, write_tokenizer
from data.tokenizer import file_sha256, load_tokenizer
from harness.cli import remove_stale_temps, written

CORPUS_VERSION = "corpus 2"     # the shard format and the rules above: a change makes every shards folder "other"
LOCAL_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4")
CORPUS_FLAGS = {"name": None, "split": "train", "text_field": "text", "val_split": None, "val_fraction": 0.005,
                "seed": 0, "max_tokens": None, "num_proc": None, "shard_docs": 1024}   # --dataset's own flags


def why(e):
    """An exception as one short line: its type and the first line of its message."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def check_args(args):
    """Check the --dataset flags of prepare.py's parsed `args` (argparse.Namespace; their types checked there)
    -> args, --num_proc set. Raises ValueError (one line) for a corpus flag without --dataset; with it:
    --train/--valid, the text files' flags, an --out inside a --dataset folder, an empty --dataset, --split or
    --text_field, a local path (by its form) that does not exist, --val_split equal to --split or beside
    --val_fraction, a --val_fraction outside (0, 1)."""
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
    if args.val_split is not None:
        if args.val_split == args.split:
            raise ValueError(f"--val_split {args.val_split} is the training split too")
        if args.val_fraction != CORPUS_FLAGS["val_fraction"]:
            raise ValueError("--val_split and --val_fraction are two validation rules: pass one of them")
    elif not 0 < args.val_fraction < 1:
        raise ValueError(f"--val_fraction must be in (0, 1), got {args.val_fraction}")
    args.num_proc = args.num_proc or os.cpu_count() or 1
    return args


# ----------------------------------------------------------------------------- the source

def local_format(path):
    """datasets' builder for a local file by its extension ('parquet', 'json', 'arrow'; .gz etc. looked
    through). Raises ValueError for any other file."""
    name = path.lower()
    for ext in COMPRESSED:
        name = name[:-len(ext)] if name.endswith(ext) else name
    fmt = LOCAL_FORMATS.get(os.path.splitext(name)[1])
    if fmt is None:
        hint = " (a .txt of <|endoftext|>-separated stories: --train/--valid)" if name.endswith(".txt") else ""
        raise ValueError(f"--dataset {path}: not a .parquet, .jsonl, .json or .arrow file{hint}")
    return fmt


def source_id(args):
    """What identifies the corpus (a JSON dict, part of the settings): the hub name, or each local file's path
    (relative to --dataset; hidden ones left out, as datasets leaves them), size and sha256 (read whole: about
    3 s a GB), with --name, --split, --val_split and --text_field. Raises ValueError for a local folder without
    files or a file of another format, OSError if one can't be read."""
    src = {"dataset": args.dataset, "name": args.name, "split": args.split, "val_split": args.val_split,
           "text_field": args.text_field}
    if os.path.isfile(args.dataset):
        local_format(args.dataset)
        files = [(args.dataset, os.path.basename(args.dataset))]
    elif os.path.isdir(args.dataset):
        files = []
        for root, dirs, names in os.walk(args.dataset):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files += [(os.path.join(root, f), os.path.relpath(os.path.join(root, f), args.dataset))
                      for f in sorted(names) if not f.startswith(".")]
        if not files:
            raise ValueError(f"--dataset {args.dataset} is a folder without files")
    else:
        return src
    src["dataset"] = os.path.abspath(args.dataset)
    src["files"] = [{"path": rel, "bytes": os.path.getsize(f), "sha256": file_sha256(f)} for f, rel in files]
    return src


def offline_asked():
    """True if HF_HUB_OFFLINE or HF_DATASETS_OFFLINE asks the Hugging Face libraries to stay offline."""
    return any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in ("HF_HUB_OFFLINE",
                                                                                  "HF_DATASETS_OFFLINE"))


def hub_unreachable(timeout=10):
    """Why the Hugging Face Hub (HF_ENDPOINT) does not answer an HTTP request within `timeout` seconds (one short
    line), or None when it answers (any status: it answered). Here and in experiments/eval_tasks.py, so that an
    unreachable hub fails or goes offline at once instead of after the hub client's retries (about 25 s)."""
    endpoint, result = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/"), []

    def probe():
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
        except urllib.error.HTTPError:          # a status: it answered
            pass
        except Exception as e:                  # URLError, a timeout, a bad proxy: all mean "not reached"
            result.append(why(e))
        result.append(None)
    t = threading.Thread(target=probe, daemon=True)   # a name lookup can outlast urlopen's timeout
    t.start()
    t.join(timeout + 1)
    return result[0] if result else f"no answer in {timeout:.0f} s"


def check_hub(dataset):
    """Raise ValueError (one line) unless the Hugging Face Hub answers (hub_unreachable). Skipped offline
    (offline_asked: datasets then fails by itself, at once)."""
    reason = None if offline_asked() else hub_unreachable()
    if reason is not None:
        raise ValueError(f"dataset {dataset} could not be reached: the Hugging Face Hub does not answer ({reason}); "
                         "check the network, or give a local parquet, jsonl or arrow path")


def open_split(args, split):
    """The documents' stream of `split` of --dataset: a datasets.IterableDataset (streaming, local files too).
    Raises ValueError (one line): a hub dataset that cannot be reached (offline, no network) or found, a
    missing config or split, a folder datasets cannot read."""
    local = os.path.exists(args.dataset)
    if not local:
        check_hub(args.dataset)
    import datasets                       # only here: train.py and sample.py never import it
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)     # its errors come back as one line here
    datasets.disable_progress_bars()
    if "torch" not in sys.modules:        # else each stream imports torch (3-4 s) to share an epoch counter
        datasets.config.TORCH_AVAILABLE = False     # with torch's DataLoader workers, which are not used here
    try:
        if local and os.path.isfile(args.dataset):
            return datasets.load_dataset(local_format(args.dataset), data_files=args.dataset, split=split,
                                         streaming=True)
        return datasets.load_dataset(args.dataset, name=args.name, split=split, streaming=True)
    except ConnectionError as e:
        raise ValueError(f"dataset {args.dataset} could not be reached ({why(e)})") from None
    except Exception as e:                 # datasets' own errors: DatasetNotFoundError, a bad config or split
        raise ValueError(f"dataset {args.dataset}" + (f" --name {args.name}" if args.name else "")
                         + f" --split {split} could not be opened ({why(e)})") from None


def known_docs(args):
    """The number of documents of a local parquet file (its metadata) or .jsonl file (its lines), for the ETA
    -> int, or None (any other source, or a file that datasets will report bad itself)."""
    try:
        if os.path.isfile(args.dataset) and args.dataset.lower().endswith(".parquet"):
            import pyarrow.parquet as pq
            return pq.ParquetFile(args.dataset).metadata.num_rows
        if os.path.isfile(args.dataset) and args.dataset.lower().endswith(".jsonl"):
            with open(args.dataset, "rb") as f:        # its newlines: its lines, near enough for an ETA
                return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 24), b""))
    except Exception:
        return None


def read_shards(args, split, k=0, state=None):
    """The shards of `split` from shard k, the stream resumed at `state` (a position read_shards gave, as a
    dict; None: from the start) -> iterator of (k, docs, position): shard k's documents (list of str:
    --text_field's values, None read as "") and the stream's position after it (a JSON str; "" if it is not
    JSON). Raises ValueError (open_split; a missing --text_field, a value that is not text, a record that
    cannot be read), OSError if reading fails midway (naming the shard)."""
    ds = open_split(args, split)
    if state is not None:
        ds.load_state_dict(state)
    it = iter(ds.iter(batch_size=args.shard_docs))
    try:
        while True:
            try:
                batch = next(it)
            except StopIteration:
                return
            except ValueError as e:       # a record that cannot be read (pyarrow's ArrowInvalid is a ValueError)
                raise ValueError(f"{args.dataset}: shard {k} (documents from {k * args.shard_docs}) cannot be "
                                 f"read ({why(e)})") from None
            except Exception as e:
                raise OSError(f"reading {args.dataset} failed at shard {k} ({why(e)}); run the same command "
                              "again to go on from the last shard written") from None
            if args.text_field not in batch:
                raise ValueError(f"--text_field {args.text_field!r} is not a field of {args.dataset}; its fields: "
                                 + ", ".join(map(repr, batch)))
            docs = batch[args.text_field]
            for i, d in enumerate(docs):
                if d is not None and not isinstance(d, str):
                    raise ValueError(f"document {k * args.shard_docs + i} of {args.dataset} has a "
                                     f"{type(d).__name__} in {args.text_field!r}, not text")
            try:
                position = json.dumps(ds.state_dict())
            except (TypeError, ValueError):
                position = ""
            yield k, ["" if d is None else d for d in docs], position
            k += 1
    finally:
        it.close()            # now, not at exit, when pyarrow's generators print a traceback as they close


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
    bytes), val, position. Returns summary(). Raises OSError if writing fails."""
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
    with written(path) as tmp, open(tmp, "wb") as f:
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
    progress = Progress(f"{split} (training and held out)" if part == "all" else f"{part} ({split})")
    count = dict.fromkeys(("docs", "empty", "train_tokens", "val_tokens", "bytes"), 0)

    def add(s):             # a shard's summary, in order; done: of the documents (if known) or of --max_tokens
        for key, v in s.items():
            count[key] += v
        done = max((count["docs"] + count["empty"]) / total if total else 0,
                   count["train_tokens"] / goal if goal else 0)
        progress.update(count["bytes"] / 1e6, count["docs"], count["train_tokens"] + count["val_tokens"], min(done, 1))

    def take():
        task = pending.popleft()
        add(task if isinstance(task, dict) else task.get())

    def reached():
        return goal is not None and count["train_tokens"] >= goal
    for s in kept:
        add(s)
    pending = deque()
    with contextlib.closing(read_shards(args, split, n, state)) as shards:
        for k, docs, position in () if reached() else shards:
            if k == n:
                progress.begin()              # the rates count from the stream's first shard
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
    progress.end()


# ----------------------------------------------------------------------------- the run

def assemble(args, folder, parts, train_path, val_path):
    """Write the split files train_path and val_path from each part's shards in order (the training tokens cut
    after the document that brings them to --max_tokens) -> {split: {tokens, bytes, stories (non-empty
    documents), empty, bytes_per_token}}. Raises ValueError if a split is empty, OSError if reading or writing
    fails."""
    stats = {s: dict.fromkeys(("tokens", "bytes", "stories", "empty"), 0) for s in ("train", "val")}
    with open(train_path, "wb") as ftrain, open(val_path, "wb") as fval:
        for part, _ in parts:
            goal, progress, k = args.max_tokens if part != "val" else None, Progress(f"assembling {part}"), 0
            while os.path.exists(shard_path(folder, part, k)) and not (goal and stats["train"]["tokens"] >= goal):
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
    for split, st in stats.items():
        if not st["tokens"]:
            raise ValueError(f"no {'validation' if split == 'val' else 'training'} text: " + (
                f"the held-out rule (--val_fraction {args.val_fraction}) kept none of the "
                f"{stats['train']['stories']} documents; give a larger --val_fraction" if split == "val" and
                args.val_split is None else f"{args.dataset} has no non-empty document in its {split} split"))
        st["bytes_per_token"] = st["bytes"] / st["tokens"]
    return stats


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
            with contextlib.closing(read_shards(args, split)) as shards, written(tok_path) as tmp:
                training = ([d for d, held in zip(docs, held_out(args, part, k, len(docs))) if d and not held]
                            for k, docs, _ in shards)
                write_tokenizer(args, training, tmp, f"{args.dataset} --split {split}")

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
        raise ValueError(f"{args.out} holds the shards of an unfinished --dataset run of other settings "
                         f"({others[0]}): run its command again to finish it, or pass --overwrite to drop them")
    for d in others:
        shutil.rmtree(os.path.join(args.out, d))
        print(f"prepare.py: note: removed {d}, the shards of an unfinished run of other settings", file=sys.stderr)
    os.makedirs(folder, exist_ok=True)
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
