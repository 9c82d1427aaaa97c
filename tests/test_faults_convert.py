"""Faults of experiments/convert.py and of the folder it exports (issue #72): bad input is one line and exit 2
(weights that are not finite, integer or tied yet different; sizes of 0; a tokenizer.json of another
shape), a failed write one line and exit 1, Ctrl-C one line and exit 130, and an existing --out survives
any of them; what a killed run left beside --out is cleared the next time; the outputs have the umask's
modes; an exported folder is checked as a checkpoint is (the same entries, the same messages) by every
command that reads one, and train.py's resume says what it finds.

Everything runs in this process (run_in_process); a full disk is a real failing write, RLIMIT_FSIZE set for
a moment in this process (SIGXFSZ ignored, so the write fails with EFBIG).
"""

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import unittest
from unittest import mock

import torch

from tests.common import run_in_process
from tests.faults import hashes
from tests.test_convert import D, N_CTX, OneLine, files_in, hf_tokenizer, paper_state, valid_text


def dead_pid():
    """The pid of a process that has ended (a finished `true`)."""
    p = subprocess.Popen(['true'])
    p.wait()
    return p.pid


def umask():
    """This process's umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def file_size_limit(nbytes):
    """Inside, a write past `nbytes` of any file fails (EFBIG) as on a full disk: RLIMIT_FSIZE's soft limit,
    SIGXFSZ ignored; both as they were after."""
    limits, handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)


def convert(*args):
    return run_in_process('-m', 'experiments.convert', *args)


class Fixture(unittest.TestCase, OneLine):

    @classmethod
    def setUpClass(cls):
        """The paper's tiny model (tied, stored once as safetensors writes shared tensors), its tokenizer.json,
        the checkpoint imported from them, and that checkpoint exported."""
        from safetensors.torch import save_file
        cls.tok, hf = hf_tokenizer()
        cls.V = hf.get_vocab_size()
        cls.folder = tempfile.mkdtemp(prefix='convert_faults_')
        cls.state = paper_state(cls.V, tied=True, seed=7)
        cls.reference = os.path.join(cls.folder, 'model.safetensors')
        save_file({k: v for k, v in cls.state.items() if k != 'lm_head.weight'}, cls.reference,
                  metadata={'lm_head.weight': 'wte.weight'})
        cls.ckpt, cls.export = os.path.join(cls.folder, 'ckpt.pt'), os.path.join(cls.folder, 'exported')
        for args in (('--reference', cls.reference, '--tokenizer', cls.tok, '--out', cls.ckpt),
                     ('--ckpt', cls.ckpt, '--out', cls.export)):
            r = convert(*args)
            assert r.returncode == 0, r.stderr

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.folder, ignore_errors=True)

    def place(self, name):
        """A fresh folder holding a copy of the export as NAME -> its path."""
        path = os.path.join(tempfile.mkdtemp(dir=self.folder), name)
        shutil.copytree(self.export, path)
        return path

    def imported(self, state, name, metadata=None):
        """convert.py --reference (a safetensors file of `state`) into an empty folder -> (result, folder)."""
        from safetensors.torch import save_file
        path = os.path.join(tempfile.mkdtemp(dir=self.folder), f'{name}.safetensors')
        save_file({k: v.clone() for k, v in state.items()}, path, metadata=metadata)   # wte and lm_head apart
        out = tempfile.mkdtemp(dir=self.folder)
        return convert('--reference', path, '--tokenizer', self.tok, '--out', os.path.join(out, 'ckpt.pt')), out


class TestBadInput(Fixture):

    def test_bad_weights_are_refused_naming_the_key(self):
        """An import of NaN or inf weights (it once exited 0; sample.py refused the result later), integer
        weights, a file whose metadata ties lm_head to wte but which holds two different matrices (it once
        kept one without a word), a width or a feed-forward width of 0 (tracebacks, or a message about
        another key): one line naming the key, exit 2, nothing written."""
        s = self.state
        zero_ff = {'patch_ff.0.weight': torch.zeros(0, D), 'patch_ff.0.bias': torch.zeros(0),
                   'patch_ff.2.weight': torch.zeros(D, 0)}
        cases = {
            'nan': ({**s, 'mixerblocks.0.conv.bias': torch.full((N_CTX,), float('nan'))},
                    'mixerblocks.0.conv.bias holds values that are not finite'),
            'inf': ({**s, 'mixerblocks.1.patch_ff.2.weight': s['mixerblocks.1.patch_ff.2.weight'] / 0},
                    'mixerblocks.1.patch_ff.2.weight holds values that are not finite'),
            'int64': ({**s, 'mixerblocks.1.conv.bias': torch.zeros(N_CTX, dtype=torch.long)},
                      'mixerblocks.1.conv.bias is torch.int64'),
            'width 0': ({k: v[..., :0] if k in ('wte.weight', 'lm_head.weight') else v for k, v in s.items()},
                        f'wte.weight has shape [{self.V}, 0]'),
            'feed-forward 0': ({k: zero_ff.get(k.split('.', 2)[-1], v) for k, v in s.items()},
                               f'mixerblocks.0.patch_ff.0.weight has shape [0, {D}]')}
        for name, (state, msg) in cases.items():
            with self.subTest(name):
                r, out = self.imported(state, name)
                self.assert_one_line_error(r, 2, msg)
                self.assertEqual(files_in(out), [])
        other = {**s, 'lm_head.weight': s['wte.weight'] + 1}
        r, out = self.imported(other, 'tied', metadata={'lm_head.weight': 'wte.weight'})
        self.assert_one_line_error(r, 2, 'ties lm_head.weight to wte.weight (its metadata) but holds two different')
        self.assertEqual(files_in(out), [])

    def test_a_tokenizer_json_of_another_shape_is_one_line(self):
        """A vocab that is not an object, added_tokens that are not a list of objects, an id that is a string,
        a pre_tokenizer that is not an object (tracebacks once); merges that are a number, a string or an object,
        a merge whose half is a list or that is a blank, a normalizer that is a string or a list (tracebacks or a
        message about merge 0 once): one line, exit 2."""
        with open(self.tok, encoding='utf-8') as f:
            spec = json.load(f)
        vocab, eot, model = spec['model']['vocab'], spec['added_tokens'][0], spec['model']
        cases = {'vocab list': ({'model': {**spec['model'], 'vocab': sorted(vocab.items())}}, 'vocab is a JSON array'),
                 'added dict': ({'added_tokens': {'0': eot}}, "added_tokens is not a list of objects"),
                 'added str': ({'added_tokens': [eot['content']]}, "added_tokens is not a list of objects"),
                 'id str': ({'model': {**spec['model'], 'vocab': {**vocab, 'a': str(vocab['a'])}}},
                            f"vocab gives 'a' the id '{vocab['a']}', not an integer"),
                 'added id str': ({'added_tokens': [{**eot, 'id': str(eot['id'])}]}, 'not an integer'),
                 'pre list': ({'pre_tokenizer': [spec['pre_tokenizer']]}, 'pre_tokenizer is a JSON array'),
                 'merges number': ({'model': {**model, 'merges': 5}}, 'merges are a JSON number, not a list'),
                 'merges str': ({'model': {**model, 'merges': 'a b'}}, 'merges are a JSON string, not a list'),
                 'merges dict': ({'model': {**model, 'merges': {'a': 'b'}}}, 'merges are a JSON object, not a list'),
                 'merge half list': ({'model': {**model, 'merges': [['a', ['b']]]}},
                                     "merge 0 ['a', ['b']] is not a pair of byte-level tokens"),
                 'merge blank': ({'model': {**model, 'merges': [' ']}}, "merge 0 ' ' is not a pair of byte-level"),
                 'normalizer str': ({'normalizer': 'NFC'}, 'normalizer is a JSON string, not an object'),
                 'normalizer list': ({'normalizer': ['NFC']}, 'normalizer is a JSON array, not an object')}
        out = tempfile.mkdtemp(dir=self.folder)
        for name, (change, msg) in cases.items():
            with self.subTest(name):
                path = os.path.join(self.folder, f'{name}.json')
                with open(path, 'w', encoding='utf-8') as f:
                    json.dump({**spec, **change}, f)
                r = convert('--reference', self.reference, '--tokenizer', path, '--out', os.path.join(out, 'c.pt'))
                self.assert_one_line_error(r, 2, msg)
                self.assertEqual(files_in(out), [])


    def test_without_the_tokenizers_package_the_import_is_one_line(self):
        """The conversion is checked against the tokenizers library (check_same_tokens); without it the import
        is refused in one line naming the package, exit 2, nothing written (a NameError traceback once)."""
        out = tempfile.mkdtemp(dir=self.folder)
        with mock.patch.dict('sys.modules', {'tokenizers': None}):
            r = convert('--reference', self.reference, '--tokenizer', self.tok, '--out', os.path.join(out, 'c.pt'))
        self.assert_one_line_error(r, 2, 'needs the tokenizers package')
        self.assertIn('pip install tokenizers', r.stderr)
        self.assertEqual(files_in(out), [])


class TestWrites(Fixture):

    def test_a_full_disk_is_one_line_and_keeps_the_old_output(self):
        """A write that fails (torch.save's RuntimeError on import, safetensors' SafetensorError on export:
        tracebacks once), over an existing --out with --overwrite: one line, exit 1; the old output
        byte-identical and no temporary left."""
        parent = tempfile.mkdtemp(dir=self.folder)
        ckpt, export = os.path.join(parent, 'ckpt.pt'), os.path.join(parent, 'exported')
        shutil.copy(self.ckpt, ckpt)
        shutil.copytree(self.export, export)
        before = hashes(parent)
        for args in (('--reference', self.reference, '--tokenizer', self.tok, '--out', ckpt),
                     ('--ckpt', self.ckpt, '--out', export)):
            with self.subTest(args[0]):
                with file_size_limit(10_000):           # the checkpoint and model.safetensors are larger
                    r = convert(*args, '--overwrite')
                self.assert_one_line_error(r, 1, f'could not write {args[-1]} (')
                self.assertEqual(hashes(parent), before)
                self.assertEqual(files_in(parent), ['ckpt.pt', 'exported'])

    def test_ctrl_c_at_any_point_keeps_the_old_output(self):
        """Ctrl-C (a KeyboardInterrupt) between the two renames that replace an exported folder (the old one
        aside, the new one not yet in place: both were lost once), while model.safetensors is written,
        and in an import's torch.save: exit 130, one line; the old --out byte-identical, no temporary."""
        real_replace = os.replace

        def replace(src, dst, *a, **k):
            if os.path.basename(dst) == 'exported':
                self.assertFalse(os.path.exists(dst))           # between the renames: the old one is aside
                raise KeyboardInterrupt
            return real_replace(src, dst, *a, **k)
        stops = {'between the renames': (mock.patch('os.replace', replace), '--ckpt'),
                 'in save_model': (mock.patch('safetensors.torch.save_model', side_effect=KeyboardInterrupt), '--ckpt'),
                 'in torch.save': (mock.patch('torch.save', side_effect=KeyboardInterrupt), '--reference')}
        for name, (patch, direction) in stops.items():
            with self.subTest(name):
                parent = tempfile.mkdtemp(dir=self.folder)
                ckpt, export = os.path.join(parent, 'ckpt.pt'), os.path.join(parent, 'exported')
                shutil.copy(self.ckpt, ckpt)
                shutil.copytree(self.export, export)
                before = hashes(parent)
                args = ('--ckpt', self.ckpt, '--out', export) if direction == '--ckpt' else \
                    ('--reference', self.reference, '--tokenizer', self.tok, '--out', ckpt)
                with patch:
                    r = convert(*args, '--overwrite')
                self.assertEqual((r.returncode, r.stderr), (130, 'convert.py: interrupted (Ctrl-C)\n'))
                self.assertEqual(hashes(parent), before)
                self.assertEqual(files_in(parent), ['ckpt.pt', 'exported'])

    def test_what_a_killed_run_left_is_cleared_and_the_old_folder_put_back(self):
        """A run killed between the two renames left the old --out aside (.NAME.oldPID) and its new folder
        (.NAME.tmpPID): the next run renames the old one back and removes the temporary, with a note each,
        then refuses to replace --out without --overwrite. A live process's temporary and another output's
        are left alone."""
        parent = os.path.dirname(self.place('exported'))
        export = os.path.join(parent, 'exported')
        before = hashes(export)
        dead, live = dead_pid(), os.getppid()
        os.rename(export, os.path.join(parent, f'.exported.old{dead}'))
        shutil.copytree(self.export, os.path.join(parent, f'.exported.tmp{dead}'))
        for name in (f'.exported.tmp{live}', f'.other.tmp{dead}'):
            with open(os.path.join(parent, name), 'w') as f:
                f.write('not ours to remove')
        r = convert('--ckpt', self.ckpt, '--out', export)
        self.assertEqual(r.returncode, 2, r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 3, r.stderr)
        self.assertIn(f'convert.py: note: {export} was moved aside by a run that stopped', lines[0])
        self.assertIn(f'renamed back from .exported.old{dead}', lines[0])
        self.assertEqual(lines[1], f'convert.py: note: removed 1 temporary files left in {parent} by a run that '
                                   f'stopped: .exported.tmp{dead}')
        self.assertIn('exists; remove it, choose another path, or pass --overwrite', lines[2])
        self.assertEqual(hashes(export), before)
        self.assertEqual(files_in(parent), sorted(['exported', f'.exported.tmp{live}', f'.other.tmp{dead}']))

    def test_outputs_have_the_modes_of_the_umask(self):
        """Every file of an export (model.safetensors was 0600, its neighbours 0644) and an imported checkpoint
        get the mode the umask gives a new file, the folder a new folder's."""
        mask = umask()
        for path in [self.ckpt, self.export] + [os.path.join(self.export, f) for f in files_in(self.export)]:
            want = (0o777 if os.path.isdir(path) else 0o666) & ~mask
            self.assertEqual(oct(os.stat(path).st_mode & 0o777), oct(want), path)


