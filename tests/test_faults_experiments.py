"""The experiments' caches, pages and faults (issue "Nothing lost II"): python test_mixer.py test_faults_experiments

    TestCacheKeys     one rule for every cached job (runner.job): every setting in the key, rates at full
                      precision; a result of other settings, or whose files its check finds damaged, runs again
    TestDuplicates    a kind, cell, rate or rung named twice is refused in one line
    TestPages         a page is written from a finished plan of its own kind only, with its figure, whole
    TestReports       reports meet failed and diverged runs without raising (an in-context plan of nothing
                      finite keeps its tables, its figure skipped); a full disk while a figure is written is
                      one line and leaves no temporary file; a figure's folder not made yet is made
    TestModules       a module that is not a command says so, exit 2; a command the runner runs in its pool
                      process gives its output and exit status as its own process would, and leaves the
                      process as it was
    TestCtrlC         two SIGINTs while mqar's pool runs (timeout -s INT signals the process and its group):
                      one line, exit 130, the rerun resumes
"""

import contextlib
import errno
import io
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

import torch

from harness.flags import check_folder_writable
from experiments import claims, icl, icl_ladder, icl_report, mqar
from experiments.commands import run_command
from experiments.runner import Runner, job, save_figure, spec_key
from tests.common import run_in_process
from tests.faults import LINUX, interrupt_pool, kill_session, popen, session_alive


def echo_job(spec, run_dir):
    """A Runner job (run in a pool process) -> {'rc': 0, 'line', 'ran': spec}."""
    return {'rc': 0, 'line': 'ran', 'ran': spec}


