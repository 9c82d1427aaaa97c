"""What both halves of data/prepare.py write, and how: the tokenizer file (this project's BPE trained on a
sample of the text, or --tokenizer's), the output folder's four files written whole (tokenizer.tiktoken,
train.bin, val.bin, meta.json), the keep/--overwrite rule over a folder that holds prepared data, the
progress lines (tqdm); a write that finds no room (NoRoom: a run that could not finish). data/prepare.py's
text files and data/corpus.py's --dataset both use them (each imports this module; neither imports the other's
back)."""
import contextlib
import errno
import json
import os
import sys

if __name__ == "__main__":       # before the imports that need the repository root on the path
    print("outputs.py: error: data/prepare.py's outputs, not a command: python data/prepare.py --help",
          file=sys.stderr)
    sys.exit(2)

from data.tokenizer import (check_file, load_tokenizer, read_tokenizer_json, save_tokenizer,  # noqa: E402
                            tokenizer_sha256, train_bpe)
from harness.cli import TEMP_NAME, hold_lock, written  # noqa: E402

OUTPUTS = ("tokenizer.tiktoken", "train.bin", "val.bin", "meta.json")
VERSION = "prepare 1"       # the output format and the BPE trainer: a change here makes every --out "other"


class NoRoom(OSError):
    """A write that found no room (a full disk or quota, a file size limit): the run could not finish (prepare.py's
    exit 1, not bad input's 2). str(): one line naming the file or folder. Pickled whole from a pool's worker
    (OSError's errno and strerror)."""

    def __str__(self):
        return self.strerror


NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)     # no room: only a write meets these


@contextlib.contextmanager
def room_for(what):
    """Inside, an OSError of NO_ROOM raised by a write becomes NoRoom 'could not write WHAT (why)' (`what`: the
    file's path, or 'the outputs in FOLDER'); any other exception goes through as it is."""
    try:
        yield
    except NoRoom:
        raise
    except OSError as e:
        if e.errno not in NO_ROOM:
            raise
        raise NoRoom(e.errno, f"could not write {what} ({e.strerror or e})") from None


def bpe_sample(chunks, max_bytes):
    """The leading stories up to about max_bytes bytes of UTF-8 text (all if max_bytes <= 0) of an iterable of
    lists of stories (a StoryStream, then read only as far as needed): the BPE is trained on this sample, as
    is usual for large corpora; the story that crosses max_bytes is included. Returns (list of str, their
    bytes)."""
    out, total = [], 0
    for chunk in chunks:
        for s in chunk:
            out.append(s)
            total += len(s.encode("utf-8"))
            if 0 < max_bytes < total:
                return out, total
    return out, total


def progress_bar(label, total=None, unit="it", every=5.0, file=None, **kw):
    """A tqdm progress bar of a command's work on `file` (default stdout): on a terminal, redrawn in place;
    elsewhere (a log, a pipe) one whole line every `every` seconds (and tqdm's first and last), so that a log
    reads line by line. tqdm's monitor thread is off: a command's Ctrl-C leaves no thread behind.
    -> tqdm (update(n), set_postfix_str, close)."""
    from tqdm import tqdm
    file = file or sys.stdout
    tty = file.isatty()
    tqdm.monitor_interval = 0
    return tqdm(total=total, desc=label, unit=unit, file=file if tty else _Lines(file), miniters=0,
                mininterval=min(0.5, every) if tty else every, dynamic_ncols=True, **kw)


class _Lines:
    """A stream for tqdm where it is not a terminal: each redraw ('\\r' and the line) written as a line,
    unless it repeats the line before (tqdm's last, at close)."""

    def __init__(self, file):
        self.file, self.last = file, None

    def write(self, text):
        text = text.replace("\r", "").rstrip()
        if text and text != self.last:
            self.file.write(text + "\n")
            self.last = text

    def flush(self):
        self.file.flush()


