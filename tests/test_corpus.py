"""Tests for data/prepare.py --dataset (data/corpus.py: any corpus in, issue 70) and train.py
reading its uint16 and uint32 token files.

    python test_mixer.py test_corpus

The corpora are tiny and made here (synthetic documents written as jsonl and parquet), so nothing is skipped.
"""
import contextlib
import errno
import io
import json
import os
import random
import shutil
import signal
import tempfile
import unittest
from unittest import mock

import numpy as np

from data import corpus, prepare
from data.tokens import read_prepared
from data.tokenizer import EOT, load_tokenizer, save_tokenizer
from tests.common import ROOT, run

PREPARE = os.path.join(ROOT, 'data', 'prepare.py')
WORDS = ('the cat dog sat ran on a mat big small red blue tree house and then she he said "hello" '
         'went to school quickly café naïve 日本 1 22 333 , . ! ?').split()
V, S = 300, 16           # vocabulary, documents per shard


def make_docs(n=150, seed=0):
    """n synthetic documents (str), a few of them empty or None, one holding the text "<|endoftext|>"."""
    rng = random.Random(seed)
    docs = [' '.join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))) + '\n' for _ in range(n)]
    docs[3], docs[40], docs[77] = '', None, f'before {EOT} after'
    return docs


def write_jsonl(path, docs):
    with open(path, 'w', encoding='utf-8') as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({'id': i, 'text': d}) + '\n')
    return path


def write_parquet(path, docs):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({'id': list(range(len(docs))), 'text': docs}), path, row_group_size=37)
    return path


def prepare_(*args):
    """prepare.main in this process -> (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = prepare.main(list(args))
    return rc, out.getvalue(), err.getvalue()


def outputs(folder):
    """{name: bytes} of every file of a prepared folder (a leftover shards folder shows as a name)."""
    found = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        found[name] = open(path, 'rb').read() if os.path.isfile(path) else 'a folder'
    return found


def expected_ids(enc, docs, keep):
    """The token ids the documents with keep[i] make, each followed by <|endoftext|> (empty ones: none),
    encoded here one by one as plain text (numpy int64 [n])."""
    ids = []
    for d, k in zip(docs, keep):
        if k and d:
            ids += enc.encode_ordinary(d) + [enc.eot_token]
    return np.array(ids, dtype=np.int64)


def rule(n, fraction, seed=0, shard_docs=S):
    """The held-out rule as the module docstring states it, computed here: bool [n]."""
    return np.array([np.random.default_rng([seed, i // shard_docs]).random(shard_docs)[i % shard_docs] < fraction
                     for i in range(n)])


class CorpusCase(unittest.TestCase):
    """A temporary folder with the tiny corpus as jsonl and parquet, and --dataset's common flags."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix='test_corpus_')
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.docs = make_docs()
        self.jsonl = write_jsonl(os.path.join(self.tmp, 'docs.jsonl'), self.docs)

    def flags(self, out, *more, source=None):
        return ['--dataset', source or self.jsonl, '--out', os.path.join(self.tmp, out), '--vocab_size', str(V),
                '--shard_docs', str(S), '--val_fraction', '0.2', '--num_proc', '1', *more]