def refuses(test, parse, args, words=()):
    """parse(args) exits 2 with one line on stderr holding each of `words` -> that line."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), test.assertRaises(SystemExit) as e:
        parse(args)
    test.assertEqual(e.exception.code, 2, err.getvalue())
    lines = err.getvalue().strip().splitlines()
    test.assertEqual(len(lines), 1, err.getvalue())
    for w in words:
        test.assertIn(w, lines[0])
    return lines[0]


class TestCacheKeys(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def mqar_jobs(self, *argv):
        """mqar's planned jobs of a command line (in this process) -> {folder: spec}."""
        args = mqar.parse_args([*argv, '--out', self.tmp])
        return {j.dir: j.spec for j, _ in mqar.plan(args.s, args.kinds, mqar.N_LAYER, args.s['seed'], args.out)}

    def test_every_setting_and_the_full_rate_is_in_a_recall_jobs_folder(self):
        base = ['--quick', '--kinds', 'flat']
        folders = {}
        for extra in ([], ['--epochs', '1'], ['--n_train', '2048'], ['--seed', '1'], ['--batch_size', '16'],
                      ['--vocab_size', '34'], ['--cells', '16:3'], ['--lrs', '0.0010001'], ['--weight_decay', '0'],
                      ['--fields', 'n_head=2'], ['--patience', '3']):
            jobs = self.mqar_jobs(*base, *extra)
            self.assertEqual(len(jobs), 1)
            folders[' '.join(extra)] = next(iter(jobs))
        self.assertEqual(len(set(folders.values())), len(folders), folders)      # no two share a folder
        self.assertEqual(self.mqar_jobs(*base), self.mqar_jobs(*base))              # and the same settings, one

    def test_two_rates_past_the_printed_digits_are_two_jobs_and_two_rows(self):
        jobs = self.mqar_jobs('--quick', '--kinds', 'flat', '--lrs', '0.0010001,0.0010002')
        self.assertEqual(len(jobs), 2)
        self.assertEqual(sorted(s['lr'] for s in jobs.values()), [0.0010001, 0.0010002])
        self.assertNotEqual(spec_key(0.0010001), spec_key(0.0010002))
        self.assertEqual(spec_key((1, 2.5)), spec_key([1, 2.5]))          # a tuple and its JSON round trip

    def test_two_cells_of_one_T_are_two_rows_of_the_grid(self):
        ok = {'rc': 0, 'acc': 0.5, 'epochs': 1, 'seconds': 1, 'diverged': False, 'test_loss': 1.0}
        args = mqar.parse_args(['--quick', '--kinds', 'flat', '--cells', '16:2,16:3', '--out', self.tmp])
        jobs = mqar.plan(args.s, args.kinds, 2, 0, self.tmp)

        class Fake:
            def map(self, fn, js, what):
                return [ok for _ in js]
        grid = mqar.run_grid(Fake(), args.s, jobs, {sh: 0.1 for _, sh in jobs}, 'test')
        self.assertEqual(sorted(grid), [('flat', 2, 16, 2, 32), ('flat', 2, 16, 3, 32)])

    def test_claims_runs_of_another_budget_are_other_folders(self):
        """A run with another --budget (other steps) never replaces a cached run of this one."""
        dirs = []

        class Fake:
            def map(self, fn, js, what):
                dirs.extend(j.dir for j in js)
                return [{'rc': 0, 'evals': [(1, 4.0, 1.0, 0.1)], 'summary': None, 'line': ''} for _ in js]
        for budget_s in (10.0, 20.0):
            claims.lm_runs(Fake(), self.tmp, ['flat'], {'lm': []}, {'flat': 0.5}, budget_s, (1e-3,), 1)
        self.assertEqual(len(dirs), 2)
        self.assertNotEqual(dirs[0], dirs[1])

    def test_a_result_of_other_settings_or_damaged_files_runs_again_once_said(self):
        runner = Runner(self.tmp, 1, 1)
        a = job(self.tmp, 'a', {'lr': 1e-3}, 1.0, 'v1')
        damaged = job(self.tmp, 'b', {'lr': 1e-3}, 1.0, 'v1', check=lambda d, res: 'its state.pt is damaged')
        a2 = job(self.tmp, 'a', {'lr': 1e-3}, 1.0, 'v2')          # the same spec, another version of the code
        self.assertNotEqual(a2.dir, a.dir)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                runner.map(echo_job, [a, damaged], 'first')
                with open(os.path.join(a.dir, 'result.json')) as f:
                    res = json.load(f)
                os.makedirs(a2.dir)
                for d, argv in ((a.dir, {'lr': 2e-3}), (a2.dir, {'lr': 1e-3})):     # results of other settings
                    with open(os.path.join(d, 'result.json'), 'w') as f:
                        json.dump({**res, 'argv': argv}, f)
                again = runner.map(echo_job, [a, damaged, a2], 'second')
                cached = runner.map(echo_job, [a, a2], 'third')
        finally:
            runner.close()
        self.assertEqual(runner.ran, 2 + 3)                   # all three ran again: none was taken as done
        self.assertEqual([r.get('cached') for r in again], [None, None, None])
        self.assertEqual([r.get('cached') for r in cached], [True, True])
        warnings = [l for l in err.getvalue().splitlines() if l.startswith('warning')]
        self.assertEqual(len(warnings), 3, err.getvalue())
        self.assertIn('other settings', warnings[0])
        self.assertIn('state.pt is damaged', warnings[1])
        self.assertIn('other settings', warnings[2])
        with open(os.path.join(a.dir, 'settings.json')) as f:
            self.assertEqual(json.load(f), {'argv': {'lr': 1e-3}, 'version': 'v1'})

    def test_a_chain_checks_a_cached_jobs_files_only_where_the_next_job_runs(self):
        """Runner.chains: a cached job's check (the state the job after it reads) is made only where that
        job is to run: a finished chain whose states stayed on another machine is all cached; once its last
        job must run, the missing state of the job before it makes that one run too, and no earlier one."""
        missing = set()
        chain = [job(self.tmp, n, {'n': n}, 1.0, 'v1', check=lambda d, res: 'no state' if d in missing else None)
                 for n in 'abc']
        runner = Runner(self.tmp, 1, 1)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                runner.chains(echo_job, [chain], 'first')
                missing.update(j.dir for j in chain)             # every state gone: the results alone
                (cached,) = runner.chains(echo_job, [chain], 'all cached')
                self.assertEqual(runner.ran, 3)
                self.assertTrue(all(r.get('cached') for r in cached))
                os.remove(os.path.join(chain[2].dir, 'result.json'))
                missing.discard(chain[0].dir)                    # a's state is whole, b's is gone
                (again,) = runner.chains(echo_job, [chain], 'the last job again')
        finally:
            runner.close()
        self.assertEqual(runner.ran, 3 + 2)                      # c, and b whose state c reads
        self.assertEqual([r.get('cached') for r in again], [True, None, None])
        self.assertEqual(sum(l.startswith('warning') for l in err.getvalue().splitlines()), 1, err.getvalue())

    def test_a_damaged_fork_state_makes_its_rung_train_again(self):
        """The ladder's rung check: a finished rung needs its whole state.pt of its own spec; a diverged one none."""
        d = os.path.join(self.tmp, 'rung')
        os.makedirs(d)
        spec = {'rung': 1}
        self.assertIn('missing', icl_ladder.check_fork_state(d, {'finished': True, 'argv': spec}))
        icl_ladder.save_state(os.path.join(d, 'state.pt'), spec=spec, step=3)
        self.assertIsNone(icl_ladder.check_fork_state(d, {'finished': True, 'argv': spec}))
        self.assertIn('damaged', icl_ladder.check_fork_state(d, {'finished': True, 'argv': {'rung': 2}}))
        with open(os.path.join(d, 'state.pt'), 'r+b') as f:
            f.truncate(40)                                     # a torn write
        self.assertIn('damaged', icl_ladder.check_fork_state(d, {'finished': True, 'argv': spec}))
        self.assertIsNone(icl_ladder.check_fork_state(d, {'finished': False, 'argv': spec}))


