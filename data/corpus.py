"""Any corpus in: the --dataset half of data/prepare.py. A Hugging Face dataset (read streaming, so FineWeb-edu's
sample-10BT never has to fit on disk or in memory) or a local parquet, jsonl or arrow file or folder (what
datasets.load_dataset reads, streamed too: no cache copy), tokenized into the same four files as the text path.

    python data/prepare.py --dataset HuggingFaceFW/fineweb-edu --name sample-10BT --vocab_size 8000 \\
                           --max_tokens 200000000 --out data/fineweb_edu
    python data/prepare.py --dataset corpus.jsonl --out data/mine          # a local file: text in its "text" field

Documents: the --text_field of each record (None or "" skipped, counted), each followed by <|endoftext|> (its id;
a document's own "<|endoftext|>" text is encoded as text). Validation: the dataset's own --val_split, or else the
documents held out by a seeded rule: in shard k (documents k*S .. k*S+S-1, S = --shard_docs), document i is
held out iff numpy.random.default_rng([seed, k]).random(S)[i] < --val_fraction. meta.json counts both splits and
says the rule. --max_tokens N: training documents up to and including the one whose tokens bring the total to N
(the validation documents read up to there are kept). The tokenizer: a BPE trained on the first --bpe_max_bytes
(UTF-8 bytes) of training documents, or --tokenizer: a tokenizer.tiktoken file, or a Hugging Face tokenizer.json
(converted by experiments/convert.py, which checks it splits text alike). A vocabulary over 65,536 tokens writes
uint32 token files; meta.json's "dtype" says which ("uint16" or "uint32"), and train.py reads both.

Nothing lost, nothing redone (data/shards.py): the documents are tokenized in shards of --shard_docs, each
written whole to --out/shards-KEY/ by one of --num_proc processes, with the stream's position after it; killed
at any moment, the same command reads on from there, tokenizes only the missing shards and assembles the same
bytes. The shards folder is removed once train.bin, val.bin, tokenizer.tiktoken and meta.json (last) are in
place. A shards folder of other settings is refused without --overwrite (its own command finishes it);
prepared data in --out is kept as on the text path.

Memory is flat in the corpus size (data/shards.py). Offline, a hub name fails in a second or two with one line (the
Hub is probed first, 10 s at most, so that datasets' own retries never run); errors are ValueError or OSError,
printed by prepare.py as one line.
"""
import contextlib
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request

from data import shards
from data.tokenizer import file_sha256, load_tokenizer, save_tokenizer, train_bpe

CORPUS_VERSION = "corpus 1"     # the shard format and the rules above: a change makes every shards folder "other"
LOCAL_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4")
CORPUS_FLAGS = {"name": None, "split": "train", "text_field": "text", "val_split": None, "val_fraction": 0.005,
                "seed": 0, "max_tokens": None, "num_proc": None, "shard_docs": 1024}   # --dataset's own flags
HUB_PROBE_S = 10


