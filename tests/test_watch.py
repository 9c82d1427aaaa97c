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
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

import numpy as np
import torch

from harness import record, trackers
from tests.common import finished, prepared_data, run_in_process, start
from tests.faults import ENV, TINY, WRAPPER, error_lines, hashes, read_json, records, write

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


def expected(log, axis='step'):
    """What the trackers must hold, from log.jsonl's records -> {(tag, x): value}: the train, eval and
    summary records' numbers under the names harness/trackers.py documents, x the record's step, or its tokens
    seen for axis='tokens' (a train or eval record's 'tokens', the summary's tokens_seen)."""
    out = {}
    for r in log:
        x = r.get('step') if axis == 'step' else r.get('tokens', r.get('tokens_seen'))
        if r['event'] == 'train':
            out.update({(f'train/{k}', x): r[k] for k in ('loss', 'lr')})
            out.update({(f'speed/{k}', x): r[k] for k in ('ms_per_step', 'tokens_per_s', 'mfu')})
        elif r['event'] == 'eval':
            out.update({(f'val/{k}', x): r[f'val_{k}'] for k in ('loss', 'bpb', 'acc')})
        elif r['event'] == 'summary':
            out.update({(f'summary/{k}', x): v for k, v in r.items()
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


WANDB_OFFLINE = {'WANDB_MODE': 'offline', 'WANDB_SILENT': 'true'}


def wandb_history(out_dir, run_id=None):
    """W&B's own reader of its offline files (`wandb leet inspect`) on every file of the run `run_id`
    (None: the only run) under OUT_DIR/wandb, a resumed run's sessions together -> {(tag, step): value} of
    its history rows; a tag that holds a step twice fails."""
    files = sorted(glob.glob(os.path.join(out_dir, 'wandb', 'offline-run-*', f'run-{run_id or "*"}.wandb')))
    assert run_id or len(files) == 1, files
    got = {}
    for run_file in files:
        shown = subprocess.run([sys.executable, '-m', 'wandb', 'leet', 'inspect', '--json', run_file],
                               capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        for line in shown.stdout.splitlines():
            rec = json.loads(line)
            if rec.get('type') == 'history':
                item = rec['history']['item']
                for k, v in item.items():
                    if '/' in k:
                        assert (k, item['step']) not in got, f'wandb holds {k} at step {item["step"]} twice'
                        got[k, item['step']] = v
    return got


def trackio_store(project):
    """Every row of Trackio's store for `project`, each run's (SQLiteStorage.get_logs by run name)."""
    from trackio.sqlite_storage import SQLiteStorage
    return {run: SQLiteStorage.get_logs(project, run) for run in SQLiteStorage.get_runs(project)}


class EqualToLog:
    """The tracker tests' one assertion, for TestTrackers and TestCompare."""

    def assert_equal_to_log(self, got, log, cast=float, axis='step'):
        """Every value of `expected(log, axis)` is in `got`, equal (after `cast`: float32 for TensorBoard),
        at its step or (axis='tokens') tokens seen; `got` holds nothing else but tokens_seen, which
        (Trackio's) is each record's tokens seen."""
        want = {k: cast(v) for k, v in expected(log, axis).items()}
        self.assertEqual({k: v for k, v in got.items() if k[0] != 'tokens_seen'}, want)
        seen = {s: v for (k, s), v in got.items() if k == 'tokens_seen'}
        if seen:
            self.assertEqual(seen, {r['step']: r.get('tokens', r.get('tokens_seen')) for r in log
                                    if r['event'] in ('train', 'eval', 'summary')})

    def assert_trackers_equal_the_log(self, out, log):
        """TensorBoard's step and tokens folders and Trackio's run of trackers.json equal the log."""
        tensorboard = os.path.join(out, 'tensorboard')
        self.assert_equal_to_log(tensorboard_scalars(os.path.join(tensorboard, 'step'))[0], log, np.float32)
        self.assert_equal_to_log(tensorboard_scalars(os.path.join(tensorboard, 'tokens'))[0], log, np.float32,
                                 axis='tokens')
        self.assert_equal_to_log(trackio_logs(out)[0], log)


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
        self.assert_equal_to_log(by_tokens, log, np.float32, axis='tokens')
        settings = acc.Tensors('settings/text_summary')[0].tensor_proto.string_val[0].decode()
        self.assertIn(f'"params": {log[0]["params"]}', settings)
        got, _, config = trackio_logs(out)
        self.assert_equal_to_log(got, log)
        self.assertEqual({s: v for (k, s), v in got.items() if k == 'tokens_seen'},
                         {r['step']: r['step'] * TPS for r in log if r['event'] in ('train', 'eval')})
        self.assertEqual((config['params'], config['d_model'], config['world_size']), (log[0]['params'], 32, 1))

    def test_after_kill_9_and_a_resume_every_curve_equals_the_log(self):
        """A run paused after its 7th step is killed (SIGKILL) once TensorBoard and Trackio hold its step 6,
        logged after the checkpoint of step 4 (Trackio kept it, and its curve then differed from the log;
        TensorBoard's purge lost to the order of its event files, once). The resume drops step 6 from
        log.jsonl and logs it again: TensorBoard's two folders and Trackio's run (the same run) equal the
        final log, every value (the timed speed of step 6 the resumed session's), each step once. Another run
        of the same name since (trackio would resume the latest of the name): a new run, sent the whole log,
        not only the steps after the checkpoint (it held [10] alone, once)."""
        from trackio.sqlite_storage import SQLiteStorage
        out, tmp = folder(self), folder(self)
        pause = os.path.join(tmp, 'paused')
        p = start(write(os.path.join(tmp, 'wrapper.py'), WRAPPER), f'--data_dir={prepared_data()}', *TINY,
                  *STEPS, f'--out_dir={out}', '--log_to=tensorboard,trackio', '--project=watch_kill',
                  env={**ENV, 'TRACKIO_DIR': TRACKIO_DIR, 'PAUSE_AT': '7', 'PAUSE_FILE': pause})
        self.addCleanup(finished, p)
        self.addCleanup(p.kill)
        def trackio_holds_6():
            return os.path.exists(os.path.join(out, 'trackers.json')) and any(
                r['step'] == 6 and 'train/loss' in r
                for r in SQLiteStorage.get_logs('watch_kill', run_id=trackio_logs(out)[1]))
        for ready in (lambda: os.path.exists(pause), trackio_holds_6):
            deadline = time.time() + 300
            while not ready() and p.poll() is None and time.time() < deadline:
                time.sleep(0.1)
            self.assertTrue(ready(), finished(p).stderr[-2000:] if p.poll() is not None else 'staging')
        p.kill()
        self.assertEqual(finished(p).returncode, -signal.SIGKILL)
        before = records(os.path.join(out, 'log.jsonl'))
        self.assertEqual([x['step'] for x in before if x['event'] == 'train'], [2, 4, 6])     # staging
        self.assertIn(('train/loss', 6), tensorboard_scalars(os.path.join(out, 'tensorboard', 'step'))[0])
        _, first_id, _ = trackio_logs(out)
        r = train(out, '--init_from=resume')
        self.assertEqual(r.returncode, 0, r.stderr)
        log = records(os.path.join(out, 'log.jsonl'))
        self.assertEqual([x['step'] for x in log if x['event'] == 'train'], [2, 4, 6, 8])
        self.assertNotEqual([x for x in log if x.get('step') == 6], [x for x in before if x.get('step') == 6])
        self.assert_trackers_equal_the_log(out, log)
        self.assertEqual(trackio_logs(out)[1], first_id)
        other = folder(self)
        self.assertEqual(train(other, '--log_to=trackio', '--project=watch_kill',
                               f'--run_name={os.path.basename(out)}').returncode, 0)
        r = train(out, '--init_from=resume', '--max_iters=10')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn('is not the latest of its name', r.stdout)
        ids = [trackio_logs(d)[1] for d in (out, other)]
        self.assertNotIn(ids[0], (first_id, ids[1]))
        log = records(os.path.join(out, 'log.jsonl'))
        self.assert_trackers_equal_the_log(out, log)
        self.assertEqual(sorted(s for k, s in trackio_logs(out)[0] if k == 'train/loss'), [2, 4, 6, 8, 10])

    def test_a_changed_batch_a_tracker_added_on_resume_and_a_finished_run(self):
        """A run of 4 steps with TensorBoard alone, resumed to 8 with batch_size 8 (twice the tokens a step)
        and Trackio added: the log's tokens count each step at its own batch (4 x 128, then 256 a step: 1,536
        in the summary, not 8 x 256); TensorBoard's tokens folder keeps the first session's points there (it
        purged them, once) and Trackio, added on resume, holds the whole log (it missed the first session's
        steps, once); the first checkpoint is read as one saved before it kept the count (step x its own
        batch). Resumed again at max_iters 8: 'nothing to do' in one line, exit 0, nothing written (a second
        evaluation and summary, once)."""
        out = folder(self)
        r = train(out, '--max_iters=4', '--log_to=tensorboard')
        self.assertEqual(r.returncode, 0, r.stderr)
        ckpt = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)
        self.assertEqual(ckpt.pop('tokens_seen'), 4 * TPS)
        torch.save(ckpt, os.path.join(out, 'ckpt.pt'))    # as saved before the count was kept
        r = train(out, '--init_from=resume', '--max_iters=8', '--batch_size=8',
                  '--log_to=tensorboard,trackio', '--project=watch_batch')
        self.assertEqual(r.returncode, 0, r.stderr)
        log = records(os.path.join(out, 'log.jsonl'))
        self.assertEqual([(x['step'], x['tokens']) for x in log if x['event'] == 'train'],
                         [(2, 2 * TPS), (4, 4 * TPS), (6, 4 * TPS + 2 * 2 * TPS), (8, 4 * TPS + 4 * 2 * TPS)])
        self.assertEqual([x['tokens_seen'] for x in log if x['event'] == 'summary'], [4 * TPS, 12 * TPS])
        self.assert_trackers_equal_the_log(out, log)
        self.assertEqual(sorted(s for k, s in trackio_logs(out)[0] if k == 'train/loss'), [2, 4, 6, 8])
        files = hashes(out)
        store = trackio_store('watch_batch')
        r = train(out, '--init_from=resume')
        self.assertEqual((r.returncode, r.stderr), (0, ''))
        self.assertEqual(r.stdout.splitlines()[-1],
                         f'train.py: nothing to do: {os.path.join(out, "ckpt.pt")} holds step 8, '
                         'max_iters is 8 (a larger --max_iters trains on)')
        self.assertEqual(hashes(out), files)
        self.assertEqual(trackio_store('watch_batch'), store)

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
                self.assertEqual(torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['step'], 8)
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

    def test_a_log_line_that_is_json_but_not_a_record_is_one_line(self):
        """A line of log.jsonl that parses but is no record (a number, a list, a string, null: tracebacks once
        in the trackers' and the resume's readers), first or last: a resume with a tracker is one line naming
        the file and the line, exit 2, the log as it was and no tracker folder made."""
        base = folder(self)
        r = train(base, '--max_iters=4')
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(base, 'log.jsonl')) as f:
            lines = f.readlines()
        cases = (('12', 0, 'number'), ('[1, 2]', len(lines), 'array'), ('"text"', 2, 'string'),
                 ('null', len(lines), 'null'))
        for k, (bad, at, name) in enumerate(cases):
            with self.subTest(bad=bad, at=at):
                out = os.path.join(folder(self), 'run')
                shutil.copytree(base, out)
                text = ''.join(lines[:at] + [bad + '\n'] + lines[at:])
                with open(os.path.join(out, 'log.jsonl'), 'w') as f:
                    f.write(text)
                r = train(out, '--init_from=resume', '--max_iters=6', '--log_to=tensorboard,trackio',
                          f'--project=watch_bad{k}')
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertNotIn('Traceback', r.stderr)
                self.assertEqual(error_lines(r.stderr),
                                 [f'train.py: error: {os.path.join(out, "log.jsonl")}, line {at + 1}: a JSON '
                                  f'{name}, not a record (an object): a damaged log'])
                with open(os.path.join(out, 'log.jsonl')) as f:
                    self.assertEqual(f.read(), text)
                self.assertFalse(os.path.exists(os.path.join(out, 'tensorboard')))

    def test_wandb_offline_reads_back_equal_the_log(self):
        if importlib.util.find_spec('wandb') is None:
            self.skipTest('wandb is not installed (optional: pip install wandb): its offline run is not checked')
        out = folder(self)
        r = train(out, '--log_to=wandb', '--project=watch_wandb', env=WANDB_OFFLINE)
        self.assertEqual(r.returncode, 0, r.stderr)
        log = records(os.path.join(out, 'log.jsonl'))
        self.assertEqual(wandb_history(out), expected(log))

    def test_wandb_after_a_stop_and_a_resume_equals_the_log(self):
        """W&B cannot delete its rows: a run stopped (Ctrl-C) after logging step 6, past its checkpoint of
        step 4, is resumed into a new W&B run sent the whole log, with a note (the old run kept step 6's first
        values, and the resumed ones came twice, once); a run whose session ended at its checkpoint (step 8)
        is continued, its two sessions' files together equal to the log; after a session without W&B, a new
        run again, sent the whole log."""
        if importlib.util.find_spec('wandb') is None:
            self.skipTest('wandb is not installed (optional: pip install wandb): its resume is not checked')
        out, real = folder(self), trackers.Trackers.log

        def stop_after_6(self, rec):
            real(self, rec)
            if rec.get('event') == 'train' and rec['step'] == 6:
                raise KeyboardInterrupt
        with mock.patch.object(trackers.Trackers, 'log', stop_after_6):
            r = train(out, '--log_to=wandb', '--project=watch_wandb', env=WANDB_OFFLINE)
        self.assertEqual(r.returncode, 130, r.stderr)
        first = read_json(os.path.join(out, 'trackers.json'))['wandb']['id']
        r = train(out, '--init_from=resume', env=WANDB_OFFLINE)
        self.assertEqual(r.returncode, 0, r.stderr)
        second = read_json(os.path.join(out, 'trackers.json'))['wandb']['id']
        self.assertEqual(wandb_history(out, second), expected(records(os.path.join(out, 'log.jsonl'))))
        self.assertNotEqual(second, first)
        self.assertIn(f'note: wandb: run {first} holds other steps than the log up to step 4', r.stdout)
        r = train(out, '--init_from=resume', '--max_iters=10', env=WANDB_OFFLINE)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(read_json(os.path.join(out, 'trackers.json'))['wandb']['id'], second)
        self.assertEqual(wandb_history(out, second), expected(records(os.path.join(out, 'log.jsonl'))))
        for args in (['--max_iters=12', '--log_to='], ['--max_iters=14', '--log_to=wandb']):  # W&B misses 1
            r = train(out, '--init_from=resume', *args, env=WANDB_OFFLINE)
            self.assertEqual(r.returncode, 0, r.stderr)
        third = read_json(os.path.join(out, 'trackers.json'))['wandb']['id']
        self.assertNotEqual(third, second)
        self.assertEqual(wandb_history(out, third), expected(records(os.path.join(out, 'log.jsonl'))))


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
        real = record.RunLog.write

        def stop_after_6(self, rec, line=None):
            real(self, rec, line)
            if rec.get('event') == 'train' and rec['step'] == 6:
                raise KeyboardInterrupt
        with mock.patch.object(record.RunLog, 'write', stop_after_6):
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
        loads = [row[11] for row in rows]           # other_load: the three runs' logs hold it, the fresh one not yet
        self.assertEqual(loads[3], 'unknown')
        self.assertTrue(all(float(x) >= 0 for x in loads[:3]), loads)
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
                                     log, np.float32, axis='tokens')
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
