"""Tests for data/prepare.py (tokenizer training, encoding, CLI error handling).

Part of the suite run by python test_mixer.py (or alone: python test_mixer.py test_prepare).
Real text comes from $TINYSTORIES_DIR or ../shared/data/tinystories (skipped if absent).
"""
import contextlib
import errno
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from collections import Counter
from unittest import mock

import numpy as np
import tiktoken.load

from data import prepare, source, tokenizer
from tests.common import HAVE_TEXT, NO_TEXT, ROOT as REPO, TEXT_DIR

PREPARE = os.path.join(REPO, "data", "prepare.py")
EOT = prepare.EOT


def read_real(name, nbytes=None):
    if not HAVE_TEXT:
        print(NO_TEXT)
        raise unittest.SkipTest(NO_TEXT)
    d = TEXT_DIR
    with open(os.path.join(d, name), encoding="utf-8") as f:
        return f.read(nbytes) if nbytes else f.read()


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def naive_bpe(stories, vocab_size):
    """Slow reference trainer: recount every pair each merge, same tie rule and reuse rule."""
    pat = tokenizer.regex.compile(tokenizer.GPT2_PAT)
    counts = Counter(w for s in stories for w in pat.findall(s))
    words = [(list(w.encode("utf-8")), f) for w, f in counts.items()]
    vocab = [bytes([b]) for b in range(256)]
    ranks = {t: i for i, t in enumerate(vocab)}
    while len(vocab) < vocab_size - 1:
        pc = Counter()
        for w, f in words:
            for p in zip(w, w[1:]):
                pc[p] += f
        a, b = min(pc, key=lambda p: (-pc[p], p))
        m = vocab[a] + vocab[b]
        if m not in ranks:
            ranks[m] = len(vocab)
            vocab.append(m)
        new = ranks[m]
        for k, (w, f) in enumerate(words):
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and (w[j], w[j + 1]) == (a, b):
                    out.append(new)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[k] = (out, f)
    return ranks