def why(e):
    """An exception as one short line: its type and the first line of its message."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


# ----------------------------------------------------------------------------- checking the command line

def check_args(args):
    """Check the --dataset flags of prepare.py's parsed `args` (argparse.Namespace) -> args (--num_proc set).
    Raises ValueError (one line) for a corpus flag without --dataset; with it: --train/--valid, the text
    files' flags, an --out inside a --dataset folder, an empty --dataset, --split or --text_field, a local
    path (by its form) that does not exist,
    --val_fraction outside (0, 1) (without --val_split), --max_tokens, --num_proc or --shard_docs < 1, --seed
    < 0, --split equal to --val_split, or a --tokenizer that is not a file or not a tokenizer (read_tokenizer)."""
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
    if path_like and not is_local(args.dataset):
        raise ValueError(f"--dataset {args.dataset}: no such file or folder (a hub name is NAME or OWNER/NAME)")
    if args.val_split is not None:
        if args.val_split == args.split:
            raise ValueError(f"--val_split {args.val_split} is the training split too")
        if args.val_fraction != CORPUS_FLAGS["val_fraction"]:
            raise ValueError("--val_split and --val_fraction are two validation rules: pass one of them")
    elif not 0 < args.val_fraction < 1:
        raise ValueError(f"--val_fraction must be in (0, 1), got {args.val_fraction}")
    for name in ("max_tokens", "num_proc", "shard_docs"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if args.tokenizer is not None:
        enc, _ = read_tokenizer(args.tokenizer)
        if args.vocab_size is not None and args.vocab_size != enc.n_vocab:
            raise ValueError(f"--vocab_size {args.vocab_size} but tokenizer {args.tokenizer} has {enc.n_vocab} tokens")
    args.num_proc = args.num_proc or os.cpu_count() or 1
    return args


def read_tokenizer(path):
    """--tokenizer `path`: a tokenizer.tiktoken rank file or a Hugging Face tokenizer.json (a byte-level BPE,
    converted by experiments.convert.read_tokenizer, which imports torch: only here) -> (tiktoken.Encoding, the
    rank file's text, str). Raises FileNotFoundError if it is not a file, ValueError if it cannot be read or
    converted (one line)."""
    from data.tokenizer import check_file
    check_file(path, "tokenizer file")
    with open(path, "rb") as f:
        head = f.read(64).lstrip()[:1]
    if head != b"{":
        enc = load_tokenizer(path)
        with open(path, encoding="ascii") as f:
            return enc, f.read()
    from experiments.convert import read_tokenizer as read_json
    enc, text, _ = read_json(path)
    return enc, text


# ----------------------------------------------------------------------------- the source

def is_local(dataset):
    """True if --dataset names a local file or folder (it wins over a hub name, as in datasets)."""
    return os.path.exists(dataset)


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


def local_files(path):
    """The files of a local --dataset: itself, or those under the folder (hidden ones left out), sorted."""
    if os.path.isfile(path):
        return [path]
    found = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [os.path.join(root, f) for f in sorted(files) if not f.startswith(".")]
    return found


def source_id(args):
    """What identifies the corpus (a JSON dict, part of the settings): the hub name, or each local file's path
    (relative to --dataset), size and sha256 (read whole: about 3 s a GB), with --name, --split, --val_split and
    --text_field. Raises ValueError for a local folder without files, OSError if one can't be read."""
    src = {"dataset": args.dataset, "name": args.name, "split": args.split, "val_split": args.val_split,
           "text_field": args.text_field}
    if is_local(args.dataset):
        files = local_files(args.dataset)
        if not files:
            raise ValueError(f"--dataset {args.dataset} is a folder without files")
        if os.path.isfile(args.dataset):
            local_format(args.dataset)
        src["dataset"] = os.path.abspath(args.dataset)
        src["files"] = [{"path": os.path.relpath(f, args.dataset) if f != args.dataset else os.path.basename(f),
                         "bytes": os.path.getsize(f), "sha256": file_sha256(f)} for f in files]
    return src


def offline():
    """True if HF_HUB_OFFLINE or HF_DATASETS_OFFLINE asks datasets to stay offline."""
    return any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in ("HF_HUB_OFFLINE",
                                                                                      "HF_DATASETS_OFFLINE"))


def check_hub(dataset, timeout=HUB_PROBE_S):
    """Raise ValueError (one line) unless the Hugging Face Hub (HF_ENDPOINT) answers an HTTP request within
    `timeout` seconds (any status counts: it answered), so that an unreachable hub fails at once instead of
    after datasets' retries (about 25 s). Skipped offline (datasets then fails by itself, at once)."""
    if offline():
        return
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    result = []

    def probe():
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
            result.append(None)
        except urllib.error.HTTPError:
            result.append(None)
        except Exception as e:              # URLError, a timeout, a bad proxy: all mean "not reached"
            result.append(e)
    t = threading.Thread(target=probe, daemon=True)   # a name lookup can outlast urlopen's timeout
    t.start()
    t.join(timeout + 1)
    if not result or result[0] is not None:
        reason = why(result[0].reason if hasattr(result[0], "reason") else result[0]) if result else "no answer"
        raise ValueError(f"dataset {dataset} could not be reached: the Hugging Face Hub ({endpoint}) does not "
                         f"answer ({reason}); check the network, or give a local parquet, jsonl or arrow path")


