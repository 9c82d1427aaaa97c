"""Prepare TinyStories for training: train a byte-level BPE tokenizer on the
training text, encode both splits and write them as uint16 token streams.

    python data/prepare.py                       # download the two .txt files
    python data/prepare.py --train ../shared/data/tinystories/train.txt \\
                           --valid ../shared/data/tinystories/valid.txt
    python data/prepare.py --dataset HuggingFaceFW/fineweb-edu --name sample-10BT --max_tokens 200000000 \\
                           --vocab_size 8000 --out data/fineweb_edu   # any corpus: data/corpus.py

Outputs in --out (default data/tinystories next to this file):
    tokenizer.tiktoken  tiktoken rank file: "base64(token bytes) rank" per line
    train.bin, val.bin  uint16 token ids (uint32 past 65,536 tokens), each story followed by <|endoftext|>
    meta.json           vocab_size, eot_id, tokenizer sha256, dtype, per-split counts, the settings

--dataset NAME_OR_PATH reads a Hugging Face dataset (streaming) or a local parquet, jsonl or arrow file or
folder instead of the text files, in resumable shards: a killed run, run again, goes on where it stopped and
writes the same bytes (data/corpus.py says how).

Tokenizer: ranks 0..255 are the single bytes, merges get ranks 256.., and
<|endoftext|> is the special token vocab_size-1 (vocab_size-257 merges).
Bits per byte = (mean nats per token) / ln 2 / bytes_per_token.
All outputs are written to temporary names (.NAME.tmpPID) and renamed only at the end, so a
failed run never leaves a half-written file behind. One run at a time writes to an --out folder
(a lock on the folder; a second run exits 2); a run removes the temporary files a killed run
left behind (of pids no longer alive), with a note. Ctrl-C exits 130 with --out as it was.
An --out that already holds prepared data is kept: a run with the same settings on the same
(unchanged) text says so and does nothing; any other run exits 2 unless --overwrite is given.
"""
import os
import sys

if __name__ == "__main__":     # as data/prepare.py: the repository root on the path (data.tokenizer, cli);
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from harness import cli                 # then Ctrl-C is one line from here; a closed stdout stops no run
    cli.begin("prepare.py", keep=True)
import argparse  # noqa: E402
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from harness.cli import remove_stale_temps, run_command  # noqa: E402
from harness.flags import ArgumentParser, number  # noqa: E402
from data.tokenizer import EOT, check_file, file_sha256, load_tokenizer, tokenizer_sha256  # noqa: E402
from data.outputs import (NO_ROOM, VERSION, NoRoom, Progress, keep_outputs, lock_out,  # noqa: E402
                          read_tokenizer, write_outputs, write_tokenizer)
from data.source import download, why  # noqa: E402
from data import corpus  # noqa: E402

EOT_BYTES = EOT.encode("ascii")
DATA_DIR = os.path.dirname(os.path.abspath(__file__))


def split_stories(text):
    """Split text on <|endoftext|> into a list of stripped, non-empty stories (str).
    A text without any separator is returned as one story, with a warning on stderr."""
    if EOT not in text:
        print("prepare.py: warning: no <|endoftext|> separator found, "
              "treating the whole text as one story", file=sys.stderr)
    return [s.strip() for s in text.split(EOT) if s.strip()]