class TestTokenizer(unittest.TestCase):
    V = 512

    @classmethod
    def setUpClass(cls):
        cls.train_text = read_real("train.txt", 300_000)
        cls.valid_text = read_real("valid.txt")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.ranks = tokenizer.train_bpe(cls.train_text, cls.V)
        cls.path = os.path.join(cls.tmp.name, "tokenizer.tiktoken")
        tokenizer.save_tokenizer(cls.ranks, cls.path)
        cls.enc = prepare.load_tokenizer(cls.path)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_vocab_layout(self):
        self.assertEqual(self.enc.n_vocab, self.V)
        self.assertEqual(len(self.ranks), self.V - 1)
        self.assertEqual(sorted(self.ranks.values()), list(range(self.V - 1)))
        for b in range(256):
            self.assertEqual(self.ranks[bytes([b])], b)
        self.assertEqual(self.enc.eot_token, self.V - 1)
        self.assertNotIn(self.V - 1, self.ranks.values())
        self.assertEqual(len(set(self.ranks)), self.V - 1)  # no duplicate token bytes

    def test_roundtrip_real_valid_text(self):
        ids = self.enc.encode_ordinary(self.valid_text)
        self.assertEqual(self.enc.decode(ids), self.valid_text)
        self.assertLess(max(ids), 65536)
        self.assertLess(max(ids), self.V - 1)  # encode_ordinary never emits eot
        ids = self.enc.encode(self.valid_text, allowed_special={EOT})
        self.assertEqual(self.enc.decode(ids), self.valid_text)
        self.assertEqual(ids.count(self.V - 1), self.valid_text.count(EOT))
        self.assertLess(len(ids), len(self.valid_text.encode()) / 2)  # it really compresses

    def test_eot_special(self):
        self.assertEqual(self.enc.encode(EOT, allowed_special={EOT}), [self.V - 1])
        ids = self.enc.encode("The end." + EOT, allowed_special={EOT})
        self.assertEqual(ids[-1], self.V - 1)
        self.assertNotIn(self.V - 1, self.enc.encode_ordinary(EOT))
        with self.assertRaises(ValueError):  # tiktoken refuses a disallowed special by default
            self.enc.encode(EOT)

    def test_unicode_bytes_roundtrip(self):
        for s in ["héllo wörld", "日本語のテキスト", "emoji 🦄🐉👩‍👩‍👧 ok", "\x00\x7f\t\r\n  ",
                  "Ω≈ç√∫ 😀" * 5, "mixed\u200bzero-width", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]:
            ids = self.enc.encode_ordinary(s)
            self.assertEqual(self.enc.decode(ids), s)
            self.assertTrue(all(0 <= i < self.V - 1 for i in ids))

    def test_frequent_words_are_single_tokens(self):
        for w in [" the", " and", " was", "Once", " upon", " time", " She", " said"]:
            self.assertEqual(len(self.enc.encode_ordinary(w)), 1, w)
        self.assertGreater(len(self.enc.encode_ordinary(" antidisestablishment")), 2)

    def test_every_merge_splits_into_lower_ranks(self):
        # a token of rank r must be reachable: two lower-ranked tokens concatenate to it
        for tok, r in self.ranks.items():
            if len(tok) == 1:
                continue
            ok = any(self.ranks.get(tok[:k], r) < r and self.ranks.get(tok[k:], r) < r
                     for k in range(1, len(tok)))
            self.assertTrue(ok, (tok, r))
            self.assertEqual(self.enc.decode_single_token_bytes(r), tok)

    def test_matches_naive_reference_trainer(self):
        stories = prepare.split_stories(self.train_text[:30_000])
        self.assertEqual(tokenizer.train_bpe(stories, 400), naive_bpe(stories, 400))

    def test_train_bpe_bad_args(self):
        with self.assertRaises(ValueError):
            tokenizer.train_bpe("abc abc", 300)  # runs out of pairs
        with self.assertRaises(ValueError):
            tokenizer.train_bpe(self.train_text, 256)
        with self.assertRaises(ValueError):
            tokenizer.train_bpe(self.train_text, 70000)

    def test_same_format_as_tiktoken_loader(self):
        with mock.patch.dict(os.environ, {"TIKTOKEN_CACHE_DIR": ""}):
            self.assertEqual(tiktoken.load.load_tiktoken_bpe(self.path), self.ranks)

    def test_load_tokenizer_errors(self):
        with self.assertRaises(FileNotFoundError):
            prepare.load_tokenizer(os.path.join(self.tmp.name, "nope.tiktoken"))
        bad = os.path.join(self.tmp.name, "bad.tiktoken")
        lines = read_text(self.path).splitlines()
        for content in ["", "not base64 at all!\n", "\n".join(lines[:-1] + ["QUJD x"]),
                        "\n".join(lines[:-1] + [lines[-1].split()[0] + " 9999"]),
                        "\n".join(lines[1:])]:
            with open(bad, "w") as f:
                f.write(content)
            with self.assertRaises(ValueError, msg=content[:40]):
                prepare.load_tokenizer(bad)

    def test_reload_after_rewrite_is_not_stale(self):
        p = os.path.join(self.tmp.name, "rewrite.tiktoken")
        tokenizer.save_tokenizer(self.ranks, p)
        self.assertEqual(prepare.load_tokenizer(p).n_vocab, self.V)
        small = {t: r for t, r in self.ranks.items() if r < 300}
        tokenizer.save_tokenizer(small, p)
        self.assertEqual(prepare.load_tokenizer(p).n_vocab, 301)

    def test_tokenizer_sha256(self):
        with open(self.path, "rb") as f:
            self.assertEqual(prepare.tokenizer_sha256(self.path), hashlib.sha256(f.read()).hexdigest())
        p = os.path.join(self.tmp.name, "other.tiktoken")
        tokenizer.save_tokenizer({t: r for t, r in self.ranks.items() if r < 300}, p)
        self.assertNotEqual(prepare.tokenizer_sha256(p), prepare.tokenizer_sha256(self.path))


class TestSplitStories(unittest.TestCase):
    def test_split(self):
        """StoryStream splits on <|endoftext|>, strips, drops empty stories, at any chunk size; a text without
        a separator is one story (saw_separator False: prepare.py warns of it)."""
        with tempfile.TemporaryDirectory() as tmp:
            for text, want, sep in ((f"  One.\n{EOT}\n\n{EOT}\nTwo two.\n{EOT}\n   \n", ["One.", "Two two."], True),
                                    (" just one story \n", ["just one story"], False)):
                path = os.path.join(tmp, "t.txt")
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
                for chunk in (1, 5, 1000):
                    stream = prepare.StoryStream(path, chunk_bytes=chunk)
                    with self.subTest(text=text, chunk=chunk):
                        self.assertEqual([s for part in stream for s in part], want)
                        self.assertEqual(stream.saw_separator, sep)


