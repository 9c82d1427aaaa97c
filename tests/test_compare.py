"""experiments/compare.py on logs written here, record by record, as train.py writes them (the runs
trained for real, and their TensorBoard export: tests/test_watch.py's TestCompare).

    TestBudget     two runs evaluated every 100 steps at different speeds: the budget column and the 25, 50
                   and 75% columns equal each log's value interpolated by hand between the two evaluations
                   around them; a budget past a run's last evaluation is marked 'not reached'
    TestSeeds      three seeds of two settings (their folders, log intervals and threads differing too) are
                   two groups of 3 with the mean and half the range; another learning rate is a third group;
                   the figure draws each group's mean with a band from its lowest to its highest run
    TestLoad       a loaded and a quiet run of one setting: one warning on the seconds axis, none on steps;
                   the load column, 'unknown' where the log does not record it
    TestPeak       MFU against one peak (the first run's, or --peak), each run's own peak named beside it; a
                   later record's peak is the one its measured intervals had
    TestBadInput   a log line that is JSON but not a record, a record of the wrong type, bad flags, an output
                   that exists: one line naming it (the file and line for a log), exit 2, nothing written;
                   the figure as png, svg or pdf by --out's extension
"""

import json
import math
import os
import shutil
import tempfile
import unittest
from types import SimpleNamespace
from unittest import mock

from experiments import compare, run_log
from tests.common import run_in_process
from tests.faults import ENV, error_lines

PEAK = 300e9                    # FLOP/s a process, as a 'config' record states it
FLOPS_PER_TOKEN = 2e7           # training FLOPs a token: MFUs of 8.5 and 17.1% at 300 GFLOP/s
TPS = 4 * 32                    # tokens a step: batch_size 4 x n_ctx 32


def val_loss(variant, seed, step):
    """The validation loss the logs below hold at `step`: a falling curve a variant, shifted by the seed."""
    return 2 + 6 * math.exp(-step / (100 if variant == 'flat' else 80)) + 0.01 * seed


def write_log(path, variant='flat', seed=1, lr=3e-3, ms=lambda step: 100.0, steps=400, eval_every=100,
              log_every=20, load='absent', world=1, extra=(), settings=None):
    """A run folder at `path` whose log.jsonl holds what train.py writes: a 'config' record, a 'schedule', 'eval'
    records every eval_every steps from step 0 (val_loss()), 'train' records every log_every steps (ms(step):
    its interval's ms_per_step; other_load `load`, absent when 'absent'), `extra` records after the schedule,
    and a summary -> the records."""
    os.makedirs(path, exist_ok=True)
    cfg = {'out_dir': path, 'data_dir': 'data/x', 'variant': variant, 'seed': seed, 'learning_rate': lr,
           'batch_size': 4, 'n_ctx': 32, 'grad_accum': 1, 'task': 'lm', 'max_iters': steps,
           'log_interval': log_every, 'threads': None, **(settings or {})}
    with_load = {} if load == 'absent' else {'other_load': load}
    recs = [{'event': 'config', 'config': cfg, 'world_size': world, 'device': 'cpu', 'dtype': 'float32',
             'params': 1000, 'flops_per_token': FLOPS_PER_TOKEN, 'peak_flops': PEAK,
             'peak': f'the measured float32 matmul peak, {PEAK / 1e9:.0f} GFLOP/s per process',
             'meta': {'tokenizer_sha256': 'ab' * 32, 'val': {'tokens': 1000, 'bytes': 4000}}},
            {'event': 'schedule', 'from_step': 0}, *extra]
    for s in range(0, steps + 1, log_every):
        if s:
            recs.append({'event': 'train', 'step': s, 'loss': val_loss(variant, seed, s) + 0.1, 'lr': lr,
                         'ms_per_step': ms(s), 'tokens_per_s': TPS * world / (ms(s) / 1000), 'mfu': 0.1,
                         **with_load})
        if s % eval_every == 0:
            v = val_loss(variant, seed, s)
            recs.append({'event': 'eval', 'step': s, 'val_loss': v, 'val_bpb': v / 2, 'val_acc': 0.1})
    recs.append({'event': 'summary', 'step': steps, 'final_val_loss': val_loss(variant, seed, steps),
                 'wall_seconds': 100.0, **with_load})
    with open(os.path.join(path, 'log.jsonl'), 'w') as f:
        f.writelines(json.dumps(r) + '\n' for r in recs)
    return recs