class StoryStream:
    """The stories of a UTF-8 text file, read in chunks of about chunk_bytes bytes: iterating yields one
    list of stories (stripped, non-empty str, as split_stories gives) per chunk, cut after its last
    <|endoftext|> (the tail carried over), so no story is cut in two and the lists together equal
    split_stories(whole text). Memory: chunk_bytes plus the longest story, whatever the file size.

    A byte sequence that is not UTF-8 raises ValueError naming the file, its byte offset and story number
    (1-based: 1 + the number of separators before it); with skip_bad_utf8=True that story is left out
    instead and recorded in self.skipped as (byte offset, story number). Counters after (or during)
    iteration: bytes_read, chunks, skipped, saw_separator, size (file bytes). Raises FileNotFoundError if
    path is not a file (check_file), ValueError if chunk_bytes < 1."""

    def __init__(self, path, chunk_bytes=8 << 20, skip_bad_utf8=False):
        check_file(path)
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        self.path, self.chunk_bytes, self.skip_bad_utf8 = path, chunk_bytes, skip_bad_utf8
        self.size = os.path.getsize(path)       # the counters are set by each iteration (__iter__)

    def _stories(self, part, offset):
        """Stories of `part` (bytes from file offset `offset` up to a separator or the
        end of file; a separator-joined run of whole segments)."""
        n_sep = part.count(EOT_BYTES)
        try:
            segs = part.decode("utf-8").split(EOT)
        except UnicodeDecodeError as e:
            story = self.segments + part.count(EOT_BYTES, 0, e.start) + 1
            if not self.skip_bad_utf8:
                raise ValueError(f"{self.path} is not valid UTF-8 at byte offset {offset + e.start} "
                                 f"(story {story}); pass --skip_bad_utf8 to skip such stories") from None
            segs, pos = [], offset
            for i, b in enumerate(part.split(EOT_BYTES)):
                try:
                    segs.append(b.decode("utf-8"))
                except UnicodeDecodeError as e2:
                    self.skipped.append((pos + e2.start, self.segments + i + 1))
                    print(f"prepare.py: warning: {self.path}: story {self.segments + i + 1} skipped, "
                          f"not valid UTF-8 at byte offset {pos + e2.start}", file=sys.stderr)
                pos += len(b) + len(EOT_BYTES)
        self.segments += n_sep + 1
        self.saw_separator |= n_sep > 0
        return [t for t in (s.strip() for s in segs) if t]

    def __iter__(self):
        self.bytes_read = self.chunks = self.segments = 0
        self.skipped, self.saw_separator = [], False
        pending, pending_len = [], 0      # the unfinished segment: pieces of bytes
        L = len(EOT_BYTES)
        tail = b""                        # the last L-1 bytes of the pending pieces
        with open(self.path, "rb") as f:
            while True:
                data = f.read(self.chunk_bytes)
                self.bytes_read += len(data)
                if not data:                                   # end of file: the last segment
                    if pending_len:
                        self.chunks += 1
                        yield self._stories(b"".join(pending), self.bytes_read - pending_len)
                    return
                if EOT_BYTES not in tail + data[:L - 1] and EOT_BYTES not in data:
                    pending.append(data)                       # a story longer than a chunk
                    pending_len += len(data)
                    tail = (tail + data[-(L - 1):])[-(L - 1):]
                    continue
                buf = b"".join(pending) + data if pending else data
                start = self.bytes_read - len(buf)
                cut = buf.rfind(EOT_BYTES)
                self.saw_separator = True          # (the one at `cut` is not in the part before it)
                pending = [buf[cut + L:]]
                pending_len = len(pending[0])
                tail = pending[0][-(L - 1):]
                self.chunks += 1
                yield self._stories(buf[:cut], start)