def open_split(args, split):
    """The documents' stream of `split` of --dataset: a datasets.IterableDataset (streaming, local files too).
    Raises ValueError (one line): a hub dataset that cannot be reached (offline, no network) or found, a
    missing config or split, a folder datasets cannot read."""
    local = is_local(args.dataset)
    if not local:
        check_hub(args.dataset)
    import datasets                       # only here: train.py and sample.py never import it
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)     # its errors come back as one line here
    datasets.disable_progress_bars()
    if "torch" not in sys.modules:        # else each stream imports torch (3-4 s) to share an epoch counter
        datasets.config.TORCH_AVAILABLE = False     # with torch's DataLoader workers, which are not used here
    builder = local_format(args.dataset) if local and os.path.isfile(args.dataset) else None
    try:
        if builder:
            return datasets.load_dataset(builder, data_files=args.dataset, split=split, streaming=True)
        return datasets.load_dataset(args.dataset, name=args.name, split=split, streaming=True)
    except ConnectionError as e:
        raise ValueError(f"dataset {args.dataset} could not be reached ({why(e)})") from None
    except Exception as e:                 # datasets' own errors: DatasetNotFoundError, a bad config or split
        raise ValueError(f"dataset {args.dataset}" + (f" --name {args.name}" if args.name else "")
                         + f" --split {split} could not be opened ({why(e)})") from None


def known_docs(args, split):
    """The number of documents of `split`, where it is cheap to know (a local parquet's metadata, a local
    .jsonl's lines) -> int, or None."""
    if not (is_local(args.dataset) and os.path.isfile(args.dataset)):
        return None
    name = args.dataset.lower()
    try:
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq
            return pq.ParquetFile(args.dataset).metadata.num_rows
        if name.endswith(".jsonl"):
            n, last = 0, b"\n"
            with open(args.dataset, "rb") as f:
                while block := f.read(1 << 24):
                    n, last = n + block.count(b"\n"), block[-1:]
            return n + (last != b"\n")
    except Exception:                      # no ETA is no error: datasets reports a bad file itself
        return None
    return None


def texts(batch, args, first):
    """The documents (list of str) of a batch of records (a dict of columns) from `first` (its first
    document's index): --text_field's values, None as "". Raises ValueError for a missing field or a value
    that is not text."""
    if args.text_field not in batch:
        raise ValueError(f"--text_field {args.text_field!r} is not a field of {args.dataset}; its fields: "
                         + ", ".join(map(repr, batch)))
    docs = batch[args.text_field]
    for i, d in enumerate(docs):
        if not isinstance(d, str):
            if d is not None:
                raise ValueError(f"document {first + i} of {args.dataset} has a {type(d).__name__} in "
                                 f"{args.text_field!r}, not text")
    return ["" if d is None else d for d in docs]


def shard_batches(args, split, start):
    """Iterate the shards of `split` from shard `start` = (index, saved state or None) -> (k, docs, state):
    shard k's documents (list of str) and the stream's position after it (a JSON-able dict, or None).
    Raises ValueError (open_split, texts), OSError if reading fails midway (naming the shard)."""
    k, state = start
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
            docs = texts(batch, args, k * args.shard_docs)
            yield k, docs, ds.state_dict()
            k += 1
    finally:
        it.close()            # now, not at exit, when pyarrow's generators print a traceback as they close


# ----------------------------------------------------------------------------- the run

def corpus_settings(args):
    """What --out's outputs depend on (a JSON dict, kept in meta.json as "settings"; its hash names the shards
    folder): the source (source_id), the validation rule, --max_tokens, --shard_docs, the vocabulary, the BPE's
    sample or the --tokenizer file's sha256, and both format versions. Not --num_proc (the outputs do not
    depend on it). Raises ValueError, OSError (source_id)."""
    from data.prepare import VERSION
    return {"version": VERSION, "corpus": CORPUS_VERSION, "source": source_id(args),
            "val_fraction": None if args.val_split else args.val_fraction,
            "seed": None if args.val_split else args.seed, "max_tokens": args.max_tokens,
            "shard_docs": args.shard_docs, "vocab_size": args.vocab_size or (None if args.tokenizer else 4096),
            "bpe_max_bytes": None if args.tokenizer else args.bpe_max_bytes,
            "tokenizer_sha256": file_sha256(args.tokenizer) if args.tokenizer else None}