class TestExportedFolder(Fixture):

    def test_checked_as_a_checkpoint_by_every_reader(self):
        """A config.json without 'step', 'config' or 'tokenizer', with "config": null or a 'step' that is no
        int, a folder without model.safetensors, integer weights, tied weights held as two different
        tensors: sample.py, look, retrieval and convert each say so in one line, exit 2 (tracebacks, silence
        or another cause's message once), as they do for a checkpoint file with the same fault."""
        from safetensors import safe_open
        from safetensors.torch import save_file

        def config(change):
            def fix(folder):
                with open(os.path.join(folder, 'config.json'), encoding='utf-8') as f:
                    c = json.load(f)
                change(c)
                with open(os.path.join(folder, 'config.json'), 'w', encoding='utf-8') as f:
                    json.dump(c, f)
            return fix

        def weights(change):
            def fix(folder):
                path = os.path.join(folder, 'model.safetensors')
                with safe_open(path, 'pt') as f:
                    state, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
                state, meta = change(state, meta)
                save_file(state, path, metadata=meta)
            return fix
        bias = 'blocks.0.ff.fc.bias'
        faults = {
            'no step': (config(lambda c: c.pop('step')), "has no 'step'"),
            'no config': (config(lambda c: c.pop('config')), "has no 'config'"),
            'config null': (config(lambda c: c.update(config=None)), "'config' is None, not a dict"),
            'step a list': (config(lambda c: c.update(step=[3])), "'step' is a list, not an int >= 0"),
            'no tokenizer': (config(lambda c: c.pop('tokenizer')), "has no 'tokenizer'"),
            'no weights': (lambda folder: os.remove(os.path.join(folder, 'model.safetensors')),
                           'lacks model.safetensors'),
            'int64': (weights(lambda s, m: ({**s, bias: (100 * s[bias]).long()}, m)), f'holds {bias} as torch.int64'),
            'tied, two': (weights(lambda s, m: ({**s, **{k: s[v] + 1 for k, v in m.items() if v in s}}, {})),
                          'holds two different tensors as wte.weight and lm_head.weight')}   # stored once, now twice
        text = os.path.join(self.folder, 'stories.txt')
        with open(text, 'w', encoding='utf-8') as f:
            f.write(valid_text(5_000))
        for name, (fault, msg) in faults.items():
            path = self.place('exported')
            fault(path)
            commands = {'sample.py': ('sample.py', '--ckpt', path, '--max_new_tokens', '2'),
                        'look.py': ('-m', 'experiments.look', '--ckpt', path, '--no_figure'),
                        'retrieval.py': ('retrieval.py', '--ckpt', path, '--text', text, '--no_cache'),
                        'convert.py': ('-m', 'experiments.convert', '--ckpt', path, '--out', path + '_again')}
            for prog, args in commands.items():
                with self.subTest(name, prog=prog):
                    r = run_in_process(*args)
                    self.assertEqual(r.returncode, 2, r.stderr[-2000:])
                    self.assertNotIn('Traceback', r.stderr)
                    errors = [line for line in r.stderr.splitlines() if 'error' in line.lower()]   # (retrieval
                    self.assertEqual(len(errors), 1, r.stderr)                    # says what it reads first)
                    self.assertTrue(errors[0].startswith(f'{prog}: error: exported folder {path!r}'), r.stderr)
                    self.assertIn(msg, errors[0])
                    self.assertNotIn('train.py writes OUT_DIR/ckpt.pt', r.stderr)
        for name, change, msg in (('no step', lambda c: c.pop('step'), "has no 'step'"),
                                  ('config null', lambda c: c.update(config=None), "'config' is None, not a dict")):
            with self.subTest(f'checkpoint file, {name}'):
                ckpt = torch.load(self.ckpt, weights_only=True)
                change(ckpt)
                path = os.path.join(tempfile.mkdtemp(dir=self.folder), 'ckpt.pt')
                torch.save(ckpt, path)
                r = run_in_process('sample.py', '--ckpt', path, '--max_new_tokens', '2')
                self.assertEqual((r.returncode, len(r.stderr.strip().splitlines())), (2, 1), r.stderr[-2000:])
                self.assertIn(f'sample.py: error: checkpoint {path!r}', r.stderr)
                self.assertIn(msg, r.stderr)

    def test_resume_from_an_exported_folder_says_what_it_is(self):
        """train.py --init_from=resume whose OUT_DIR/ckpt.pt is an exported folder: one line saying it is a folder
        convert.py exported (it was told the checkpoint 'does not exist'), exit 2."""
        out_dir = os.path.dirname(self.place('ckpt.pt'))
        r = run_in_process('train.py', '--init_from=resume', f'--out_dir={out_dir}')
        self.assertEqual(r.returncode, 2, r.stderr[-2000:])
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn(f'{os.path.join(out_dir, "ckpt.pt")} is a folder, not the checkpoint file train.py writes; a '
                      'folder experiments/convert.py exported holds no optimiser', r.stderr)
        self.assertNotIn('does not exist', r.stderr)


if __name__ == '__main__':
    unittest.main()
