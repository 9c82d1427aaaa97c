"""Watching and comparing runs: train.py's trackers (harness/trackers.py) and experiments/compare.py.

    TestTrackers   a short run with --log_to=tensorboard,trackio read back through each library's own reader
                   (TensorBoard's EventAccumulator, Trackio's local store) equals log.jsonl; W&B offline likewise
                   (its own record reader, `wandb leet inspect`), skipped where wandb is not installed; a resumed
                   run continues the same runs and logs no step twice; a tracker failing mid-run (a full disk,
                   its store gone) is one warning and the run ends with its checkpoint; a library not installed
                   is one line, exit 2, before training
    TestCompare    three tiny runs of different kinds (one stopped early, one not yet evaluated): the table, its
                   budget column against each log, the figure; a run sent to TensorBoard afterwards (--to
                   tensorboard) equal to its log; runs of other data refused; bad input one line (compare on logs
                   written record by record: tests/test_compare.py)

The runs are train.py in this process (tests.common.run_in_process), on the prepared data, a few steps of a
tiny model. Trackio writes to a folder of this module ($TRACKIO_DIR, read once when trackio is imported).
"""

import errno
import glob
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

import numpy as np

from harness import trackers
from tests.common import prepared_data, run_in_process
from tests.faults import ENV, TINY, error_lines, records

STEPS = ['--max_iters=8', '--eval_interval=4', '--log_interval=2']
TPS = 4 * 32            # tokens a step of TINY: batch_size 4 x n_ctx 32
TRACKIO_DIR = tempfile.mkdtemp(prefix='mixer_trackio_')


def setUpModule():
    """Trackio's store in a folder of this module (never the user's ~/.cache), removed after it."""
    loaded = sys.modules.get('trackio.utils')
    if loaded is not None and str(loaded.TRACKIO_DIR) != TRACKIO_DIR:
        raise RuntimeError(f'trackio was imported before this module, with its store at {loaded.TRACKIO_DIR}')
    os.environ['TRACKIO_DIR'] = TRACKIO_DIR


def tearDownModule():
    os.environ.pop('TRACKIO_DIR', None)
    shutil.rmtree(TRACKIO_DIR, ignore_errors=True)


def folder(test):
    path = tempfile.mkdtemp(prefix='mixer_watch_')
    test.addCleanup(shutil.rmtree, path, ignore_errors=True)
    return path


def train(out, *args, env=None):
    """train.py in this process on the prepared data, the tiny model, STEPS unless args say otherwise."""
    return run_in_process('train.py', f'--data_dir={prepared_data()}', *TINY, *STEPS, f'--out_dir={out}', *args,
                          env={**ENV, 'TRACKIO_DIR': TRACKIO_DIR, **(env or {})}, timeout=300)


def expected(log):
    """What the trackers must hold, from log.jsonl's records -> {(tag, step): value}: the train, eval and
    summary records' numbers under the names harness/trackers.py documents."""
    out = {}
    for r in log:
        if r['event'] == 'train':
            out.update({(f'train/{k}', r['step']): r[k] for k in ('loss', 'lr')})
            out.update({(f'speed/{k}', r['step']): r[k] for k in ('ms_per_step', 'tokens_per_s', 'mfu')})
        elif r['event'] == 'eval':
            out.update({(f'val/{k}', r['step']): r[f'val_{k}'] for k in ('loss', 'bpb', 'acc')})
        elif r['event'] == 'summary':
            out.update({(f'summary/{k}', r['step']): v for k, v in r.items()
                        if k not in ('event', 'step') and v is not None})
    return out