def folder(test):
    path = tempfile.mkdtemp(prefix='mixer_compare_')
    test.addCleanup(shutil.rmtree, path, ignore_errors=True)
    return path


def compare_cmd(*args):
    """experiments.compare in this process -> CompletedProcess."""
    return run_in_process('-m', 'experiments.compare', *args, env=ENV, timeout=300)


def table_rows(stdout, first=True):
    """The rows of the printed runs' table (first) or groups' table -> [[cell, ...]], header first."""
    tables = [t for t in stdout.split('\n\n') if t.startswith('| ')]
    lines = tables[0 if first else 1].splitlines()
    return [[c.strip() for c in line.strip('|').split(' | ')] for line in lines if not line.startswith('|---')]


def column(rows, starts):
    """The cells under the header that starts with `starts`."""
    i = next(i for i, h in enumerate(rows[0]) if h.startswith(starts))
    return [row[i] for row in rows[1:]]


class TestBudget(unittest.TestCase):

    def test_the_budget_columns_are_each_logs_value_interpolated_by_hand(self):
        """Run a: 200 ms a step for its first 100 steps, then 100 ms: evaluations (every 100 steps) at 0, 20, 30,
        40, 50 s. Run b: 150 ms a step: at 0, 15, 30, 45, 60 s. The common budget is a's last, 50 s; at 12.5, 25,
        37.5 and 50 s each run's loss lies between two evaluations (a's 50 s on its last)."""
        tmp = folder(self)
        a, b = os.path.join(tmp, 'a'), os.path.join(tmp, 'b')
        write_log(a, 'flat', ms=lambda s: 200.0 if s <= 100 else 100.0)
        write_log(b, 'transformer', ms=lambda s: 150.0)
        va = {s: val_loss('flat', 1, s) for s in range(0, 401, 100)}
        vb = {s: val_loss('transformer', 1, s) for s in range(0, 401, 100)}
        by_hand = {a: [va[0] + (va[100] - va[0]) * 12.5 / 20, va[100] + (va[200] - va[100]) * 5 / 10,
                       va[200] + (va[300] - va[200]) * 7.5 / 10, va[400]],
                   b: [vb[0] + (vb[100] - vb[0]) * 12.5 / 15, vb[100] + (vb[200] - vb[100]) * 10 / 15,
                       vb[200] + (vb[300] - vb[200]) * 7.5 / 15, vb[300] + (vb[400] - vb[300]) * 5 / 15]}
        r = compare_cmd(a, b, '--x', 'seconds', '--out', os.path.join(tmp, 'c.png'))
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = table_rows(r.stdout)
        self.assertEqual(rows[0][-4:], ['val loss at 12 s (25%)', 'val loss at 25 s (50%)', 'val loss at 38 s (75%)',
                                        'val loss at 50 s (linear in training seconds)'])
        for row in rows[1:]:
            self.assertEqual(row[-4:], [f'{v:.4f}' for v in by_hand[row[0]]], row[0])
        # the same at a budget of steps given by --budget: 250 lies between the evaluations of 200 and 300; 450
        # past both runs' last
        r = compare_cmd(a, b, '--budget', '250', '--out', os.path.join(tmp, 'c.png'), '--overwrite')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(column(table_rows(r.stdout), 'val loss at 250 steps (linear in optimiser steps)'),
                         [f'{(v[200] + v[300]) / 2:.4f}' for v in (va, vb)])
        r = compare_cmd(a, b, '--budget', '450', '--out', os.path.join(tmp, 'c.png'), '--overwrite')
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = table_rows(r.stdout)
        self.assertEqual(column(rows, 'val loss at 450 steps'), ['not reached (last eval at 400 steps)'] * 2)
        self.assertEqual(column(rows, 'val loss at 225 steps (50%)'),
                         [f'{v[200] + (v[300] - v[200]) / 4:.4f}' for v in (va, vb)])

    def test_value_at_is_linear_between_the_points_around_x(self):
        points = [(0.0, 8.0), (10.0, 4.0), (30.0, 3.0)]
        self.assertEqual([run_log.value_at(points, x) for x in (0, 5, 10, 20, 30)], [8.0, 6.0, 4.0, 3.5, 3.0])
        self.assertIsNone(run_log.value_at(points, 30.1))
        self.assertIsNone(run_log.value_at(points, -1))
        self.assertEqual(run_log.value_at(points, 30 * (1 + 1e-12)), 3.0)       # at the last, within rounding