class TestPrepareCLI(unittest.TestCase):
    V = 400

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.out = os.path.join(self.tmp.name, "out")

    def write(self, name, data):
        p = os.path.join(self.tmp.name, name)
        with open(p, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        return p

    def run_prepare(self, *args):
        return subprocess.run([sys.executable, PREPARE, *args, "--out", self.out,
                               "--vocab_size", str(self.V)], capture_output=True, text=True, timeout=120)

    def assert_no_outputs(self):
        left = os.listdir(self.out) if os.path.isdir(self.out) else []
        self.assertEqual(left, [])

    def small_real(self):
        train = EOT.join(read_real("train.txt", 200_000).split(EOT)[:150]) + "\n" + EOT + "\n"
        valid = EOT.join(read_real("valid.txt", 100_000).split(EOT)[:40]) + "\n" + EOT + "\n"
        return self.write("train.txt", train), self.write("valid.txt", valid)

    def test_bad_inputs_exit_2_no_outputs(self):
        good = self.write("good.txt", "A small story about a cat.\n" + EOT + "\n" * 2)
        cases = {
            "missing": os.path.join(self.tmp.name, "missing.txt"),
            "empty": self.write("empty.txt", ""),
            "separators only": self.write("seps.txt", f"\n{EOT}\n  \n{EOT}\n"),
            "not utf-8": self.write("latin1.txt", "caf\xe9 story\n".encode("latin-1") + b"\xff\xfe"),
        }
        for what, bad in cases.items():
            for args in (["--train", bad, "--valid", good], ["--train", good, "--valid", bad]):
                with self.subTest(what=what, args=args[0::2]):
                    r = self.run_prepare(*args)
                    self.assertEqual(r.returncode, 2, r.stderr)
                    self.assertNotIn("Traceback", r.stderr)
                    errs = [l for l in r.stderr.splitlines() if "error" in l]
                    self.assertEqual(len(errs), 1, r.stderr)
                    self.assertTrue(errs[0].startswith("prepare.py: error: "), r.stderr)
                    self.assertIn(os.path.basename(bad), errs[0])
                    self.assert_no_outputs()

    def test_paths_of_the_wrong_kind_and_bad_numbers_are_one_line(self):
        """A folder for a file, a file for --out, an empty path, a negative --bpe_max_bytes: one line naming
        what is wrong, exit 2, nothing written (in this process: prepare.main)."""
        good = self.write("good.txt", "A small story about a cat.\n" + EOT + "\n")
        folder = self.tmp.name
        cases = [(["--train", folder, "--valid", good], f"file {folder} is a folder"),
                 (["--train", good, "--valid", folder], f"file {folder} is a folder"),
                 (["--train", good, "--valid", good, "--tokenizer", folder], f"tokenizer file {folder} is a folder"),
                 (["--train", "", "--valid", good], "--train is empty"),
                 (["--train", good, "--valid", good, "--tokenizer", ""], "--tokenizer is empty"),
                 (["--train", good, "--valid", good, "--bpe_max_bytes", "-1"], "--bpe_max_bytes must be >= 0")]
        for args, words in cases:
            with self.subTest(args=args):
                err = io.StringIO()
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    rc = prepare.main([*args, "--out", self.out, "--vocab_size", str(self.V)])
                self.assertEqual(rc, 2, err.getvalue())
                lines = err.getvalue().strip().splitlines()
                self.assertEqual(len(lines), 1, err.getvalue())
                self.assertTrue(lines[0].startswith(f"prepare.py: error: {words}"), lines[0])
                self.assert_no_outputs()
        for out in (good, ""):
            with self.subTest(out=out):
                err = io.StringIO()
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    rc = prepare.main(["--train", good, "--valid", good, "--out", out])
                self.assertEqual(rc, 2, err.getvalue())
                self.assertEqual(len(err.getvalue().strip().splitlines()), 1, err.getvalue())
                self.assertIn("is a file, not a folder" if out else "--out is empty", err.getvalue())

    def test_text_too_small_for_vocab(self):
        tiny = self.write("tiny.txt", "ab ab\n" + EOT + "\n")
        r = self.run_prepare("--train", tiny, "--valid", tiny)
        self.assertEqual(r.returncode, 2)
        self.assertNotIn("Traceback", r.stderr)
        self.assert_no_outputs()

    def test_only_one_source_given(self):
        good = self.write("good.txt", "A story.\n" + EOT + "\n")
        r = self.run_prepare("--train", good)
        self.assertEqual(r.returncode, 2)
        self.assertNotIn("Traceback", r.stderr)

    def test_download_goes_through_the_hub_client_with_our_progress_line(self):
        """source.download: huggingface_hub's hf_hub_download of the TinyStories file into --out/raw (a
        stand-in here, with the arguments the hub client gives its progress class: desc, total, initial, unit,
        unit_scale), its progress on our line ('downloading NAME: ...'); a file already there is not
        fetched."""
        calls, raw = [], os.path.join(self.out, "raw")

        def fake(repo, name, repo_type, local_dir, endpoint, tqdm_class):
            calls.append((repo, name, repo_type))
            with tqdm_class(desc=name, total=2_000_000, initial=0, unit="B", unit_scale=True) as bar:
                bar.update(2_000_000)
            os.makedirs(local_dir, exist_ok=True)
            with open(os.path.join(local_dir, name), "w") as f:
                f.write("a story<|endoftext|>")
            return f.name
        reached = mock.patch.object(source, "hub_unreachable", return_value=None)
        with mock.patch("huggingface_hub.hf_hub_download", fake), reached, \
                contextlib.redirect_stdout(io.StringIO()) as out:
            path = source.download("TinyStories-valid.txt", raw)
            self.assertEqual(source.download("TinyStories-valid.txt", raw), path)
        self.assertEqual(calls, [("roneneldan/TinyStories", "TinyStories-valid.txt", "dataset")])
        self.assertEqual(path, os.path.join(raw, "TinyStories-valid.txt"))
        last = out.getvalue().splitlines()[-1]
        self.assertRegex(last, r"^downloading TinyStories-valid\.txt: 100%.*2\.00M/2\.00M")

    def test_offline_download_fails_cleanly(self):
        """The TinyStories download with HF_HUB_OFFLINE=1, and with a hub that does not answer (its probe, the
        hub client's dataset_info, failing here): one line naming the cause and --train/--valid, exit 2,
        nothing in --out/raw (not the hub client's cache folders either)."""
        online = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
        for env, why in (({**online, "HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE"),
                         (online, "OSError: no network")):
            err = io.StringIO()
            with self.subTest(why), mock.patch.dict(os.environ, env, clear=True), \
                    mock.patch("huggingface_hub.HfApi.dataset_info", side_effect=OSError("no network")), \
                    contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = prepare.main(["--out", self.out])
            self.assertEqual(rc, 2)
            self.assertIn("--train/--valid", err.getvalue())
            self.assertIn(why, err.getvalue())
            self.assertEqual(len(err.getvalue().strip().splitlines()), 1)
            raw = os.path.join(self.out, "raw")
            self.assertEqual(os.listdir(raw) if os.path.isdir(raw) else [], [])

    def test_success_outputs_agree(self):
        train, valid = self.small_real()
        r = self.run_prepare("--train", train, "--valid", valid)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("total", r.stdout)
        self.assertEqual(sorted(os.listdir(self.out)),
                         ["meta.json", "tokenizer.tiktoken", "train.bin", "val.bin"])
        with open(os.path.join(self.out, "meta.json")) as f:
            meta = json.load(f)
        tok = os.path.join(self.out, meta["tokenizer"])
        enc = prepare.load_tokenizer(tok)
        self.assertEqual(meta["vocab_size"], self.V)
        self.assertEqual(enc.n_vocab, self.V)
        self.assertEqual(meta["eot_id"], self.V - 1)
        self.assertEqual(meta["tokenizer_sha256"], prepare.tokenizer_sha256(tok))
        for split, src in (("train", train), ("val", valid)):
            path = os.path.join(self.out, f"{split}.bin")
            m = meta[split]
            self.assertEqual(m["tokens"], os.path.getsize(path) // 2)
            self.assertEqual(os.path.getsize(path) % 2, 0)
            ids = np.fromfile(path, dtype=np.uint16)
            self.assertEqual(int(ids[-1]), self.V - 1)
            self.assertLess(int(ids.max()), self.V)
            stories = prepare.split_stories(read_text(src))
            self.assertEqual(m["stories"], len(stories))
            self.assertEqual(int((ids == self.V - 1).sum()), len(stories))
            self.assertEqual(m["bytes"], sum(len(s.encode()) for s in stories))
            self.assertAlmostEqual(m["bytes_per_token"], m["bytes"] / m["tokens"])
            self.assertGreater(m["bytes_per_token"], 1.5)  # ~2 at vocab 400, ~4 at 4096
            decoded = enc.decode(ids.tolist())
            self.assertEqual(decoded, EOT.join(stories) + EOT)

    def test_failure_midway_keeps_old_outputs_and_no_temps(self):
        train, valid = self.small_real()
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(prepare.main(["--train", train, "--valid", valid, "--out", self.out,
                                           "--vocab_size", str(self.V)]), 0)
        before = {n: read_bytes(os.path.join(self.out, n)) for n in os.listdir(self.out)}
        calls = []

        real_encode = prepare.encode_stream

        def failing_encode(enc, stream, out, **kw):  # fail on the second split, after temps exist
            calls.append(1)
            if len(calls) == 2:
                out.write(b"\0" * 6)                 # half-written
                raise OSError(errno.ENOSPC, "No space left on device (simulated)")
            return real_encode(enc, stream, out, **kw)

        err = io.StringIO()
        with mock.patch.object(prepare, "encode_stream", failing_encode), \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = prepare.main(["--train", train, "--valid", valid, "--out", self.out,
                               "--vocab_size", str(self.V + 10), "--overwrite"])
        self.assertEqual(rc, 1)                         # a run that could not finish, naming --out
        self.assertIn(f"could not write the outputs in {self.out} (No space left on device (simulated)); --out is as "
                      "it was", err.getvalue())
        after = {n: read_bytes(os.path.join(self.out, n)) for n in os.listdir(self.out)}
        self.assertEqual(after, before)

    def test_prepared_data_is_kept_unless_overwrite(self):
        """A second run on an --out that holds prepared data: with the same settings and text it does
        nothing (exit 0, files untouched); with another vocabulary, or after the training text changed,
        it exits 2 with one line naming --overwrite and leaves the files as they were; with --overwrite
        it replaces them."""
        train, valid = self.small_real()

        def prepare_(*args):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                rc = prepare.main(["--train", train, "--valid", valid, "--out", self.out, *args])
            return rc, out.getvalue(), err.getvalue()

        self.assertEqual(prepare_("--vocab_size", str(self.V))[0], 0)
        with open(os.path.join(self.out, "meta.json")) as f:
            stories = json.load(f)["train"]["stories"]
        def files():   # every file of --out: its bytes and its modification time
            return {n: (read_bytes(os.path.join(self.out, n)), os.stat(os.path.join(self.out, n)).st_mtime_ns)
                    for n in os.listdir(self.out)}
        before = files()
        rc, out, err = prepare_("--vocab_size", str(self.V))
        self.assertEqual((rc, err), (0, ""))
        self.assertIn("nothing to do", out)
        self.assertEqual(files(), before)
        self.assertNotIn("training the BPE", out)
        refused = ["--vocab_size", str(self.V + 10)]
        for what in ("another vocabulary", "changed training text"):
            if what == "changed training text":
                refused = ["--vocab_size", str(self.V)]
                with open(train, "a", encoding="utf-8") as f:
                    f.write("One more story.\n" + EOT + "\n")
            with self.subTest(what):
                rc, out, err = prepare_(*refused)
                self.assertEqual(rc, 2, out + err)
                self.assertEqual(err.strip().splitlines(),
                                 [f"prepare.py: error: {self.out} already holds prepared data of other settings or "
                                  "text; pass --overwrite to replace it, or choose another --out"])
                self.assertEqual(files(), before)
        self.assertEqual(prepare_(*refused, "--overwrite")[0], 0)
        with open(os.path.join(self.out, "meta.json")) as f:
            meta = json.load(f)
        self.assertEqual(meta["train"]["stories"], stories + 1)
        self.assertEqual(meta["settings"]["train"]["bytes"], os.path.getsize(train))
        self.assertEqual(prepare_("--vocab_size", str(self.V))[1].count("nothing to do"), 1)


if __name__ == "__main__":
    unittest.main()