def tensorboard_scalars(path):
    """TensorBoard's own reader (EventAccumulator, which applies purge_step) on an event folder -> {(tag, step):
    value}; a tag that holds a step twice fails."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(path, size_guidance={'scalars': 0, 'tensors': 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()['scalars']:
        events = acc.Scalars(tag)
        assert len({e.step for e in events}) == len(events), f'{path}: {tag} holds a step twice'
        out.update({(tag, e.step): e.value for e in events})
    return out, acc


def trackio_logs(out_dir):
    """Trackio's local store (SQLiteStorage.get_logs) for the run trackers.json names -> ({(tag, step): value},
    the run's id, its config); a tag that holds a step twice fails."""
    from trackio.sqlite_storage import SQLiteStorage
    with open(os.path.join(out_dir, 'trackers.json')) as f:
        run = json.load(f)['trackio']
    out = {}
    for row in SQLiteStorage.get_logs(run['project'], run_id=run['id']):
        for k, v in row.items():
            if k not in ('step', 'timestamp'):      # tokens_seen comes with each record, equal at a step
                assert out.get((k, row['step']), v) == v if k == 'tokens_seen' else (k, row['step']) not in out, \
                    f'trackio holds {k} at step {row["step"]} twice'
                out[k, row['step']] = v
    return out, run['id'], SQLiteStorage.get_run_config(run['project'], run['name'])


class EqualToLog:
    """The tracker tests' one assertion, for TestTrackers and TestCompare."""

    def assert_equal_to_log(self, got, log, cast=float, tokens=False):
        """Every value of `expected(log)` is in `got`, equal (after `cast`: float32 for TensorBoard), and at
        tokens seen (step x TPS) when `tokens`; `got` holds nothing else but tokens_seen."""
        want = {(tag, step * TPS if tokens else step): cast(v) for (tag, step), v in expected(log).items()}
        self.assertEqual({k: v for k, v in got.items() if k[0] != 'tokens_seen'}, want)