def encode_stream(enc, stream, out, label="", num_threads=None, progress_s=5.0):
    """Encode the stories of `stream` (an iterable of lists of str, e.g. a StoryStream), each followed by
    <|endoftext|>, writing uint16 token ids to the binary file object `out` as they come: the result
    equals encoding all the stories at once (tested). Each list is joined into a few texts
    "s1<|endoftext|>s2<|endoftext|>..."
    that tiktoken encodes on num_threads threads (default: all cores) straight into numpy (tiktoken encodes
    the pieces between special tokens independently, so this is per-story encoding). Prints progress (MB
    done, MB/s, ETA: Progress) every progress_s seconds when the stream has a `size`. Returns {"tokens",
    "bytes", "stories"} (bytes: UTF-8 bytes of the stripped stories). Raises ValueError if a token id does
    not fit in uint16, OSError if writing fails."""
    threads = num_threads or os.cpu_count() or 1
    n_tok = n_bytes = n_stories = 0
    size = getattr(stream, "size", 0)
    progress = Progress(label, size / 1e6, progress_s) if size else contextlib.nullcontext()
    with ThreadPoolExecutor(threads) as ex, progress:
        for stories in stream:
            if not stories:
                continue
            k = -(-len(stories) // (4 * threads))
            texts = [EOT.join(stories[i:i + k]) + EOT for i in range(0, len(stories), k)]
            for ids in ex.map(lambda t: enc.encode_to_numpy(t, allowed_special={EOT}), texts):
                if ids.size and int(ids.max()) >= 65536:
                    raise ValueError("token ids do not fit in uint16 (vocab_size > 65536)")
                out.write(ids.astype(np.uint16).tobytes())
                n_tok += int(ids.size)
            n_bytes += sum(len(t.encode("utf-8")) for t in texts) - len(EOT) * len(stories)
            n_stories += len(stories)
            if size:
                progress.update(stream.bytes_read / 1e6)
    return {"tokens": n_tok, "bytes": n_bytes, "stories": n_stories}


# ----------------------------------------------------------------------------- the output folder

def prepare_settings(args, paths):
    """What --out's outputs depend on (a JSON dict, kept in meta.json as "settings"): the training and
    validation text (size in bytes and sha256 of the contents, wherever the files lie: about 3 s a GB
    on a CPU core), the vocabulary, the BPE's sample, the --tokenizer file's sha256, --skip_bad_utf8
    and VERSION. --chunk_bytes is not among them (the outputs do not depend on it). Raises OSError if
    a text file can't be read."""
    def file_id(path):
        return {"bytes": os.path.getsize(path), "sha256": file_sha256(path)}
    return {"version": VERSION, "train": file_id(paths[0]), "valid": file_id(paths[1]),
            "vocab_size": args.vocab_size or (None if args.tokenizer else 4096),
            "bpe_max_bytes": None if args.tokenizer else args.bpe_max_bytes,
            "tokenizer_sha256": tokenizer_sha256(args.tokenizer) if args.tokenizer else None,
            "skip_bad_utf8": args.skip_bad_utf8}


def parse_args(argv=None):
    """prepare.py's checked options (argparse.Namespace) from argv (list of str; None: sys.argv); an unknown
    option, a bad type, a number out of its range (--vocab_size outside [257, 65536], --chunk_bytes,
    --max_tokens, --num_proc or --shard_docs < 1, a --seed outside [0, 2**32)) or a flag given twice: one
    line, exit 2 (flags.ArgumentParser). Raises ValueError for --bpe_max_bytes < 0, an empty path, an --out
    that is a file, only one of --train and --valid, or a --tokenizer that is malformed, disagrees with
    --vocab_size or, without --dataset, has over 65536 tokens (read_tokenizer: a tokenizer.json is
    converted); FileNotFoundError
    if it is not a file (check_file). --dataset and its flags: corpus.check_args."""
    p = ArgumentParser("prepare.py", __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.description = __doc__                                 # --help: the whole docstring, as written
    p.add_argument("--train", help="local training text (default: download TinyStories-train.txt)")
    p.add_argument("--valid", help="local validation text (default: download TinyStories-valid.txt)")
    p.add_argument("--out", default=os.path.join(DATA_DIR, "tinystories"), help="output dir")
    p.add_argument("--vocab_size", type=number(int, 257, high=65536), default=None,
                   help="tokens incl. <|endoftext|> (default 4096; with --tokenizer: that file's)")
    p.add_argument("--bpe_max_bytes", type=int, default=100_000_000,
                   help="train the BPE on the first stories up to this many bytes (0: all)")
    p.add_argument("--tokenizer", metavar="FILE",
                   help="encode with this existing tokenizer.tiktoken instead of training one "
                        "(with --dataset: or a Hugging Face tokenizer.json)")
    p.add_argument("--chunk_bytes", type=number(int, 1), default=8 << 20,
                   help="read and encode the text in chunks of about this many bytes")
    p.add_argument("--skip_bad_utf8", action="store_true",
                   help="skip a story that is not valid UTF-8 (counted in meta.json) instead of stopping")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the prepared data --out already holds (without it such a run exits 2, "
                        "unless it has the same settings and text: then it does nothing)")
    corpus.add_flags(p)                                     # --dataset and its flags
    args = p.parse_args(argv)
    if args.bpe_max_bytes < 0:
        raise ValueError(f"--bpe_max_bytes must be >= 0 (0: all the text), got {args.bpe_max_bytes}")
    for name in ("train", "valid", "tokenizer", "out"):
        if getattr(args, name) == "":
            raise ValueError(f"--{name} is empty; give a path")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"--out {args.out} is a file, not a folder")
    corpus.check_args(args)                                 # --dataset's flags, and none of them without it
    if args.dataset is None and (args.train is None) != (args.valid is None):
        raise ValueError("pass both --train and --valid, or neither (to download)")
    if args.tokenizer is not None:
        enc = read_tokenizer(args.tokenizer)[0]
        if args.vocab_size is not None and args.vocab_size != enc.n_vocab:
            raise ValueError(f"--vocab_size {args.vocab_size} but tokenizer {args.tokenizer} "
                             f"has {enc.n_vocab} tokens")
        if args.dataset is None and enc.n_vocab > 65536:
            raise ValueError(f"tokenizer {args.tokenizer} has {enc.n_vocab} tokens; the text files' path "
                             "writes uint16 files (65536 tokens at most; --dataset writes uint32 past them)")
    return args


def text_paths(args):
    """[train path, valid path] (str): --train and --valid, or else the TinyStories files
    downloaded into --out/raw. Raises ValueError if the download fails."""
    if args.train is not None:
        return [args.train, args.valid]
    try:
        raw = os.path.join(args.out, "raw")
        return [download(f"TinyStories-{s}.txt", raw) for s in ("train", "valid")]
    except Exception as e:                  # the hub's errors are of many types (offline, not found, HTTP)
        raise ValueError(f"download failed ({str(e) if isinstance(e, ConnectionError) else why(e)}); pass "
                         "--train/--valid to use local files") from None


def encode_splits(enc, streams, tmp):
    """Encode each split's stories (streams: {split: StoryStream}, in order) with `enc` into the file
    tmp(f"{split}.bin") (tmp: name -> temporary path), printing a summary line per split. Returns {split:
    encode_stream's counts + "bytes_per_token", "skipped_bad_utf8"}. Raises ValueError if a split has no
    story or a token id does not fit in uint16, OSError if writing fails."""
    out = {}
    for split, stream in streams.items():   # val first: a bad file is found early
        with open(tmp(f"{split}.bin"), "wb") as f:
            st = encode_stream(enc, stream, f, label=split)
        if not st["stories"]:
            raise ValueError(f"{stream.path} has no text (empty file or only separators)")
        if not stream.saw_separator:
            print(f"prepare.py: warning: no <|endoftext|> separator found in {stream.path}, "
                  "treating the whole text as one story", file=sys.stderr)
        st["bytes_per_token"] = st["bytes"] / st["tokens"]
        st["skipped_bad_utf8"] = len(stream.skipped)
        out[split] = st
        print(f"{split}: {st['stories']} stories, {st['bytes']} bytes, {st['tokens']} tokens, "
              f"{st['bytes_per_token']:.3f} bytes/token, {stream.chunks} chunks"
              + (f", {len(stream.skipped)} stories skipped (bad UTF-8)" if stream.skipped else ""))
    return out


def main(argv=None):
    """Command line entry point (argv: list of str; None: sys.argv) -> the exit status: 0 on success,
    2 on bad input, 1 on a write that found no room (a full disk: one-line error naming the file), 130 on
    Ctrl-C (one line: cli.run_command);
    --out's outputs are left as they were unless the run succeeds."""
    return run_command("prepare.py", run, argv, kept="--out is as it was: run the same command again")


def prepare_text(args):
    """The text files' path of run(): keep what --out holds (keep_outputs), or else train or copy the
    tokenizer and encode the splits into the four outputs (write_outputs) -> True, or False if --out holds
    this data already. Raises ValueError (bad input, one line), OSError."""
    paths = text_paths(args)
    streams = {"val": StoryStream(paths[1], args.chunk_bytes, args.skip_bad_utf8),
               "train": StoryStream(paths[0], args.chunk_bytes, args.skip_bad_utf8)}
    settings = prepare_settings(args, paths)
    if not keep_outputs(args, settings):
        return False
    if not sum(len(stories) for stories in streams["val"]):   # a bad valid file fails before the BPE
        raise ValueError(f"{paths[1]} has no text (empty file or only separators)")

    def fill(tmp):
        write_tokenizer(args, streams["train"], tmp("tokenizer.tiktoken"), paths[0])
        splits = encode_splits(load_tokenizer(tmp("tokenizer.tiktoken")), streams, tmp)
        return {"train": splits["train"], "val": splits["val"], "settings": settings}
    write_outputs(args.out, fill)
    return True


def run(argv):
    """main's work on argv (list of str): check, lock --out, then its text files' (prepare_text) or
    --dataset's work (data/corpus.py) -> 0; after a one-line error 2 (bad input), or 1 (a write found no
    room: NO_ROOM, naming the file or --out). Temporary files are removed however it stops
    (KeyboardInterrupt included), and --out's outputs replaced only whole (write_outputs)."""
    t0 = time.time()
    lock = None
    try:
        args = parse_args(argv)
        lock = lock_out(args.out)
        remove_stale_temps(args.out, "prepare.py")      # a killed run's temporary files (cli.written's)
        if not (corpus.prepare_corpus(args, lock) if args.dataset is not None else prepare_text(args)):
            return 0
    except (OSError, ValueError) as e:
        if isinstance(e, OSError) and e.errno in NO_ROOM:     # a run that could not finish, not bad input
            what = e if isinstance(e, NoRoom) else f"could not write in {args.out} ({e.strerror or e})"
            then = ("the shards written are kept: make room and run the same command again to go on"
                    if args.dataset is not None else
                    "--out is as it was: make room and run the same command again")
            print(f"prepare.py: error: {what}; {then}", file=sys.stderr)
            return 1
        print(f"prepare.py: error: {e}", file=sys.stderr)
        return 2
    finally:
        if lock is not None:
            os.close(lock)
    print(f"wrote {args.out} in {time.time() - t0:.1f}s total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