class Progress:
    """The progress line of prepare.py's work (progress_bar), a context: 'LABEL: P% [elapsed<ETA, MB[/TOTAL]
    MB, MB/s[, N documents][, M tokens, M tokens/s]]', the fraction done and its ETA only where known (of
    total_mb MB, or as update() gives it when `fractions`). `done`: (MB, documents, tokens, fraction) an
    earlier run made (its shards), counted in the totals, not in the rates or the ETA."""

    def __init__(self, label, total_mb=0.0, every=5.0, done=(0.0, None, None, 0.0), fractions=False):
        self.total_mb, self.start = total_mb, done
        known = bool(total_mb) or fractions
        line = "{desc}: " + ("{n:.0f}% [{elapsed}<{remaining}{postfix}]" if known else "[{elapsed}{postfix}]")
        self.bar = progress_bar(label, 100 if known else None, "%", every, bar_format=line,
                                initial=100 * done[3] if known else 0, postfix=self.counts(*done[:3], 0.0))

    def counts(self, mb, docs, tokens, seconds):
        """The line's counts and rates after `seconds` (float) of work."""
        (mb0, _, tokens0, _), dt = self.start, max(seconds, 1e-9)
        return (f"{mb:.1f}" + (f"/{self.total_mb:.1f}" if self.total_mb else "")
                + f" MB, {(mb - mb0) / dt:.1f} MB/s"
                + (f", {docs:,} documents" if docs is not None else "")
                + (f", {tokens / 1e6:,.2f} M tokens, {(tokens - (tokens0 or 0)) / 1e6 / dt:.3f} M tokens/s"
                   if tokens is not None else ""))

    def update(self, mb, docs=None, tokens=None, fraction=None):
        """Count mb (float) MB read, docs and tokens (int) made, the fraction (0..1) done (default: of
        total_mb); the line is printed when its time comes (progress_bar)."""
        seconds = self.bar.format_dict["elapsed"]
        self.bar.set_postfix_str(self.counts(mb, docs, tokens, seconds), refresh=False)
        if self.bar.total:
            fraction = fraction if fraction is not None else mb / self.total_mb
            self.bar.update(100 * fraction - self.bar.n)
        else:
            self.bar.update(0)

    def __enter__(self):
        return self

    def __exit__(self, kind, *exception):
        """The last line, unless an error or a Ctrl-C ended the work (then none: nothing after its line)."""
        self.bar.leave = self.bar.leave and kind is None
        self.bar.close()


def held_outputs(out, settings):
    """What the folder `out` holds already: None (none of OUTPUTS); all four whole (meta.json's token counts and
    sha256 the files'): "same" if made with `settings` (meta.json's "settings"), else "other"; else why it is
    damaged, naming the file (str): one missing, meta.json unreadable, a .bin's size, another tokenizer."""
    present = [name for name in OUTPUTS if os.path.exists(os.path.join(out, name))]
    if not present:
        return None
    if len(present) < len(OUTPUTS):
        return f"{next(n for n in OUTPUTS if n not in present)} is missing"
    try:
        with open(os.path.join(out, "meta.json")) as f:
            meta = json.load(f)
        width = {"uint16": 2, "uint32": 4}[meta.get("dtype", "uint16")]
        sha, sizes = meta["tokenizer_sha256"], {f"{s}.bin": width * int(meta[s]["tokens"]) for s in ("train", "val")}
    except (OSError, ValueError, KeyError, TypeError):
        return "meta.json is cut short or not prepare.py's"
    cut = [f"{n} holds {os.path.getsize(os.path.join(out, n))} bytes, meta.json counts {size // width} tokens"
           for n, size in sizes.items() if os.path.getsize(os.path.join(out, n)) != size]
    if cut or sha != tokenizer_sha256(os.path.join(out, "tokenizer.tiktoken")):
        return cut[0] if cut else "tokenizer.tiktoken is not the one meta.json names"
    return "same" if meta.get("settings") == settings else "other"


def keep_outputs(args, settings, resuming=False):
    """The keep/--overwrite rule: True to go on and write --out; False, after a line saying so, when it holds
    this data already (made with `settings`, its files whole). Raises ValueError (one line) when it holds other
    or damaged prepared data and neither --overwrite nor `resuming` (a stopped run of these settings that may
    have put some of its outputs in place: data/corpus.py) is given."""
    held = None if args.overwrite else held_outputs(args.out, settings)
    if held == "same":
        print(f"{args.out} already holds this data, prepared from the same source with the same settings: "
              "nothing to do (--overwrite prepares it again)")
        return False
    if held is not None and not resuming:
        raise ValueError(f"{args.out} already holds prepared data " + ("of other settings or text" if held == "other"
                         else f"that is damaged: {held}") + "; pass --overwrite to replace it, or choose another --out")
    return True


