"""Where data/prepare.py's text comes from: the TinyStories download (download), and for --dataset
(data/corpus.py) what a local file or folder is (its format, its files' identity), whether the Hugging Face Hub
answers, and the documents' stream, a shard at a time, resumable from a position. Errors: ValueError (bad
input, one line) or OSError (a read that failed midway).
"""
import importlib
import importlib.util
import json
import os
import sys
import threading

if __name__ == "__main__":       # before the imports that need the repository root on the path
    print("source.py: error: data/prepare.py's --dataset source, not a command: python data/prepare.py --help",
          file=sys.stderr)
    sys.exit(2)

from data.tokenizer import file_sha256  # noqa: E402

LOCAL_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".arrow": "arrow"}
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4")
DECOMPRESSORS = {".zst": "zstandard", ".lz4": "lz4"}      # the packages datasets reads these with (not installed by
                                                          # requirements.txt)


def why(e):
    """An exception as one short line: its type and the first line of its message."""
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def data_format(path):
    """datasets' builder for a local file by its extension ('parquet', 'json', 'arrow'; .gz etc. looked through),
    or None for a file of another kind. Raises ValueError for a .zst or .lz4 whose decompressor (DECOMPRESSORS)
    is not installed."""
    name = path.lower()
    for ext in COMPRESSED:
        if name.endswith(ext):
            if ext in DECOMPRESSORS and importlib.util.find_spec(DECOMPRESSORS[ext]) is None:
                raise ValueError(f"--dataset {path}: reading {ext} files needs the {DECOMPRESSORS[ext]} package: "
                                 f"pip install {DECOMPRESSORS[ext]}")
            name = name[:-len(ext)]
    return LOCAL_FORMATS.get(os.path.splitext(name)[1])


def local_format(path):
    """data_format of a local file given as --dataset. Raises ValueError for a file of another kind (naming the
    text path for a .txt) or one without its decompressor."""
    fmt = data_format(path)
    if fmt is None:
        hint = " (a .txt of <|endoftext|>-separated stories: --train/--valid)" if path.lower().endswith(".txt") else ""
        raise ValueError(f"--dataset {path}: not a .parquet, .jsonl, .json or .arrow file{hint}")
    return fmt


def source_id(args):
    """What identifies the corpus (a JSON dict, part of the settings): the hub name, or each local file's path
    (relative to --dataset; hidden ones left out, as datasets leaves them), size and sha256 (read whole: about
    3 s a GB), with --name, --split, --val_split and --text_field. Raises ValueError for a local folder without
    files or with data files of two formats, a file of another format, an empty file, OSError if one can't be
    read."""
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
        kinds = {}
        for f, rel in files:
            kinds.setdefault(data_format(f), rel)
        kinds.pop(None, None)
        if len(kinds) > 1:          # datasets would read one format of the folder and leave the rest out
            raise ValueError(f"--dataset {args.dataset} holds files of {len(kinds)} formats (" + ", ".join(
                f"{rel}: {fmt}" for fmt, rel in kinds.items()) + "); a folder is read in one format: give a folder "
                "of one format, or each file alone")
    else:
        return src
    if not any(os.path.getsize(f) for f, _ in files):
        raise ValueError(f"--dataset {args.dataset} holds no document: " + ("an empty file" if len(files) == 1
                                                                             else "its files are empty"))
    src["dataset"] = os.path.abspath(args.dataset)
    src["files"] = [{"path": rel, "bytes": os.path.getsize(f), "sha256": file_sha256(f)} for f, rel in files]
    return src


def offline_asked():
    """True if HF_HUB_OFFLINE or HF_DATASETS_OFFLINE asks the Hugging Face libraries to stay offline."""
    return any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in ("HF_HUB_OFFLINE",
                                                                                  "HF_DATASETS_OFFLINE"))


