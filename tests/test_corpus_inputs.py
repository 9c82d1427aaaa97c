"""data/prepare.py --dataset's odd and bad input (issue 81): each case it once ran without a word, or reported
as something else, is now one true line (exit 2 for bad input, 1 for a run that could not finish, naming the
file) or counted as what it is.

    python test_mixer.py test_corpus_inputs

The corpora are tiny and made here (tests/test_corpus.py's synthetic documents).
"""
import json
import os
import unittest
from unittest import mock

from data import corpus
from data import source as data_source
from tests.common import run
from tests.test_corpus import (PREPARE, S, V, CorpusCase, make_docs, outputs, prepare_, write_jsonl,
                               write_parquet)


def one_line(test, got, code, *words):
    """prepare_'s (rc, out, err): exit `code`, stderr one line 'prepare.py: error: ...' holding each of `words`."""
    rc, _, err = got
    test.assertEqual(rc, code, err)
    test.assertEqual(len(err.strip().splitlines()), 1, err)
    test.assertTrue(err.startswith('prepare.py: error: '), err)
    for w in words:
        test.assertIn(w, err)
    return err


class InputCase(CorpusCase):
    """test_corpus's folder and documents, flags whose --val_fraction and --vocab_size may be left out."""

    def flags(self, out, *more, source=None, val='0.2', vocab=str(V)):
        """prepare.py's flags: --dataset `source` (default the jsonl), --out TMP/out, --val_fraction `val` (None:
        not given), --vocab_size `vocab` (None: not given), one process, then `more`."""
        return ['--dataset', source or self.jsonl, '--out', os.path.join(self.tmp, out), '--shard_docs', str(S),
                '--num_proc', '1', *(['--vocab_size', vocab] if vocab else []),
                *(['--val_fraction', val] if val else []), *more]

    def nothing_in(self, out):
        """--out holds no output and no shards folder."""
        folder = os.path.join(self.tmp, out)
        self.assertEqual(os.listdir(folder) if os.path.isdir(folder) else [], [])


class TestDocuments(InputCase):
    def test_whitespace_only_documents_are_empty(self):
        """A document of spaces, tabs and newlines only is an empty one (skipped, counted), as the text path drops
        blank stories: among others, the token files are those of the corpus with "" in its place; a corpus of
        nothing else is no text (exit 2), not a corpus of whitespace tokens."""
        blank = list(self.docs)
        for i in (5, 6, 50):
            blank[i] = ' \n\t  '
        empty = [('' if i in (5, 6, 50) else d) for i, d in enumerate(self.docs)]
        for name, docs in (('blank', blank), ('empty', empty)):
            write_jsonl(os.path.join(self.tmp, f'{name}.jsonl'), docs)
            rc, _, err = prepare_(*self.flags(name, source=os.path.join(self.tmp, f'{name}.jsonl')))
            self.assertEqual(rc, 0, err)
        made = {name: outputs(os.path.join(self.tmp, name)) for name in ('blank', 'empty')}
        for f in ('train.bin', 'val.bin', 'tokenizer.tiktoken'):
            self.assertEqual(made['blank'][f], made['empty'][f], f)
        meta = json.loads(made['blank']['meta.json'])
        self.assertEqual(meta['train']['empty'] + meta['val']['empty'], 5)      # make_docs' 2, and these 3
        only = write_jsonl(os.path.join(self.tmp, 'only.jsonl'), [' \n\t '] * 300)
        tok = os.path.join(self.tmp, 'empty', 'tokenizer.tiktoken')
        one_line(self, prepare_(*self.flags('only', '--tokenizer', tok, source=only, vocab=None)), 2,
                 'no non-empty document')
        self.assertFalse(os.path.exists(os.path.join(self.tmp, 'only', 'train.bin')))

    def test_an_empty_jsonl_has_no_documents(self):
        """An empty .jsonl: one line saying it holds no document (it was 'StopIteration: ')."""
        empty = os.path.join(self.tmp, 'empty.jsonl')
        open(empty, 'w').close()
        err = one_line(self, prepare_(*self.flags('o', source=empty)), 2, 'empty.jsonl', 'no document')
        self.assertNotIn('StopIteration', err)
        self.nothing_in('o')

    def test_a_broken_jsonl_line_is_named_by_its_line(self):
        """A line of a .jsonl that is not JSON: the line says the file's line number (2501), not pyarrow's row
        within a block."""
        docs = make_docs(3000, seed=5)
        lines = open(write_jsonl(os.path.join(self.tmp, 'good.jsonl'), docs)).read().splitlines()
        lines[2500] = '{"text": "broken'
        broken = os.path.join(self.tmp, 'broken.jsonl')
        with open(broken, 'w') as f:
            f.write('\n'.join(lines) + '\n')
        one_line(self, prepare_(*self.flags('o', source=broken)), 2, 'broken.jsonl', 'line 2501')