class TestSeeds(unittest.TestCase):

    def test_three_seeds_of_two_settings_are_two_groups_with_mean_and_spread(self):
        tmp = folder(self)
        paths = {}
        for variant in ('flat', 'transformer'):
            for seed in (1, 2, 3):          # what does not change a result differs too: folders, logging, threads
                paths[variant, seed] = os.path.join(tmp, f'{variant}_{seed}')
                write_log(paths[variant, seed], variant, seed, log_every=20 if seed < 3 else 10,
                          settings={'threads': seed, 'log_to': 'tensorboard' if seed == 2 else ''})
        other_lr = os.path.join(tmp, 'flat_lr')
        write_log(other_lr, 'flat', 1, lr=1e-3)
        r = compare_cmd(*paths.values(), other_lr, '--out', os.path.join(tmp, 'c.pdf'))
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(tmp, 'c.pdf'), 'rb') as f:
            self.assertEqual(f.read(5), b'%PDF-')
        rows = table_rows(r.stdout, first=False)
        self.assertEqual(column(rows, 'n'), ['3', '3', '1'])
        self.assertEqual(column(rows, 'seeds'), ['1, 2, 3', '1, 2, 3', '1'])
        self.assertEqual(column(rows, 'settings that differ'),
                         ['learning_rate=0.003, variant=flat', 'learning_rate=0.003, variant=transformer',
                          'learning_rate=0.001, variant=flat'])
        for row, variant in zip(rows[1:3], ('flat', 'transformer')):
            finals = [val_loss(variant, s, 400) for s in (1, 2, 3)]
            mean, half = sum(finals) / 3, (max(finals) - min(finals)) / 2
            self.assertEqual(row[rows[0].index('final val loss')], f'{mean:.4f} +- {half:.4f}')
            self.assertEqual(row[-1], f'{mean:.4f} +- {half:.4f}')          # the budget: every run's last step
            self.assertEqual(row[0], paths[variant, 1] + ' +2')
        self.assertEqual(rows[3][-1], f'{val_loss("flat", 1, 400):.4f}')

    def test_the_figure_draws_a_groups_mean_and_its_band(self):
        """draw() on a group of three runs and a run alone: the group's validation curve is the mean of its runs'
        (interpolated where their x's differ), the band from the lowest to the highest, its legend saying so."""
        tmp = folder(self)
        speeds = {1: 100.0, 2: 120.0, 3: 150.0}            # the seconds axis: three runs' evaluations apart
        for seed, ms in speeds.items():
            write_log(os.path.join(tmp, f's{seed}'), 'flat', seed, ms=lambda s, ms=ms: ms)
        write_log(os.path.join(tmp, 'alone'), 'transformer', 1)
        runs = [run_log.read_run(os.path.join(tmp, n)) for n in ('s1', 's2', 's3', 'alone')]
        groups = run_log.group_runs(runs)
        self.assertEqual([len(g) for g in groups], [3, 1])
        figures = []
        args = SimpleNamespace(smooth=1, logy=False, ylim=None, dpi=50)
        with mock.patch.object(compare, 'save_figure', lambda fig, path, **kw: figures.append(fig) or 'plot: x'):
            compare.draw(groups, 'seconds', 40.0, os.path.join(tmp, 'f.png'), args)
        ax = figures[0].axes[0]
        bands = [c for c in ax.collections]
        self.assertEqual(len(bands), 1)                     # the group's; the run alone has none
        group_line = next(l for l in ax.lines if l.get_label().startswith('flat'))
        self.assertIn('mean of 3 runs, band lowest-highest', group_line.get_label())
        xs = list(group_line.get_xdata())
        want = sorted({ms * s / 1000 for ms in speeds.values() for s in range(0, 401, 100) if ms * s / 1000 <= 40.0})
        self.assertEqual(len(xs), len(want))                  # every run covers 0 to 40 s
        for x, w in zip(xs, want):
            self.assertAlmostEqual(x, w, places=9)
        ys = list(group_line.get_ydata())
        curves = [[(speeds[s] * step / 1000, val_loss('flat', s, step)) for step in range(0, 401, 100)] for s in speeds]
        for x, y in zip(xs, ys):
            each = [run_log.value_at(c, x) for c in curves]
            self.assertAlmostEqual(y, sum(each) / 3, places=12)
        path = bands[0].get_paths()[0].vertices
        self.assertAlmostEqual(path[:, 1].min(), min(min(v for _, v in c if _ <= 40.0) for c in curves), places=9)