def hub_unreachable(timeout=10, dataset="roneneldan/TinyStories"):
    """Why the Hugging Face Hub (HF_ENDPOINT) does not answer within `timeout` seconds (one short line), or
    None when it answers: huggingface_hub's dataset_info of `dataset`, where any HTTP status (a dataset not
    found too) is an answer. Here, in data/prepare.py's download and in experiments/eval_tasks.py, so that an
    unreachable hub fails or goes offline at once instead of after the hub client's retries (about 25 s)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError
    result = []

    def probe():
        try:
            HfApi(endpoint=os.environ.get("HF_ENDPOINT")).dataset_info(dataset, timeout=timeout)
        except HfHubHTTPError:                  # a status: it answered
            pass
        except Exception as e:                  # no connection, a timeout, a bad proxy: "not reached"
            result.append(why(e))
        result.append(None)
    t = threading.Thread(target=probe, daemon=True)   # a name lookup can outlast the request's timeout
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
        flag = "--val_split" if args.val_split is not None and split == args.val_split else "--split"
        raise ValueError(f"dataset {args.dataset}" + (f" --name {args.name}" if args.name else "")
                         + f" {flag} {split} could not be opened ({why(e)})") from None


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
    """The shards of `split` from shard k, the stream resumed at `state` (a position read_shards gave, as a dict; None:
    from the start) -> iterator of (k, docs, position): shard k's documents (list of str: --text_field's values,
    None and whitespace only read as "") and the stream's position after it (a JSON str; "" if it is not JSON).
    Raises ValueError (open_split; a missing --text_field, a value that is not text, a record that cannot be read),
    OSError if reading fails midway (naming the shard)."""
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
                raise ValueError(bad_json_line(args.dataset) or f"{args.dataset}: shard {k} (documents from "
                                 f"{k * args.shard_docs}) cannot be read ({why(e)})") from None
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
            yield k, [d if d is not None and not d.isspace() else "" for d in docs], position
            k += 1
    finally:
        it.close()            # now, not at exit, when pyarrow's generators print a traceback as they close


def bad_json_line(dataset):
    """Where a local JSON-lines --dataset (a file, or a folder's .jsonl files, compressed or not) first holds a
    line that is not a JSON record -> 'FILE: line N is not a JSON record (why)', or None (none found, another
    format, a hub name): pyarrow names a row within its block of the file, not the file's line."""
    import bz2
    import gzip
    import lzma
    files = [dataset] if os.path.isfile(dataset) else sorted(
        os.path.join(root, f) for root, _, names in os.walk(dataset) for f in names if not f.startswith(".")) \
        if os.path.isdir(dataset) else []
    opens = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
    for path in files:
        try:
            if data_format(path) != "json" or ".jsonl" not in path.lower():
                continue
            with opens.get(os.path.splitext(path)[1].lower(), open)(path, "rt", encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            json.loads(line)
                        except ValueError as e:
                            return f"{path}: line {n} is not a JSON record ({why(e)})"
        except (OSError, ValueError):       # a decompressor not installed, bytes that are not UTF-8: not found here
            continue
    return None


TINYSTORIES = "roneneldan/TinyStories"   # the Hugging Face Hub dataset the default text is downloaded from


def download(name, raw_dir):
    """TinyStories' file `name` (TinyStories-train.txt, -valid.txt) into raw_dir, skipped if already there,
    from the Hugging Face Hub: huggingface_hub's hf_hub_download (a stopped download resumed, the file checked
    against the hub's, HF_ENDPOINT and HF_HUB_OFFLINE honoured, renamed into place when whole), its progress
    outputs.progress_bar's. -> the local path. Raises the hub's errors (OSError and others) when it fails,
    ConnectionError at once when the hub does not answer (source.hub_unreachable) or HF_HUB_OFFLINE is set."""
    path = os.path.join(raw_dir, name)
    if os.path.exists(path):
        return path
    reason = "HF_HUB_OFFLINE asks for no network" if offline_asked() else hub_unreachable()
    if reason is not None:
        raise ConnectionError(f"the Hugging Face Hub is not reached: {reason}")
    from huggingface_hub import hf_hub_download
    from data.outputs import progress_bar
    return hf_hub_download(TINYSTORIES, name, repo_type="dataset", local_dir=raw_dir,
                           endpoint=os.environ.get("HF_ENDPOINT"),
                           tqdm_class=lambda desc=None, **kw: progress_bar(f"downloading {desc}", **kw))