class TestDuplicates(unittest.TestCase):

    def test_a_name_or_number_given_twice_is_refused(self):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        for args in (['--kinds', 'flat,transformer,flat'], ['--cells', '64:4,128:8,64:4'], ['--lrs', '1e-3,0.001'],
                     ['--d_models', '64,64'], ['--fields', 'n_head=1,n_head=2']):
            with self.subTest(args=args):
                refuses(self, mqar.parse_args, [*args, '--out', tmp], ['mqar.py: error:', 'twice'])
        for args in (['--mixer_ladder', '--mixer_rungs', '1,4,4'], ['--mixer_ladder', '--mixer_rates', '3e-3,0.003'],
                     ['--noise', '0,5,0'], ['--layers', '2,2']):
            with self.subTest(args=args):
                refuses(self, icl.parse_args, [*args, '--out', tmp], ['icl.py: error:', 'twice'])
        refuses(self, claims.parse_args, ['--models', 'flat,flat', '--out', tmp], ['claims.py: error:', 'twice'])


class TestPages(unittest.TestCase):

    PAGE = f'head\n{icl_ladder.BEGIN}\nold\n{icl_ladder.END}\ntail\n'

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        for d in ('docs', 'assets', 'out'):
            os.makedirs(os.path.join(self.tmp, d))
        self.page = os.path.join(self.tmp, 'docs', 'page.md')
        with open(self.page, 'w') as f:
            f.write(self.PAGE)

    def ladder(self, results, note):
        """icl.section (--mixer_ladder) with --docs on a plan of `results` whose figure's note is `note` -> exit code."""
        args = icl.parse_args(['--mixer_ladder', '--docs', self.page, '--out', os.path.join(self.tmp, 'out')])

        def plot(plan, L, path):
            if note.startswith('plot: '):
                with open(path, 'wb') as f:
                    f.write(b'png')
            return note
        with mock.patch.object(icl_ladder, 'ladder_runs', lambda *a: {'results': results}), \
                mock.patch.object(icl_ladder, 'ladder_report', lambda *a: 'the section'), \
                mock.patch.object(icl_ladder, 'plot_ladder', plot), \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                icl.section(args, [], 'mixer_ladder')
                code = 0
            except SystemExit as e:
                code = e.code
        return code, err.getvalue()

    def test_a_plan_with_a_failed_job_or_no_figure_leaves_the_page_and_figure_as_they_were(self):
        figure = os.path.join(self.tmp, 'assets', icl_ladder.FIGURE)
        with open(figure, 'wb') as f:
            f.write(b'old figure')
        for results, note, why in (([{'rc': 0, 'seconds': 1}, {'rc': 1, 'seconds': 1}], 'plot: x', '1 of 2 jobs failed'),
                                   ([{'rc': 0, 'seconds': 1}], 'plot not written: x (No space left on device)',
                                    'figure was not drawn')):
            with self.subTest(why=why):
                code, err = self.ladder(results, note)
                self.assertEqual(code, 1)
                self.assertIn(why, err)
                with open(self.page) as f:
                    self.assertEqual(f.read(), self.PAGE)
                with open(figure, 'rb') as f:
                    self.assertEqual(f.read(), b'old figure')
        code, _ = self.ladder([{'rc': 0, 'seconds': 1}], 'plot: x')        # a finished plan: written
        self.assertEqual(code, 0)
        with open(self.page) as f:
            self.assertEqual(f.read(), f'head\n{icl_ladder.BEGIN}\nthe section\n\n![The mixers\' budget ladder: '
                                       f'adjusted loss against prompts seen](../assets/{icl_ladder.FIGURE})\n'
                                       f'{icl_ladder.END}\ntail\n')
        with open(figure, 'rb') as f:
            self.assertEqual(f.read(), b'png')
        self.assertEqual(sorted(os.listdir(os.path.dirname(figure))), [icl_ladder.FIGURE])   # no temporary file

    def test_a_quick_run_may_not_write_a_page(self):
        refuses(self, icl.parse_args, ['--mixer_ladder', '--quick', '--docs', self.page, '--out', self.tmp],
                ['--quick'])