class TestTrackers(EqualToLog, unittest.TestCase):

    def test_tensorboard_and_trackio_read_back_equal_the_log(self):
        out = folder(self)
        r = train(out, '--log_to=tensorboard,trackio', '--project=watch_read')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(error_lines(r.stderr), [])
        self.assertIn('trackio show --project watch_read', r.stdout)
        log = records(os.path.join(out, 'log.jsonl'))
        by_step, acc = tensorboard_scalars(os.path.join(out, 'tensorboard', 'step'))
        self.assert_equal_to_log(by_step, log, np.float32)
        by_tokens, _ = tensorboard_scalars(os.path.join(out, 'tensorboard', 'tokens'))
        self.assert_equal_to_log(by_tokens, log, np.float32, tokens=True)
        settings = acc.Tensors('settings/text_summary')[0].tensor_proto.string_val[0].decode()
        self.assertIn(f'"params": {log[0]["params"]}', settings)
        got, _, config = trackio_logs(out)
        self.assert_equal_to_log(got, log)
        self.assertEqual({s: v for (k, s), v in got.items() if k == 'tokens_seen'},
                         {r['step']: r['step'] * TPS for r in log if r['event'] in ('train', 'eval')})
        self.assertEqual((config['params'], config['d_model'], config['world_size']), (log[0]['params'], 32, 1))

    def test_a_resumed_run_continues_the_same_runs_and_logs_no_step_twice(self):
        """The first session stops (Ctrl-C) after logging step 6, its checkpoint of step 4; the resumed one logs
        6 and 8 again in log.jsonl. TensorBoard purges the first session's step 6, Trackio keeps it and is not
        sent it again: one run, each step once, equal to the final log.jsonl."""
        out, real = folder(self), trackers.Trackers.log

        def stop_after_6(self, rec):
            real(self, rec)
            if rec.get('event') == 'train' and rec['step'] == 6:
                raise KeyboardInterrupt
        with mock.patch.object(trackers.Trackers, 'log', stop_after_6):
            r = train(out, '--log_to=tensorboard,trackio', '--project=watch_resume')
        self.assertEqual(r.returncode, 130, r.stderr)
        _, first_id, _ = trackio_logs(out)
        r = train(out, '--init_from=resume')
        self.assertEqual(r.returncode, 0, r.stderr)
        log = records(os.path.join(out, 'log.jsonl'))
        self.assertEqual([x['step'] for x in log if x['event'] == 'train'], [2, 4, 6, 8])
        self.assert_equal_to_log(tensorboard_scalars(os.path.join(out, 'tensorboard', 'step'))[0], log, np.float32)
        self.assert_equal_to_log(tensorboard_scalars(os.path.join(out, 'tensorboard', 'tokens'))[0], log, np.float32,
                                 tokens=True)
        got, run_id, _ = trackio_logs(out)
        self.assertEqual(run_id, first_id)
        self.assertEqual(sorted(s for k, s in got if k == 'train/loss'), [2, 4, 6, 8])
        # step 6 in Trackio is the first session's: its loss and learning rate are the resumed one's (the same
        # windows from the same state), its speed (a measured time) its own
        want, timed = expected(log), {('speed/' + k, 6) for k in ('ms_per_step', 'tokens_per_s', 'mfu')}
        self.assertEqual({k for k in got if k[0] != 'tokens_seen'}, set(want))
        self.assertEqual({k: v for k, v in got.items() if k in want and k not in timed},
                         {k: v for k, v in want.items() if k not in timed})
        # another run of the same name since: trackio would resume that one (the latest of the name); a new run
        other = folder(self)
        self.assertEqual(train(other, '--log_to=trackio', '--project=watch_resume',
                               f'--run_name={os.path.basename(out)}').returncode, 0)
        r = train(out, '--init_from=resume', '--max_iters=10')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('is not the latest of its name', r.stdout)
        ids = [trackio_logs(d)[1] for d in (out, other)]
        self.assertNotIn(ids[0], (first_id, ids[1]))
        self.assertEqual(sorted(s for k, s in trackio_logs(out)[0] if k == 'train/loss'), [10])

    def test_a_tracker_failing_mid_run_is_a_warning_and_the_run_ends_with_its_checkpoint(self):
        """TensorBoard's disk full from step 4 (its writer thread's write fails), then Trackio's store replaced
        by a folder from step 4: one warning line each, the other tracker, log.jsonl and the checkpoint whole."""
        from tensorboard.summary.writer.record_writer import RecordWriter
        real_log, real_write, broken = trackers.Trackers.log, RecordWriter.write, []

        def write(self, data):
            if broken:
                raise OSError(errno.ENOSPC, 'No space left on device')
            return real_write(self, data)

        def break_at_4(what):
            def log(self, rec):
                if rec.get('event') == 'train' and rec['step'] == 4:
                    what()
                real_log(self, rec)
            return log

        def trackio_store_gone():
            from trackio.sqlite_storage import SQLiteStorage
            db = SQLiteStorage.get_project_db_path('watch_fail')
            os.remove(db)
            os.makedirs(db)                  # a folder where its database was: it cannot be opened
        for name, what, other in (('tensorboard', lambda: broken.append(1), 'trackio'),
                                  ('trackio', trackio_store_gone, 'tensorboard')):
            with self.subTest(name):
                out = folder(self)
                with mock.patch.object(trackers.Trackers, 'log', break_at_4(what)), \
                        mock.patch.object(RecordWriter, 'write', write):
                    r = train(out, '--log_to=tensorboard,trackio', '--project=watch_fail', f'--run_name={name}')
                broken.clear()
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertNotIn('Traceback', r.stderr)
                lines = error_lines(r.stderr)
                self.assertEqual(len(lines), 1, r.stderr)
                self.assertRegex(lines[0], rf'^train.py: warning: --log_to={name} failed at step \d+ \(.+\); '
                                           'training goes on without it')
                log = records(os.path.join(out, 'log.jsonl'))
                self.assertEqual(log[-1]['event'], 'summary')
                self.assertEqual(__import__('torch').load(os.path.join(out, 'ckpt.pt'), weights_only=True)['step'], 8)
                if other == 'trackio':
                    self.assert_equal_to_log(trackio_logs(out)[0], log)
                else:
                    self.assert_equal_to_log(tensorboard_scalars(os.path.join(out, 'tensorboard', 'step'))[0], log,
                                             np.float32)

    def test_a_library_not_installed_is_one_line_before_training(self):
        out = folder(self)
        for name in trackers.PACKAGES:
            with self.subTest(name), mock.patch.dict(sys.modules, {name: None}):
                r = train(os.path.join(out, name), f'--log_to=tensorboard,{name}' if name != 'tensorboard' else
                          '--log_to=tensorboard')
                line = f'train.py: error: --log_to={name} needs the package {name}: pip install {name}'
                self.assertEqual((r.returncode, error_lines(r.stderr)), (2, [line]))
                self.assertFalse(os.path.exists(os.path.join(out, name)))      # nothing made, nothing trained
        r = train(out, '--log_to=tensorboard,mlflow')
        self.assertEqual((r.returncode, len(error_lines(r.stderr))), (2, 1))
        self.assertIn("unknown tracker 'mlflow'", r.stderr)

    def test_wandb_offline_reads_back_equal_the_log(self):
        if importlib.util.find_spec('wandb') is None:
            self.skipTest('wandb is not installed (optional: pip install wandb): its offline run is not checked')
        out = folder(self)
        r = train(out, '--log_to=wandb', '--project=watch_wandb', env={'WANDB_MODE': 'offline', 'WANDB_SILENT': 'true'})
        self.assertEqual(r.returncode, 0, r.stderr)
        run_file, = glob.glob(os.path.join(out, 'wandb', 'offline-run-*', 'run-*.wandb'))
        shown = subprocess.run([sys.executable, '-m', 'wandb', 'leet', 'inspect', '--json', run_file],
                               capture_output=True, text=True, timeout=120)     # W&B's own reader of its log
        self.assertEqual(shown.returncode, 0, shown.stderr)
        got = {}
        for line in shown.stdout.splitlines():
            rec = json.loads(line)
            if rec.get('type') == 'history':
                item = rec['history']['item']
                got.update({(k, item['step']): v for k, v in item.items() if '/' in k})
        log = records(os.path.join(out, 'log.jsonl'))
        self.assertEqual(got, {k: v for k, v in expected(log).items()})