def write_outputs(out, fill):
    """Write the four OUTPUTS in `out` whole, or leave them as they were (cli.written: temporary files renamed
    in OUTPUTS' order at the end): fill(tmp) writes tmp("tokenizer.tiktoken"), tmp("train.bin") and
    tmp("val.bin") (tmp: name -> its temporary path) and returns meta.json's own entries ({"train", "val",
    ..., "settings"}); meta.json adds the tokenizer's (vocab_size, eot_id, sha256) and the token files' dtype
    ("uint16", or "uint32" past 65,536 tokens) before them -> the meta (dict). Raises what fill raises, OSError,
    NoRoom (a disk that is full: room_for, naming `out`)."""
    with room_for(f"the outputs in {out}"), written(*(os.path.join(out, name) for name in OUTPUTS)) as tmps:
        tmp = dict(zip(OUTPUTS, tmps)).get
        entries = fill(tmp)
        enc = load_tokenizer(tmp("tokenizer.tiktoken"))
        meta = {"vocab_size": enc.n_vocab, "eot_id": enc.eot_token, "tokenizer": "tokenizer.tiktoken",
                "tokenizer_sha256": tokenizer_sha256(tmp("tokenizer.tiktoken")),
                "dtype": "uint16" if enc.n_vocab <= 65536 else "uint32", **entries}
        with open(tmp("meta.json"), "w") as f:
            json.dump(meta, f, indent=2)
    return meta


def read_tokenizer(path):
    """--tokenizer `path`: a tokenizer.tiktoken rank file, or a Hugging Face tokenizer.json (a byte-level BPE,
    converted by data/tokenizer.read_tokenizer_json) -> (tiktoken.Encoding, the rank file's content, bytes).
    Raises FileNotFoundError if it is not a file (check_file), ValueError if it cannot be read or converted
    (one line)."""
    check_file(path, "tokenizer file")
    with open(path, "rb") as f:
        content = f.read()
    if content.lstrip()[:1] != b"{":
        return load_tokenizer(path), content
    enc, text, _ = read_tokenizer_json(path)
    return enc, text.encode("ascii")


def write_tokenizer(args, chunks, path, source):
    """Write the tokenizer file to `path`: --tokenizer's rank file (read_tokenizer), or else a BPE of
    --vocab_size (default 4096) trained on bpe_sample(chunks, --bpe_max_bytes): chunks is an iterable of lists
    of str (a StoryStream, the training documents of a corpus), read only as far as needed; `source` names it
    in messages. Raises ValueError if it has no text or too little for the vocabulary, OSError if reading or
    writing fails."""
    if args.tokenizer is not None:
        with open(path, "wb") as f:
            f.write(read_tokenizer(args.tokenizer)[1])
        return
    sample, n_bytes = bpe_sample(chunks, args.bpe_max_bytes)
    if not sample:
        raise ValueError(f"{source} has no text to train the BPE on (empty, or only separators or empty documents)")
    print(f"training the BPE on the first {len(sample)} stories ({n_bytes / 1e6:.1f} MB) of {source}", flush=True)
    ranks = train_bpe(sample, args.vocab_size or 4096, verbose=True)
    del sample
    save_tokenizer(ranks, path)


def lock_out(out):
    """Make the folder `out` and lock it for this run (hold_lock on the folder itself: no extra file; the
    OS releases it when the process dies) -> the locked file descriptor. Raises ValueError when another
    prepare.py holds it (naming its pid when its temporary files show it), OSError if out can't be made
    or locked."""
    os.makedirs(out, exist_ok=True)
    fd = os.open(out, os.O_RDONLY)
    try:
        taken = hold_lock(fd)
    except OSError:
        os.close(fd)
        raise
    if not taken:
        os.close(fd)
        pids = sorted({int(m.group(2)) for m in map(TEMP_NAME.match, os.listdir(out)) if m})
        raise ValueError(f"{out} is being written by another prepare.py run"
                         + (f" (pid {', '.join(map(str, pids))})" if pids else "")
                         + "; wait for it, or choose another --out") from None
    return fd