class TestLoad(unittest.TestCase):

    def test_a_loaded_and_a_quiet_run_are_flagged_on_the_seconds_axis(self):
        tmp = folder(self)
        quiet, loaded, old, none = (os.path.join(tmp, n) for n in ('quiet', 'loaded', 'old', 'none'))
        write_log(quiet, seed=1, load=0.1)
        write_log(loaded, seed=2, load=1.4, ms=lambda s: 180.0)
        write_log(old, seed=3)                                  # a log older than the field
        write_log(none, seed=4, load=None)                      # the field, unknown
        out = os.path.join(tmp, 'c.png')
        r = compare_cmd(quiet, loaded, old, none, '--x', 'seconds', '--out', out)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = error_lines(r.stderr)
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertRegex(lines[0], r'^compare.py: warning: on the seconds axis these runs trained under loads more '
                                   r'than 0.5 cores apart .*quiet 0.1, .*loaded 1.4\): their seconds are not '
                                   'comparable$')
        self.assertEqual(column(table_rows(r.stdout), 'other load'), ['0.1', '1.4', 'unknown', 'unknown'])
        r = compare_cmd(quiet, loaded, '--out', out, '--overwrite')           # steps: the load does not matter
        self.assertEqual((r.returncode, r.stderr), (0, ''))
        near = os.path.join(tmp, 'near')
        write_log(near, seed=5, load=0.5)
        r = compare_cmd(quiet, near, '--x', 'seconds', '--out', out, '--overwrite')    # 0.4 cores apart
        self.assertEqual((r.returncode, r.stderr), (0, ''))


class TestPeak(unittest.TestCase):

    def test_mfu_against_one_stated_peak(self):
        """Run a states 300 GFLOP/s; run b, two processes of 79 each; run c's config says 300 but a later record
        (a precision chosen) 150, before its intervals. Every MFU against a's 300 (or --peak), each run's own
        peak named."""
        tmp = folder(self)
        a, b, c = (os.path.join(tmp, n) for n in 'abc')
        write_log(a)
        recs = write_log(b, world=2)
        recs[0]['peak_flops'], recs[0]['peak'] = 79e9, 'the measured float32 matmul peak, 79 GFLOP/s per process'
        with open(os.path.join(b, 'log.jsonl'), 'w') as f:
            f.writelines(json.dumps(r) + '\n' for r in recs)
        write_log(c, extra=[{'event': 'precision', 'peak_flops': 150e9, 'peak': 'the measured bfloat16 peak'}])
        tok_s = {a: TPS / 0.1, b: 2 * TPS / 0.1, c: TPS / 0.1}           # 100 ms a step
        for flags, peak, header in (([], PEAK, 'MFU of 300 GFLOP/s'), (['--peak', '1e12'], 1e12, 'MFU of 1.0 TFLOP/s')):
            r = compare_cmd(a, b, c, '--out', os.path.join(tmp, 'c.png'), '--overwrite', *flags)
            self.assertEqual(r.returncode, 0, r.stderr)
            rows = table_rows(r.stdout)
            self.assertEqual(column(rows, 'peak stated'), ['300 GFLOP/s measured', '2 x 79 GFLOP/s measured',
                                                           '150 GFLOP/s measured'])
            self.assertEqual(column(rows, header), [f'{100 * tok_s[p] * FLOPS_PER_TOKEN / peak:.1f}%' for p in (a, b, c)])
        self.assertIn("over one peak, --peak 1.0 TFLOP/s", r.stdout)