def keep_rule(args, settings, folder):
    """prepare.py's rule for what --out holds, with the shards: True to go on (making or resuming `folder`),
    False (after a line saying so) when --out holds this data already. Raises ValueError (one line) when --out
    holds other or damaged prepared data, or another run's shards folder, without --overwrite (with it, the
    other shards are removed). A shards folder of these settings means an allowed run was stopped: it goes on."""
    from data.prepare import held_outputs
    resuming = os.path.isdir(folder)
    others = sorted(d for d in os.listdir(args.out) if d.startswith("shards-") and d != os.path.basename(folder))
    held = None if args.overwrite else held_outputs(args.out, settings)
    if held == "same":
        if resuming:                    # the run was stopped after its outputs were in place
            shutil.rmtree(folder)
        print(f"{args.out} already holds this data, prepared from the same corpus with the same settings: "
              "nothing to do (--overwrite prepares it again)")
        return False
    if held is not None and not resuming:
        raise ValueError(f"{args.out} already holds prepared data " + ("of other settings or text" if held == "other"
                         else f"that is damaged: {held}") + "; pass --overwrite to replace it, or choose another --out")
    if others and not args.overwrite:
        raise ValueError(f"{args.out} holds the shards of an unfinished --dataset run of other settings "
                         f"({others[0]}): run its command again to finish it, or pass --overwrite to drop them")
    for d in others:
        shutil.rmtree(os.path.join(args.out, d))
        print(f"prepare.py: note: removed {d}, the shards of an unfinished run of other settings", file=sys.stderr)
    return True


def make_tokenizer(args, folder, parts):
    """The tokenizer of the run, saved once in `folder` (a later run reuses it) -> its path: --tokenizer's rank
    file (read_tokenizer), or a BPE of --vocab_size (default 4096) trained on the first --bpe_max_bytes of UTF-8
    text of the training documents (held-out ones left out). Raises ValueError if there is no training text or
    too little for the vocabulary, OSError if writing fails."""
    path = os.path.join(folder, "tokenizer.tiktoken")
    if os.path.exists(path):
        return path
    if args.tokenizer is not None:
        text = read_tokenizer(args.tokenizer)[1]
        shards.write_whole(path, lambda f: f.write(text.encode("ascii")))
        return path
    part, split = parts[-1]
    sample, size = [], 0
    with contextlib.closing(shard_batches(args, split, (0, None))) as batches:
        for k, docs, _ in batches:
            for d, held in zip(docs, shards.held_out(args, part, k, len(docs))):
                if d and not held:
                    sample.append(d)
                    size += len(d.encode("utf-8"))
            if 0 < args.bpe_max_bytes < size:
                break
    if not sample:
        raise ValueError(f"{args.dataset} has no training text (no non-empty document in --split {split})")
    print(f"training the BPE on the first {len(sample)} training documents ({size / 1e6:.1f} MB) of "
          f"{args.dataset}", flush=True)
    ranks = train_bpe(sample, args.vocab_size or 4096, verbose=True)
    del sample
    tmp = os.path.join(folder, f".tokenizer.tiktoken.tmp{os.getpid()}")
    save_tokenizer(ranks, tmp)
    os.replace(tmp, path)
    return path