class TestReports(unittest.TestCase):

    def test_a_full_disk_while_a_figure_is_written_is_a_note_and_leaves_no_file(self):
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        path = os.path.join(tmp, 'fig.png')
        with open(path, 'wb') as f:
            f.write(b'old')

        def full(fname, **kw):
            with open(fname, 'wb') as f:
                f.write(b'half')
            raise OSError(errno.ENOSPC, 'No space left on device')
        fig = plt.figure()
        with mock.patch.object(fig, 'savefig', full):
            note = save_figure(fig, path)
        self.assertEqual(note, f'plot not written: {path} (No space left on device)')
        self.assertEqual(os.listdir(tmp), ['fig.png'])
        with open(path, 'rb') as f:
            self.assertEqual(f.read(), b'old')

    def test_a_figure_in_a_folder_not_made_yet_is_written(self):
        """The folder check accepts a folder not made yet ('made when written'): save_figure, which every
        figure goes through, makes it (not 'plot not written' with exit 0)."""
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        path = os.path.join(tmp, 'new', 'deeper', 'fig.png')
        check_folder_writable(os.path.dirname(path))
        fig = plt.figure()
        fig.gca().plot([0, 1], [1, 0])
        self.assertEqual(save_figure(fig, path), f'plot: {path}')
        self.assertEqual(os.listdir(os.path.dirname(path)), ['fig.png'])
        with open(path, 'rb') as f:
            self.assertEqual(f.read(8), b'\x89PNG\r\n\x1a\n')

    def test_icl_verdicts_meet_models_that_diverged(self):
        """Every LSA model diverged (no sigma sweep of its own): the verdicts still come, none raises."""
        inf = float('inf')
        models = [(7, 'diag'), (7, 'full'), (7, 'gdpp'), (4, 'diag'), (4, 'full')]
        noises = ['0', '1', '5', 'c13']
        adj = {m: {n: inf for n in noises} for m in models}
        base = {k: {n: 1.0 for n in noises} for k in ('CONSTRR', 'ADARR', 'TUNEDRR')}
        out = icl_report.verdicts(adj, base, {}, noises)
        self.assertGreater(len(out), 3)
        self.assertTrue(all(v in ('agree', 'disagree') for _, _, v in out))

    def icl_table_1(self, lsa_results):
        """icl.run_all of a 2-layer DIAG at noise 3, one seed, on a tmp --out, with the LSA jobs' outcome
        `lsa_results` (run_lsa's (jobs, results)) -> (exit code, stderr, OUT/icl.md, OUT holds icl.png)."""
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        args = icl.parse_args(['--quick', '--noise', '3', '--layers', '2', '--params', 'diag', '--seeds', '1',
                               '--workers', '1', '--out', tmp])
        args.argv = []
        code = 0
        with mock.patch.object(icl, 'run_lsa', return_value=lsa_results), \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                icl.run_all(args)
            except SystemExit as e:
                code = e.code
        with open(os.path.join(tmp, 'icl.md')) as f:
            return code, err.getvalue(), f.read(), os.path.exists(os.path.join(tmp, 'icl.png'))

    def test_an_icl_plan_whose_every_model_failed_or_diverged_keeps_its_tables(self):
        """Table 1 of a plan whose every LSA job failed (a ZeroDivisionError in the figure's layout once: no
        column was left) or whose every model diverged: the table has its column, 'failed' or 'diverged', the
        figure is skipped with a note (nothing finite to draw), and a failed job is exit 1."""
        code, err, report, figure = self.icl_table_1(([], []))
        self.assertEqual(code, 1, err)
        self.assertIn('| model | U(0,3) |', report)
        self.assertIn('| 2L DIAG | failed |', report)
        self.assertIn('plot skipped: no model has a finite loss', err)
        self.assertIn('1 LSA jobs FAILED', err)
        self.assertFalse(figure)
        self.assertTrue(icl_report.plot({}, {}, {}, [], [(2, 'diag')], 'icl.png').startswith('plot skipped'))
        spec = {**icl.lsa_groups([(2, 'diag')], [('3', 0)], icl.SETTINGS['quick'], 40)[0][1], 'noise': '3', 'seed': 0}
        inf = float('inf')
        diverged = {'rc': 0, 'noise': '3', 'seed': 0, 'curve': [], 'rollbacks': 8, 'finished': False, 'params': 8,
                    'eval': inf, 'sweep': inf}
        code, err, report, figure = self.icl_table_1(([('lsa-diag-L2-iters40', spec)], [diverged]))
        self.assertEqual(code, 0, err)
        self.assertIn('| 2L DIAG | diverged (0.188)* |', report)             # ours (the paper's)
        self.assertIn('plot skipped: no model has a finite loss', err)
        self.assertFalse(figure)

    def test_a_noise_whose_variance_overflows_is_refused(self):
        """--noise 1e200: sigma_max^2 overflows float64 and every job of it would fail building its model."""
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        refuses(self, icl.parse_args, ['--noise', '3,1e200', '--out', tmp], ['icl.py: error:', '1e200', 'too large'])
        self.assertEqual(icl.parse_args(['--noise', '3,1e30', '--out', tmp]).noises, ['3', '1e30'])

    def test_a_ladder_cell_of_a_failed_job_says_failed_not_diverged(self):
        L = dict(icl_ladder.SETTINGS['quick'], eval_prompts=200, sweep_prompts=200, curve_prompts=100)
        cfgs = icl_ladder.configs(L)
        ok = {'rc': 0, 'finished': True, 'eval': 4.0, 'sweep': 4.0, 'branch': [(1, 1.0, 4.0)], 'curve': [],
              'train_seconds': [1.0, 1.0], 'probes': {'products': 0.1, 'sum_first': 0.1, 'sum_last': 0.1}}
        diverged = {'rc': 0, 'finished': False, 'eval': float('inf'), 'sweep': float('inf'), 'branch': [],
                    'curve': []}
        failed = {'rc': 1, 'line': 'no stable state from the rung before'}
        runs = {c: {r: [ok, ok] for r in c[4]} for c in cfgs}
        runs[cfgs[0]][cfgs[0][4][-1]] = [ok, failed]
        runs[cfgs[1]][cfgs[1][4][-1]] = [ok, diverged]
        keys = {(c[0], c[1], c[3]) for c in cfgs}
        plan = {'configs': cfgs, 'step_s': dict.fromkeys(keys, 0.01), 'base': dict.fromkeys(keys, 10),
                'lr': dict.fromkeys(cfgs, 1e-3), 'sweep': {c: {1: {1e-3: ok}} for c in cfgs}, 'runs': runs,
                'top': {c: [ok] for c in cfgs}}
        table = icl_ladder.ladder_report(plan, L).split('\n\n')[1]
        rows = table.splitlines()[2:]
        self.assertTrue(rows[0].startswith(f'| {icl_ladder.label(cfgs[0])} | {cfgs[0][3]} |'), table)
        self.assertTrue(rows[0].endswith('| failed |'), table)
        self.assertTrue(rows[1].endswith('| diverged |'), table)