class TestBadInput(unittest.TestCase):

    def test_a_log_line_that_is_json_but_not_a_record_is_named(self):
        tmp = folder(self)
        run = os.path.join(tmp, 'run')
        write_log(run)
        with open(os.path.join(run, 'log.jsonl')) as f:
            lines = f.readlines()
        out = os.path.join(tmp, 'c.png')
        for text, words in (('3', 'a JSON number'), ('[1, 2]', 'a JSON array'), ('"step 4"', 'a JSON string'),
                            ('null', 'a JSON null'), ('true', 'a JSON boolean'),
                            ('{"event": "train", "step": 30, "loss": 1, "lr": 1, "ms_per_step": 9, "other_load": "x"}',
                             "a record train.py would not write (ValueError: other_load 'x' is not a number)"),
                            ('{"event": "eval", "step": "four"}', 'a record train.py would not write')):
            with self.subTest(text):
                with open(os.path.join(run, 'log.jsonl'), 'w') as f:
                    f.writelines(lines[:3] + [text + '\n'] + lines[3:])
                r = compare_cmd(run, '--out', out)
                self.assertEqual((r.returncode, r.stdout), (2, ''), r.stderr)
                got = error_lines(r.stderr)
                self.assertEqual(len(got), 1, r.stderr)
                self.assertTrue(got[0].startswith(f'compare.py: error: {run}/log.jsonl, line 4: ' + (
                    'a JSON ' if words.startswith('a JSON') else 'a record train.py')), got)
                self.assertIn(words, got[0])
                self.assertEqual(sorted(os.listdir(tmp)), ['run'])

    def test_bad_flags_are_one_line_and_nothing_is_written(self):
        tmp = folder(self)
        run = os.path.join(tmp, 'run')
        write_log(run)
        existing = os.path.join(tmp, 'mine.svg')
        with open(existing, 'w') as f:
            f.write('a figure')
        os.makedirs(os.path.join(tmp, 'run2', 'tensorboard'))
        write_log(os.path.join(tmp, 'run2'))
        out = os.path.join(tmp, 'c.png')
        for args, words in ((['--out', os.path.join(tmp, 'c.jpg')], 'png, svg or pdf'),
                            (['--ylim', '5'], 'expected LO,HI'), (['--ylim', '5,3'], 'LO < HI'),
                            (['--ylim', 'a,b'], 'expected LO,HI'), (['--ylim', '0,5', '--logy'], 'above 0'),
                            (['--dpi', '0'], '--dpi: must be >= 10'), (['--smooth', '0'], '--smooth: must be >= 1'),
                            (['--budget', '-1'], '--budget: must be positive'), (['--peak', 'fast'], '--peak'),
                            (['--out', existing], 'exists; remove it'),
                            (['--to', 'tensorboard', '--out', out], 'drop --out'),
                            (['--to', 'wandb'], "invalid choice: 'wandb'")):
            with self.subTest(args):
                r = compare_cmd(run, *args, *([] if '--out' in args or '--to' in args else ['--out', out]))
                self.assertEqual((r.returncode, r.stdout), (2, ''), r.stderr)
                self.assertEqual(len(error_lines(r.stderr)), 1, r.stderr)
                self.assertIn(words, r.stderr)
        r = compare_cmd(os.path.join(tmp, 'run2'), '--to', 'tensorboard')
        self.assertEqual((r.returncode, r.stdout), (2, ''), r.stderr)
        self.assertIn('tensorboard exists', r.stderr)
        self.assertEqual(sorted(os.listdir(tmp)), ['mine.svg', 'run', 'run2'])
        self.assertEqual(os.listdir(os.path.join(tmp, 'run2', 'tensorboard')), [])
        with open(existing) as f:
            self.assertEqual(f.read(), 'a figure')
        for name, magic in (('a.svg', b'<?xml'), ('b.PNG', b'\x89PNG'), ('c.pdf', b'%PDF-')):
            with self.subTest(name):
                r = compare_cmd(run, '--out', os.path.join(tmp, name), '--logy', '--ylim', '1.5,9', '--smooth', '3',
                                '--dpi', '50')
                self.assertEqual(r.returncode, 0, r.stderr)
                with open(os.path.join(tmp, name), 'rb') as f:
                    self.assertEqual(f.read(len(magic)), magic)
                self.assertTrue(os.path.isfile(os.path.join(tmp, name[:-4] + '.md')))


if __name__ == '__main__':
    unittest.main()