class TestLocalCorpora(CorpusCase):
    def test_jsonl_and_parquet_make_the_documents_tokens(self):
        """A local jsonl and the same documents as parquet: train.bin and val.bin hold exactly the ids of each
        non-empty document (encoded here, one by one) then <|endoftext|>, split by the seeded rule as stated;
        meta.json counts them; both files give the same bytes."""
        pq = write_parquet(os.path.join(self.tmp, 'docs.parquet'), self.docs)
        made = {}
        for name, source in (('jsonl', self.jsonl), ('parquet', pq)):
            rc, out, err = prepare_(*self.flags(name, source=source))
            self.assertEqual(rc, 0, err)
            made[name] = outputs(os.path.join(self.tmp, name))
        self.assertEqual(sorted(made['jsonl']), ['meta.json', 'tokenizer.tiktoken', 'train.bin', 'val.bin'])
        for f in ('train.bin', 'val.bin', 'tokenizer.tiktoken'):
            self.assertEqual(made['jsonl'][f], made['parquet'][f], f)
        folder = os.path.join(self.tmp, 'jsonl')
        enc, meta = load_tokenizer(os.path.join(folder, 'tokenizer.tiktoken')), json.loads(made['jsonl']['meta.json'])
        held = rule(len(self.docs), 0.2)
        self.assertTrue(0 < held.sum() < len(self.docs) // 2)
        for split, keep in (('train', ~held), ('val', held)):
            ids = np.frombuffer(made['jsonl'][f'{split}.bin'], dtype=np.uint16)
            np.testing.assert_array_equal(ids, expected_ids(enc, self.docs, keep))
            texts = [d for d, k in zip(self.docs, keep) if k and d]
            self.assertEqual(meta[split]['stories'], len(texts))
            self.assertEqual(meta[split]['tokens'], ids.size)
            self.assertEqual(meta[split]['bytes'], sum(len(t.encode()) for t in texts))
        self.assertEqual((meta['dtype'], meta['vocab_size']), ('uint16', V))
        self.assertEqual(meta['held_out']['documents'], meta['val']['stories'])
        self.assertEqual(meta['train']['empty'] + meta['val']['empty'], 2)

    def test_max_tokens_cuts_after_the_document_that_reaches_it(self):
        """--max_tokens N: the training documents up to and including the one whose tokens bring the total to
        N, the held-out ones read up to there in val.bin."""
        rc, _, err = prepare_(*self.flags('all'))
        self.assertEqual(rc, 0, err)
        whole = np.fromfile(os.path.join(self.tmp, 'all', 'train.bin'), dtype=np.uint16)
        enc = load_tokenizer(os.path.join(self.tmp, 'all', 'tokenizer.tiktoken'))
        n = int(whole.size * 0.4)
        rc, _, err = prepare_(*self.flags('cut', '--max_tokens', str(n)))
        self.assertEqual(rc, 0, err)
        ids = np.fromfile(os.path.join(self.tmp, 'cut', 'train.bin'), dtype=np.uint16)
        self.assertGreaterEqual(ids.size, n)
        self.assertEqual(int(ids[-1]), enc.eot_token)
        self.assertLess(np.nonzero(ids[:-1] == enc.eot_token)[0][-1] + 1, n)      # the last document reaches n
        np.testing.assert_array_equal(ids, whole[:ids.size])
        held, seen, last = rule(len(self.docs), 0.2), 0, 0
        for i, d in enumerate(self.docs):           # the index of the document that reaches n
            if d and not held[i]:
                seen += len(enc.encode_ordinary(d)) + 1
                if seen >= n:
                    last = i
                    break
        val = np.fromfile(os.path.join(self.tmp, 'cut', 'val.bin'), dtype=np.uint16)
        np.testing.assert_array_equal(val, expected_ids(enc, self.docs[:last + 1], held[:last + 1]))

    def test_bad_input_is_one_line_and_leaves_nothing(self):
        """A missing text field, a non-text value, a corpus flag without --dataset, two sources, a format it
        does not read: one line 'prepare.py: error: ...', exit 2, --out left empty (no shards folder)."""
        numbers = os.path.join(self.tmp, 'numbers.jsonl')
        with open(numbers, 'w') as f:
            f.write('{"text": "fine"}\n{"text": 5}\n')
        txt = os.path.join(self.tmp, 'a.txt')
        open(txt, 'w').write('a story')
        cases = [(self.flags('o', '--text_field', 'body'), "--text_field 'body' is not a field"),
                 (self.flags('o', source=numbers), "document 1 of"),
                 (['--train', txt, '--valid', txt, '--max_tokens', '5', '--out', os.path.join(self.tmp, 'o')],
                  '--max_tokens applies to a --dataset only'),
                 (self.flags('o', '--train', txt), '--dataset and --train/--valid are two sources'),
                 (self.flags('o', source=txt), 'not a .parquet, .jsonl, .json or .arrow file'),
                 (self.flags('o', '--val_split', 'validation'), '--val_split and --val_fraction'),
                 (self.flags('o', source=os.path.join(self.tmp, 'missing.jsonl')), 'no such file or folder')]
        for args, words in cases:
            with self.subTest(words=words):
                rc, _, err = prepare_(*args)
                self.assertEqual(rc, 2, err)
                self.assertEqual(len(err.strip().splitlines()), 1, err)
                self.assertTrue(err.startswith('prepare.py: error: ') and words in err, err)
                left = os.path.join(self.tmp, 'o')
                self.assertEqual(os.listdir(left) if os.path.isdir(left) else [], [])


class TestResume(CorpusCase):
    """Nothing lost, nothing redone: a run stopped at any point, run again, writes the same bytes as one that
    was not stopped, and tokenizes only the shards that were not written."""

    def reference(self, *more):
        rc, _, err = prepare_(*self.flags('ref', *more))
        self.assertEqual(rc, 0, err)
        return outputs(os.path.join(self.tmp, 'ref'))

    def test_failed_run_goes_on_without_tokenizing_again(self):
        """A run that fails after 3 shards (a full disk, simulated in the 4th), run again: the same four files
        as an uninterrupted run, byte for byte, with only the missing shards tokenized (counted); with
        --max_tokens too, and with the stream's positions after shards 1 and 2 not kept (a position that is not
        JSON: it reads on from shard 1, and finds shards 1 and 2 written). Then the same command again does
        nothing."""
        real, calls = corpus.encode_shard, []

        def counting(tok, path, docs, val, position):
            calls.append(os.path.basename(path))
            if fail_at and len(calls) == fail_at:
                raise OSError(errno.ENOSPC, 'No space left on device (simulated)')
            lost_here = lost and os.path.basename(path) in ('all-0000001.npz', 'all-0000002.npz')
            return real(tok, path, docs, val, '' if lost_here else position)
        for more, lost in (([], False), (['--max_tokens', '9000'], False), ([], True)):
            with self.subTest(more=more, lost=lost):
                ref = self.reference(*more)
                folder, calls[:], fail_at = os.path.join(self.tmp, 'run'), [], 4
                with mock.patch.object(corpus, 'encode_shard', counting):
                    rc, _, err = prepare_(*self.flags('run', *more))
                self.assertEqual((rc, err.count('\n')), (1, 1), err)       # a run that could not finish
                self.assertIn('No space left', err)
                calls[:], fail_at = [], None
                with mock.patch.object(corpus, 'encode_shard', counting):
                    rc, out, err = prepare_(*self.flags('run', *more))
                self.assertEqual(rc, 0, err)
                self.assertIn(f'{1 if lost else 3} shards written by an earlier run are not tokenized again', out)
                self.assertEqual(outputs(folder), ref)
                self.assertFalse(set(calls) & {f'all-{k:07d}.npz' for k in range(3)}, calls)
                if not more:
                    self.assertEqual(len(calls), -(-len(self.docs) // S) - 3)
                rc, out, _ = prepare_(*self.flags('run', *more))
                self.assertEqual(rc, 0)
                self.assertIn('nothing to do', out)
                shutil.rmtree(folder)
                shutil.rmtree(os.path.join(self.tmp, 'ref'))

    def test_other_settings_are_refused_without_overwrite(self):
        """The shards of a stopped run of other settings, or prepared data of other settings, are kept: exit 2,
        one line naming --overwrite, nothing changed; the stopped run's own command finishes it, and
        --overwrite drops another run's shards (with a note) and prepares."""
        folder = os.path.join(self.tmp, 'run')

        def stopped(*more):             # a run that fails at its first shard: its shards folder stays
            with mock.patch.object(corpus, 'encode_shard', side_effect=OSError('disk full (simulated)')):
                self.assertEqual(prepare_(*self.flags('run', *more))[0], 2)
            return [n for n in os.listdir(folder) if n.startswith('shards-')]

        def refused(more, words):
            before = outputs(folder)
            rc, _, err = prepare_(*self.flags('run', *more))
            self.assertEqual((rc, err.count('\n')), (2, 1), err)
            self.assertIn(words, err)
            self.assertIn('--overwrite', err)
            self.assertEqual(outputs(folder), before)
        [a] = stopped('--seed', '1')
        refused(['--seed', '2'], f'holds the shards of an unfinished --dataset run of other settings ({a})')
        self.assertEqual(prepare_(*self.flags('run', '--seed', '1'))[0], 0)
        refused(['--seed', '2'], 'already holds prepared data of other settings')
        refused(['--seed', '2', '--max_tokens', '500'], 'already holds prepared data of other settings')
        [c] = stopped('--seed', '2', '--overwrite')
        rc, _, err = prepare_(*self.flags('run', '--seed', '3', '--overwrite'))
        self.assertEqual(rc, 0, err)
        self.assertIn(f'removed {c}', err)
        self.assertEqual(sorted(os.listdir(folder)), ['meta.json', 'tokenizer.tiktoken', 'train.bin', 'val.bin'])

    def test_stopped_while_renaming_finishes_the_same(self):
        """A run stopped (Ctrl-C) between two renames of its outputs into --out (one of them in place, the
        others not: --out looks damaged), and again after all four renames, before the shards folder is
        removed: the same command finishes with the uninterrupted run's bytes, no --overwrite needed."""
        ref = self.reference()
        folder = os.path.join(self.tmp, 'run')
        real, real_rmtree = os.replace, shutil.rmtree
        for stop_at in (2, 5):
            with self.subTest(stop_at=stop_at):
                renamed = []

                def replace(src, dst):
                    if os.path.dirname(os.path.abspath(dst)) == folder:
                        renamed.append(dst)
                        if len(renamed) == stop_at:
                            raise KeyboardInterrupt
                    return real(src, dst)

                def rmtree(path, *a, **kw):
                    if len(renamed) == 4:       # all four in place: stopped before the shards are removed
                        raise KeyboardInterrupt
                    return real_rmtree(path, *a, **kw)
                with mock.patch.object(corpus.os, 'replace', replace), mock.patch.object(corpus.shutil, 'rmtree',
                                                                                          rmtree):
                    rc, _, err = prepare_(*self.flags('run'))
                self.assertEqual(rc, 130, err)
                self.assertTrue(any(n.startswith('shards-') for n in os.listdir(folder)))
                rc, out, err = prepare_(*self.flags('run'))
                self.assertEqual(rc, 0, err)
                self.assertEqual(outputs(folder), ref)
                shutil.rmtree(folder)

    def test_killed_process_resumes_to_the_same_bytes(self):
        """prepare.py with 2 processes, killed (SIGKILL, the whole process at once) as it reads its 8th shard,
        then the same command: the same bytes as an uninterrupted run in one process."""
        ref = self.reference()
        kill = ("import os, runpy, signal, sys\n"
                "sys.path.insert(0, os.getcwd())\n"
                "from data import corpus\n"
                "real = corpus.shard_path\n"
                "def shard_path(folder, part, k):\n"
                "    if k == 7:\n"
                "        os.kill(os.getpid(), signal.SIGKILL)\n"
                "    return real(folder, part, k)\n"
                "corpus.shard_path = shard_path\n"
                "sys.argv = sys.argv[1:]\n"
                "runpy.run_path(sys.argv[0], run_name='__main__')\n")
        args = self.flags('run')
        args[args.index('--num_proc') + 1] = '2'
        r = run('-c', kill, PREPARE, *args, timeout=300)
        self.assertEqual(r.returncode, -signal.SIGKILL, r.stderr)
        folder = os.path.join(self.tmp, 'run')
        [sh] = [n for n in os.listdir(folder)]
        self.assertTrue(sh.startswith('shards-'))
        self.assertGreaterEqual(sum(n.endswith('.npz') for n in os.listdir(os.path.join(folder, sh))), 3)
        r = run(PREPARE, *args, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('written by an earlier run are not tokenized again', r.stdout)
        self.assertEqual(outputs(folder), ref)


class TestWideVocabulary(CorpusCase):
    def test_uint32_files_and_train_py_reads_both(self):
        """A --tokenizer of over 65,536 tokens writes uint32 token files (meta.json's dtype says so; ids above
        65,535 in them) that train.py reads as they are (data/outputs.read_prepared); a uint16 folder reads as before."""
        import train
        ranks = {bytes([b]): b for b in range(256)}
        for i in range(65_600):                      # never made from ASCII text: ranks for the count
            ranks[bytes([0x80 + i % 64, 0x80 + i // 64 % 64, 0xc0 + i // 4096])] = len(ranks)
        for a in 'abcdefghijklmnopqrstuvwxyz ':         # ASCII pairs: ids past 65,535
            for b in 'abcdefghijklmnopqrstuvwxyz ':
                ranks[(a + b).encode()] = len(ranks)
        tok = os.path.join(self.tmp, 'wide.tiktoken')
        save_tokenizer(ranks, tok)
        flags = [f for f in self.flags('wide', '--tokenizer', tok) if f not in ('--vocab_size', str(V))]
        rc, _, err = prepare_(*flags)
        self.assertEqual(rc, 0, err)
        folder = os.path.join(self.tmp, 'wide')
        meta = json.load(open(os.path.join(folder, 'meta.json')))
        self.assertEqual((meta['dtype'], meta['vocab_size']), ('uint32', len(ranks) + 1))
        self.assertEqual(os.path.getsize(os.path.join(folder, 'train.bin')), 4 * meta['train']['tokens'])
        enc = load_tokenizer(tok)
        held = rule(len(self.docs), 0.2)
        got, train_data, val_data = read_prepared(folder, 8)
        self.assertEqual((train_data.dtype, got['dtype']), (np.uint32, 'uint32'))
        self.assertGreater(int(train_data.max()), 65_535)
        np.testing.assert_array_equal(train_data, expected_ids(enc, self.docs, ~held))
        np.testing.assert_array_equal(val_data, expected_ids(enc, self.docs, held))
        x, y = train.get_batch(train_data, np.array([0, 5]), 8, 'lm', 'cpu')
        np.testing.assert_array_equal(x[1].numpy(), train_data[5:13].astype(np.int64))
        self.assertEqual(prepare_(*self.flags('narrow'))[0], 0)
        _, narrow, _ = read_prepared(os.path.join(self.tmp, 'narrow'), 8)
        self.assertEqual(narrow.dtype, np.uint16)
        # the other readers of a data folder read its dtype too: retrieval's stories, represent's windows
        from data.pairs import read_data_dir_stories
        from experiments.represent import windows
        stories = read_data_dir_stories(folder, 'val')
        self.assertEqual([stories[i] for i in range(len(stories))],
                         [d.strip() for d, h in zip(self.docs, held) if h and d.strip()])
        np.testing.assert_array_equal(windows(folder, 8, 8, 1, len(ranks) + 1)[0], val_data[:8].astype(np.int64))


class TestTokenizerJson(CorpusCase):
    def test_hf_tokenizer_json_encodes_as_the_tokenizers_library(self):
        """--tokenizer tokenizer.json (a byte-level BPE of the tokenizers library, trained here): converted as
        experiments/convert.py converts it, the token files are, renumbered to its ids, exactly what the
        tokenizers library makes of each document, then <|endoftext|>."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from experiments.convert import read_tokenizer
        docs = [d for d in self.docs if d and EOT not in d]       # the library would read EOT's text as the token
        jsonl = write_jsonl(os.path.join(self.tmp, 'plain.jsonl'), docs)
        hf = Tokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        hf.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=330, special_tokens=[EOT], show_progress=False,
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        path = os.path.join(self.tmp, 'tokenizer.json')
        hf.save(path)
        flags = [f for f in self.flags('hf', '--tokenizer', path, source=jsonl) if f not in ('--vocab_size', str(V))]
        rc, _, err = prepare_(*flags)
        self.assertEqual(rc, 0, err)
        _, text, hf_ids = read_tokenizer(path)
        folder = os.path.join(self.tmp, 'hf')
        self.assertEqual(open(os.path.join(folder, 'tokenizer.tiktoken')).read(), text)
        held, eot = rule(len(docs), 0.2), hf.token_to_id(EOT)
        for split, keep in (('train', ~held), ('val', held)):
            ids = np.fromfile(os.path.join(folder, f'{split}.bin'), dtype=np.uint16)
            want = [i for d, k in zip(docs, keep) if k for i in hf.encode(d, add_special_tokens=False).ids + [eot]]
            self.assertEqual(hf_ids[ids.astype(np.int64)].tolist(), want)


class TestFinewebConfig(unittest.TestCase):
    def test_config_is_train_settings_and_its_prepare_command_parses(self):
        """config/mixer_fineweb_gpu.py sets only train.py's settings, the paper's numbers (d_model 1024, 16
        blocks, n_ctx 512, 32 windows, lr 5e-4), and the prepare command its header gives is one prepare.py
        takes, writing the folder the config trains on with the 8,000-token vocabulary."""
        import shlex
        import train
        path = os.path.join(ROOT, 'config', 'mixer_fineweb_gpu.py')
        text, ns = open(path).read(), {}
        exec(text, {}, ns)
        self.assertEqual(set(ns) - set(train.DEFAULTS), set())
        self.assertEqual([ns[k] for k in ('variant', 'd_model', 'n_layer', 'n_ctx', 'batch_size', 'learning_rate')],
                         ['flat', 1024, 16, 512, 32, 5e-4])
        [line] = [ln for ln in text.splitlines() if 'python data/prepare.py' in ln]
        args = prepare.parse_args(shlex.split(line.split('python data/prepare.py', 1)[1]))
        self.assertEqual((args.out, args.vocab_size, args.dataset, args.name),
                         (ns['data_dir'], 8000, 'HuggingFaceFW/fineweb-edu', 'sample-10BT'))


class TestHubOffline(CorpusCase):
    def test_a_hub_that_answers_an_error_status_is_reached(self):
        """source.hub_unreachable (huggingface_hub's dataset_info): a hub (HF_ENDPOINT, a local server here)
        that answers 404 for the dataset answered (None: datasets then says what is missing); a refused
        connection did not (its reason, one line)."""
        import http.server
        import threading
        from data.source import hub_unreachable

        class NotFound(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_error(404)

            def log_message(self, *args):
                pass
        server = http.server.HTTPServer(('127.0.0.1', 0), NotFound)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        endpoint = f'http://127.0.0.1:{server.server_address[1]}'
        online = mock.patch('huggingface_hub.constants.HF_HUB_OFFLINE', False)    # as read at its import
        with mock.patch.dict(os.environ, {'HF_ENDPOINT': endpoint}), online:
            self.assertIsNone(hub_unreachable(5, 'someone/no-such-corpus'))
        server.shutdown()
        server.server_close()
        with mock.patch.dict(os.environ, {'HF_ENDPOINT': endpoint}), online:
            reason = hub_unreachable(5)
        self.assertRegex(reason or '', r'^\w+: ')
        self.assertEqual(len(reason.splitlines()), 1)

    def test_unreachable_hub_name_fails_in_one_line(self):
        """A hub name offline: with HF_HUB_OFFLINE=1 (datasets' own check), and without it on a machine whose
        hub does not answer (the probe, its request failing here): one line saying the dataset could not be
        reached, exit 2, no traceback, nothing left in --out."""
        out = os.path.join(self.tmp, 'hub')
        r = run(PREPARE, '--dataset', 'someone/no-such-corpus', '--out', out, timeout=120,
                env={**os.environ, 'HF_HUB_OFFLINE': '1'})
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stderr.count('\n'), 1, r.stderr)
        self.assertTrue(r.stderr.startswith('prepare.py: error: dataset someone/no-such-corpus could not be '
                                            'reached'), r.stderr)
        self.assertEqual(os.listdir(out), [])
        env = {k: v for k, v in os.environ.items() if k not in ('HF_HUB_OFFLINE', 'HF_DATASETS_OFFLINE')}
        with mock.patch.dict(os.environ, env, clear=True), \
                mock.patch('huggingface_hub.HfApi.dataset_info', side_effect=OSError('no network')):
            rc, _, err = prepare_('--dataset', 'someone/no-such-corpus', '--out', out, '--num_proc', '1')
        self.assertEqual(rc, 2, err)
        self.assertEqual(err.count('\n'), 1, err)
        self.assertIn('could not be reached: the Hugging Face Hub', err)
        self.assertEqual(os.listdir(out), [])


if __name__ == '__main__':
    unittest.main()