class TestSources(InputCase):
    def test_a_folder_of_two_formats_is_refused(self):
        """A folder holding a .jsonl and a .parquet (datasets reads one format, here the parquet alone, while
        meta.json would list both): refused in one line naming both, nothing written."""
        folder = os.path.join(self.tmp, 'mixed')
        os.makedirs(folder)
        write_jsonl(os.path.join(folder, 'a.jsonl'), self.docs)
        write_parquet(os.path.join(folder, 'b.parquet'), make_docs(100, seed=4))
        one_line(self, prepare_(*self.flags('o', source=folder)), 2, 'a.jsonl', 'b.parquet')
        self.nothing_in('o')

    def test_name_on_a_local_file_or_folder_is_refused(self):
        """--name (a hub dataset's configuration) with a local file or folder: refused, not ignored."""
        folder = os.path.join(self.tmp, 'folder')
        os.makedirs(folder)
        write_jsonl(os.path.join(folder, 'a.jsonl'), self.docs)
        for source in (self.jsonl, folder):
            with self.subTest(source=os.path.basename(source)):
                one_line(self, prepare_(*self.flags('o', '--name', 'sample-10BT', source=source)), 2, '--name')
                self.nothing_in('o')

    def test_a_missing_val_split_is_named_as_val_split(self):
        """--val_split nope: the line names --val_split nope (it said --split nope)."""
        err = one_line(self, prepare_(*self.flags('o', '--val_split', 'nope', val=None)), 2, '--val_split nope')
        self.assertNotIn('--split nope', err)

    def test_zst_and_lz4_name_the_package_they_need(self):
        """A .jsonl.zst or .jsonl.lz4 (listed as read) without its decompressor installed: one line naming the
        package to install, before anything is read."""
        for ext, package in (('.zst', 'zstandard'), ('.lz4', 'lz4')):
            with self.subTest(ext=ext):
                path = os.path.join(self.tmp, f'docs.jsonl{ext}')
                open(path, 'wb').write(b'not read')
                with mock.patch.object(data_source.importlib.util, 'find_spec', return_value=None):
                    one_line(self, prepare_(*self.flags('o', source=path)), 2, f'pip install {package}')
                self.nothing_in('o')


class TestRules(InputCase):
    def test_a_val_fraction_that_leaves_no_training_text_says_so(self):
        """--val_fraction 0.9999 holds out every document: the line blames the held-out rule, not the text."""
        err = one_line(self, prepare_(*self.flags('o', val='0.9999')), 2, '--val_fraction 0.9999')
        self.assertNotIn('no text to train the BPE on', err)

    def test_max_tokens_that_stops_before_any_held_out_document_says_so(self):
        """--max_tokens 1 stops the stream after the first document, before any is held out: the line names
        --max_tokens (it blamed --val_fraction alone)."""
        one_line(self, prepare_(*self.flags('o', '--max_tokens', '1')), 2, '--max_tokens 1')

    def test_a_corpus_changed_under_its_stopped_shards_says_so(self):
        """A run stopped after a few shards, its corpus then changed, and the same command again: one line
        saying the corpus changed since the stopped run and that --overwrite starts again (it said to run
        'its command' again: this one)."""
        real, calls = corpus.encode_shard, []

        def stopping(*a):
            calls.append(1)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return real(*a)
        with mock.patch.object(corpus, 'encode_shard', stopping):
            self.assertEqual(prepare_(*self.flags('run'))[0], 130)
        write_jsonl(self.jsonl, self.docs[:-1] + ['a new last document'])
        err = one_line(self, prepare_(*self.flags('run')), 2, 'changed', '--overwrite')
        self.assertNotIn('run its command again', err)
        self.assertEqual(prepare_(*self.flags('run', '--overwrite'))[0], 0)


FULL = ('import resource, runpy, signal, sys\n'
        'signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n'
        'resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n'
        'sys.argv = sys.argv[2:]\n'
        'runpy.run_path(sys.argv[0], run_name="__main__")\n')


class TestFullDisk(InputCase):
    def test_a_full_disk_is_exit_1_naming_the_file(self):
        """A write that finds no room (EFBIG past a file size limit, as ENOSPC on a full disk) in a shard, in a
        worker's shard (--num_proc 2) or in the split files: exit 1 (a run that could not finish, not bad input),
        one line naming the file or --out, no traceback; the same command without the limit then finishes."""
        docs = make_docs(1500, seed=6)
        source = write_jsonl(os.path.join(self.tmp, 'big.jsonl'), docs)
        for name, procs, shard_docs, where in (('shard', '1', '1024', 'all-0000000.npz'),
                                               ('worker', '2', '1024', 'all-0000000.npz'),
                                               ('splits', '1', '16', 'the outputs in')):
            with self.subTest(name):
                args = self.flags(name, source=source)
                args[args.index('--num_proc') + 1], args[args.index('--shard_docs') + 1] = procs, shard_docs
                r = run('-c', FULL, str(40_000), PREPARE, *args, timeout=300)
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertNotIn('Traceback', r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn(where, r.stderr)
                self.assertIn(os.path.join(self.tmp, name), r.stderr)
                self.assertFalse(os.path.exists(os.path.join(self.tmp, name, 'train.bin')))
                self.assertEqual(prepare_(*args)[0], 0)


if __name__ == '__main__':
    unittest.main()