class TestCompare(EqualToLog, unittest.TestCase):
    """Three tiny runs made once: a flat mixer (8 steps), a transformer (8 steps), a Toeplitz mixer stopped
    (Ctrl-C) after step 6 with its evaluations of steps 0 and 4; and a run that has not evaluated yet."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix='mixer_compare_')
        cls.runs = [os.path.join(cls.tmp, n) for n in ('flat', 'transformer', 'toeplitz')]
        for path in cls.runs[:2]:
            r = train(path, f'--variant={os.path.basename(path)}')
            assert r.returncode == 0, r.stderr
        real = trackers.Trackers.log

        def stop_after_6(self, rec):
            real(self, rec)
            if rec.get('event') == 'train' and rec['step'] == 6:
                raise KeyboardInterrupt
        with mock.patch.object(trackers.Trackers, 'log', stop_after_6), \
                mock.patch.object(trackers.Trackers, '__bool__', lambda self: True):   # log() with no tracker
            r = train(cls.runs[2], '--variant=toeplitz')
        assert r.returncode == 130, r.stderr
        cls.fresh = os.path.join(cls.tmp, 'fresh')               # what a run that just started has written
        os.makedirs(cls.fresh)
        with open(os.path.join(cls.runs[0], 'log.jsonl')) as f, open(os.path.join(cls.fresh, 'log.jsonl'), 'w') as g:
            g.writelines(f.readlines()[:2])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def compare(self, *args):
        return run_in_process('-m', 'experiments.compare', *args, env=ENV, timeout=300)

    def test_three_runs_of_different_kinds_one_unfinished(self):
        out = os.path.join(folder(self), 'figs', 'three.png')
        r = self.compare(*self.runs, self.fresh, '--out', out)
        self.assertEqual(r.returncode, 0, r.stderr)
        runs_table = r.stdout.split('\n\n')[0]            # then the groups': flat and fresh, one setting
        rows = [line.split(' | ') for line in runs_table.splitlines() if line.startswith('| /')]
        self.assertEqual([row[0][2:] for row in rows], self.runs + [self.fresh])
        self.assertEqual([row[1] for row in rows], ['flat', 'transformer', 'toeplitz', 'flat'])
        logs = [records(os.path.join(p, 'log.jsonl')) for p in self.runs]
        evals = [[x for x in log if x['event'] == 'eval'] for log in logs]
        self.assertEqual([e[-1]['step'] for e in evals], [8, 8, 4])
        # the smallest common budget: the stopped run's last evaluation, where each run has one
        self.assertIn('| val loss at 4 steps (linear in optimiser steps) |', r.stdout)
        for row, e in zip(rows, evals):
            self.assertEqual(row[-1].rstrip(' |'), f'{[x for x in e if x["step"] == 4][0]["val_loss"]:.4f}')
            self.assertEqual(row[5].split()[0], f'{e[-1]["val_loss"]:.4f}')
        self.assertIn('(step 4, unfinished)', rows[2][5])
        self.assertEqual(rows[2][12], 'unfinished')
        self.assertIn('no eval yet', rows[3][5])
        self.assertEqual([row[11] for row in rows], ['unknown'] * 4)     # other_load: not in these logs yet
        with open(out[:-4] + '.md') as f:
            self.assertEqual(f.read(), r.stdout[:r.stdout.index('\nplot: ')] + '\n')
        with open(out, 'rb') as f:
            self.assertEqual(f.read(8), b'\x89PNG\r\n\x1a\n')
        r = self.compare(*self.runs, '--out', out, '--x', 'tokens', '--overwrite')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f'| val loss at {4 * TPS:,} tokens (linear in tokens seen) |', r.stdout)

    def test_a_run_trained_without_log_to_is_sent_to_tensorboard_from_its_log(self):
        """--to tensorboard on the flat run (trained without --log_to) and the stopped Toeplitz run: their events,
        read back through TensorBoard's EventAccumulator, equal their log.jsonl as a live tracker's do; the
        settings' text is there; a second time is refused without --overwrite, and replaces them with it."""
        tmp = folder(self)
        runs = [shutil.copytree(p, os.path.join(tmp, os.path.basename(p))) for p in (self.runs[0], self.runs[2])]
        before = {run: sorted(os.listdir(run)) for run in runs}
        r = self.compare('--to', 'tensorboard', *runs)
        self.assertEqual((r.returncode, r.stderr), (0, ''), r.stderr)
        for run in runs:
            self.assertIn(f'tensorboard: {run}/tensorboard (tensorboard --logdir {run})', r.stdout)
            log = records(os.path.join(run, 'log.jsonl'))
            by_step, acc = tensorboard_scalars(os.path.join(run, 'tensorboard', 'step'))
            self.assert_equal_to_log(by_step, log, np.float32)
            self.assert_equal_to_log(tensorboard_scalars(os.path.join(run, 'tensorboard', 'tokens'))[0],
                                             log, np.float32, tokens=True)
            settings = acc.Tensors('settings/text_summary')[0].tensor_proto.string_val[0].decode()
            self.assertIn(f'"params": {log[0]["params"]}', settings)
            self.assertEqual(sorted(os.listdir(run)), sorted(before[run] + ['tensorboard']))   # nothing else
        before = os.listdir(os.path.join(runs[0], 'tensorboard', 'step'))
        r = self.compare('--to', 'tensorboard', runs[0])
        self.assertEqual((r.returncode, len(error_lines(r.stderr))), (2, 1), r.stderr)
        self.assertIn('tensorboard exists', r.stderr)
        self.assertEqual(os.listdir(os.path.join(runs[0], 'tensorboard', 'step')), before)
        r = self.compare('--to', 'tensorboard', runs[0], '--overwrite')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(os.listdir(os.path.join(runs[0], 'tensorboard', 'step'))), 1)      # replaced, not added
        log = records(os.path.join(runs[0], 'log.jsonl'))
        self.assert_equal_to_log(tensorboard_scalars(os.path.join(runs[0], 'tensorboard', 'step'))[0],
                                         log, np.float32)

    def test_runs_of_other_data_are_refused(self):
        """A run on another validation split (the same tokenizer, other text) beside one on the prepared data."""
        tmp = folder(self)
        data, other = prepared_data(), os.path.join(tmp, 'data')
        text = os.path.dirname(data)
        with open(os.path.join(text, 'valid.txt'), encoding='utf-8') as f:
            valid = f.read()
        with open(os.path.join(tmp, 'valid.txt'), 'w', encoding='utf-8') as f:
            f.write(valid[:len(valid) // 2])
        r = run_in_process('data/prepare.py', '--train', os.path.join(text, 'train.txt'), '--valid',
                           os.path.join(tmp, 'valid.txt'), '--tokenizer', os.path.join(data, 'tokenizer.tiktoken'),
                           '--out', other, env=ENV)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run_in_process('train.py', f'--data_dir={other}', *TINY, '--max_iters=2', '--eval_interval=2',
                           f'--out_dir={os.path.join(tmp, "run")}', env=ENV)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = os.path.join(tmp, 'c.png')
        r = self.compare(self.runs[0], os.path.join(tmp, 'run'), '--out', out)
        self.assertEqual((r.returncode, len(error_lines(r.stderr))), (2, 1), r.stderr)
        self.assertRegex(r.stderr, r'^compare.py: error: runs of different data: .*flat \(tokenizer \w+\.\.\., '
                                   r'validation \d+ tokens, \d+ bytes\) and .*run \(.*\): their losses are not '
                                   'comparable')
        self.assertEqual(sorted(os.listdir(tmp)), ['data', 'run', 'valid.txt'])

    def test_bad_input_is_one_line(self):
        tmp = folder(self)
        damaged = os.path.join(tmp, 'damaged')
        shutil.copytree(self.runs[1], damaged)
        with open(os.path.join(damaged, 'log.jsonl'), 'r+') as f:
            lines = f.readlines()
            lines[3] = lines[3][:20] + '\n'
            f.seek(0)
            f.writelines(lines)
            f.truncate()
        existing = os.path.join(tmp, 'made_by_a_user.png')
        with open(existing, 'w') as f:
            f.write('a figure')
        out = os.path.join(tmp, 'c.png')
        for args, words in (([tmp + '/none'], 'is not a folder'), ([tmp], 'holds no log.jsonl: not a run folder'),
                            ([damaged], 'line 4: not a JSON record (a damaged log)'),
                            ([self.runs[0], '--x', 'minutes'], "invalid choice: 'minutes'"),
                            ([self.runs[0], self.runs[0]], 'twice'),
                            ([self.runs[0], '--out', existing], 'exists; remove it, choose another path, or pass '
                                                                '--overwrite')):
            with self.subTest(words):
                r = self.compare(*args, *(['--out', out] if '--out' not in args else []))
                self.assertEqual((r.returncode, r.stdout), (2, ''), r.stderr)
                self.assertEqual(len(error_lines(r.stderr)), 1, r.stderr)
                self.assertTrue(r.stderr.startswith('compare.py: error: '), r.stderr)
                self.assertIn(words, r.stderr)
                self.assertEqual(sorted(os.listdir(tmp)), ['damaged', 'made_by_a_user.png'])
        with open(existing) as f:
            self.assertEqual(f.read(), 'a figure')