def finish(args, folder, parts, settings, tok_path):
    """Assemble the split files (shards.assemble) and put the four outputs in --out: temporary files renamed
    into place, meta.json last; then remove the shards folder -> meta (dict). Raises ValueError, OSError; a
    failure leaves --out's outputs as they were (a rename of several files is not one step: a kill between two
    leaves the shards folder, and the same command then assembles again)."""
    tmps = []

    def tmp(name):
        tmps.append((os.path.join(args.out, f".{name}.tmp{os.getpid()}"), name))
        return tmps[-1][0]
    try:
        stats = shards.assemble(args, folder, parts, tmp)
        enc = load_tokenizer(tok_path)
        shutil.copyfile(tok_path, tmp("tokenizer.tiktoken"))
        from data.tokenizer import tokenizer_sha256
        rule = ({"rule": "the dataset's own split", "split": args.val_split} if args.val_split else
                {"rule": "document i of shard k held out iff numpy.random.default_rng([seed, k]).random(shard_docs)[i]"
                         " < val_fraction", "val_fraction": args.val_fraction, "seed": args.seed,
                 "shard_docs": args.shard_docs})
        rule["documents"] = stats["val"]["stories"]
        meta = {"vocab_size": enc.n_vocab, "eot_id": enc.eot_token, "tokenizer": "tokenizer.tiktoken",
                "tokenizer_sha256": tokenizer_sha256(tok_path), "dtype": "uint16" if enc.n_vocab <= 65536 else "uint32",
                "train": stats["train"], "val": stats["val"], "held_out": rule, "settings": settings}
        with open(tmp("meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
        for t, name in tmps:
            os.replace(t, os.path.join(args.out, name))
        tmps.clear()
    finally:
        for t, _ in tmps:
            if os.path.exists(t):
                os.remove(t)
    shutil.rmtree(folder)
    return meta


def start_pool(n, lock):
    """A pool of n tokenizing processes (shards.worker_init): forked where the system can (made before datasets
    starts any thread; each closes its copy of the locked descriptor `lock`), else spawned."""
    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork").Pool(n, shards.worker_init, (lock,))
    return multiprocessing.get_context().Pool(n, shards.worker_init, (None,))


def prepare_corpus(args, lock=None):
    """prepare.py --dataset's work on checked `args` (check_args), with --out made and locked (`lock`: the
    locked descriptor, int, or None): keep what --out holds (keep_rule), make or reuse the tokenizer, tokenize
    the missing shards of each part (shards.produce, --num_proc processes), assemble and put the outputs in
    place (finish) -> 0. Raises ValueError (bad input, one line) or OSError (reading or writing failed);
    KeyboardInterrupt goes through, with the pool stopped and no temporary file left in the shards folder."""
    t0 = time.time()
    settings = corpus_settings(args)
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    folder = os.path.join(args.out, f"shards-{key}")
    if not keep_rule(args, settings, folder):
        return 0
    os.makedirs(folder, exist_ok=True)
    parts = [("val", args.val_split), ("train", args.split)] if args.val_split else [("all", args.split)]
    pool = start_pool(args.num_proc, lock) if args.num_proc > 1 else None
    try:
        shards.remove_temps(folder)
        for _, split in parts:          # a missing split or config fails before the BPE is trained
            open_split(args, split)
        tok_path = make_tokenizer(args, folder, parts)

        def submit(path, docs, val):
            if pool is None:
                return shards.Done(shards.encode_shard(tok_path, path, docs, val))
            return pool.apply_async(shards.encode_shard, (tok_path, path, docs, val))
        ctx = shards.Context(args, folder, submit, args.num_proc + 1, lambda split, start:
                             shard_batches(args, split, start), lambda split: known_docs(args, split))
        for part, split in parts:
            shards.produce(ctx, part, split)
    except ValueError:                 # bad input: a folder without a shard is no run to go on with
        if not any(f.endswith(".npz") for f in os.listdir(folder)):
            shutil.rmtree(folder)
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        shards.remove_temps(folder)
    try:
        meta = finish(args, folder, parts, settings, tok_path)
    except ValueError:
        shutil.rmtree(folder)          # no split can be made of these settings: nothing to go on from
        raise
    for split in ("train", "val"):
        st = meta[split]
        print(f"{split}: {st['stories']} documents, {st['bytes']} bytes, {st['tokens']} tokens, "
              f"{st['bytes_per_token']:.3f} bytes/token" + (f", {st['empty']} empty skipped" if st["empty"] else ""))
    print(f"wrote {args.out} ({meta['dtype']} tokens, vocabulary {meta['vocab_size']}) in {time.time() - t0:.1f}s "
          "total")
    return 0