class TestModules(unittest.TestCase):

    COMMANDS = {'train.py', 'sample.py', 'retrieval.py', 'experiments/look.py', 'test_mixer.py', 'data/prepare.py',
                'experiments/bench.py', 'experiments/claims.py', 'experiments/gpu_check.py', 'experiments/icl.py',
                'experiments/mqar.py', 'experiments/represent.py', 'experiments/profiles.py', 'experiments/convert.py',
                'experiments/eval_tasks.py', 'experiments/compare.py'}

    def test_a_module_that_is_not_a_command_says_so(self):
        """Every .py file of the repository root, data/, harness/ and experiments/ that is not a command: run as one
        (a file, or -m for the packages' modules), one line saying so, exit 2, nothing on stdout."""
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        modules = sorted({os.path.join(d, f) for d in ('', 'data', 'harness', 'experiments')
                          for f in os.listdir(os.path.join(root, d))
                          if f.endswith('.py') and f != '__init__.py'} - self.COMMANDS)
        self.assertTrue({'mixer.py', 'experiments/runner.py', 'data/pairs.py', 'harness/cli.py'} <= set(modules), modules)
        for path in modules:
            args = ['-m', path[:-3].replace('/', '.')] if '/' in path else [path]
            with self.subTest(module=path):
                r = run_in_process(*args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn('not a command', r.stderr)
                self.assertEqual(r.stdout, '')

    def test_a_command_run_in_the_pool_process_is_as_its_own_process(self):
        """runner.run_command of retrieval.py (an IN_PROCESS command) starts no process: its one-line error
        in the output file, its exit status 2, no temporary file; the thread count its --threads set, the
        working directory and sys.argv are the caller's again after it."""
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        out, threads, cwd, argv = os.path.join(tmp, 'out.txt'), torch.get_num_threads(), os.getcwd(), list(sys.argv)
        self.addCleanup(torch.set_num_threads, threads)
        os.chdir(tmp)
        self.addCleanup(os.chdir, cwd)
        with mock.patch('subprocess.Popen', side_effect=AssertionError('a process was started')):
            rc = run_command(['retrieval.py', '--ckpt', 'none.pt', '--threads', str(threads + 2)], out)
        self.assertEqual(rc, 2)
        with open(out) as f:
            self.assertEqual(f.read(), "retrieval.py: error: checkpoint 'none.pt' not found\n")
        self.assertEqual(os.listdir(tmp), ['out.txt'])
        self.assertEqual((torch.get_num_threads(), os.getcwd(), sys.argv), (threads, tmp, argv))


@unittest.skipUnless(LINUX, 'reads /proc')
class TestCtrlC(unittest.TestCase):

    def test_two_sigints_while_the_pool_runs_are_one_line_and_exit_130_and_the_rerun_resumes(self):
        out = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, out, ignore_errors=True)
        args = ['-m', 'experiments.mqar', '--quick', '--kinds', 'flat,transformer', '--deep_layers', '0',
                '--epochs', '1', '--n_train', '512', '--n_test', '64', '--out', out]
        interrupt_pool(self, args, '2-layer models: ', sigints=2)
        r = run_in_process(*args, env={**os.environ, 'OMP_NUM_THREADS': '1'})       # the same command resumes
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertIn('| flat | 0.', r.stdout)

    def test_a_killed_main_process_leaves_no_pool_process_training(self):
        """kill -9 of the main process: its pool process ends within seconds (pool._watch_parent) rather than
        training on with no one to read its result, whether it was busy with a job (killed 3 s after it loaded
        torch) or still importing (killed the moment it loads torch's library: it then learnt its parent's pid
        after the kill, and waited for the process that adopted it; on a loaded machine the first case was
        this one)."""
        for case, settle in (('importing', 0), ('busy with a job', 3)):
            out = tempfile.mkdtemp()
            self.addCleanup(shutil.rmtree, out, ignore_errors=True)
            p = popen(['-m', 'experiments.mqar', '--quick', '--kinds', 'transformer', '--deep_layers', '0',
                       '--epochs', '1000', '--n_train', '512', '--n_test', '64', '--out', out],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                t0 = time.time()
                while not importing_torch(pool_processes(p.pid)) and p.poll() is None and time.time() - t0 < 600:
                    time.sleep(0.02)
                time.sleep(settle)
                workers = pool_processes(p.pid)
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
                t1 = time.time()
                while session_alive(p.pid) and time.time() - t1 < 120:      # a second or two when it works
                    time.sleep(0.2)
                with self.subTest(case):
                    self.assertTrue(workers, 'staging: no pool process started')
                    self.assertEqual(session_alive(p.pid), [], 'a pool process outlived its main process')
            finally:
                kill_session(p)


def pool_processes(sid):
    """Pids of the spawned pool processes of session `sid` (multiprocessing's spawn_main; Linux /proc)."""
    out = []
    for pid in session_alive(sid):
        with contextlib.suppress(OSError):
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                if b'spawn_main' in f.read():
                    out.append(pid)
    return out


def importing_torch(pids):
    """True if a process of `pids` has mapped torch's C++ library (its import of torch has begun)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            with open(f'/proc/{pid}/maps') as f:
                if 'libtorch' in f.read():
                    return True
    return False

if __name__ == '__main__':
    unittest.main()
