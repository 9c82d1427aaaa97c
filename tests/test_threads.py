"""The CPU's threads chosen by measuring (harness/machine.py ThreadChoice, train.py --threads): the faster of
two counts is kept when one is made slow, a change of load is followed, measuring costs little, a fixed
count turns it off, train.py logs each change and resumes. Step times here are made up (a fake clock per
thread count), never the wall clock: no verdict depends on the machine."""

import contextlib
import io
import os
import shutil
import tempfile
import unittest
from unittest import mock

import torch

from harness import machine
from tests.common import prepared_data, read_log, run_in_process, tiny_model


class FakeMachine:
    """Seconds a step takes at each thread count, as the test sets them (`times`: {threads: seconds})."""

    def __init__(self, times):
        self.times, self.spent = dict(times), 0.0

    def step(self, choice):
        """One step at torch's current thread count -> choice.stepped's answer; the seconds are added up."""
        t = self.times[torch.get_num_threads()]
        self.spent += t
        return choice.stepped(t)


class TestThreadChoice(unittest.TestCase):

    def setUp(self):
        self.addCleanup(torch.set_num_threads, torch.get_num_threads())

    def run_steps(self, fake, choice, n):
        """n steps -> the changes choice made."""
        return [c for c in (fake.step(choice) for _ in range(n)) if c]

    def test_the_faster_count_is_kept(self):
        """Quiet, 2 threads twice as fast: 2 is kept (no change from the start, 2); beside a busy process, 2
        threads made 6x slower: 1 is chosen, the change saying both rates."""
        quiet, loaded = {1: 0.30, 2: 0.16}, {1: 0.31, 2: 1.0}
        choice = machine.ThreadChoice(cores=2)
        self.assertEqual(self.run_steps(FakeMachine(quiet), choice, 30), [])
        self.assertEqual(torch.get_num_threads(), 2)
        choice = machine.ThreadChoice(cores=2)
        changes = self.run_steps(FakeMachine(loaded), choice, 30)
        self.assertEqual(torch.get_num_threads(), 1)
        self.assertEqual([(c['from'], c['threads']) for c in changes], [(2, 1)])
        self.assertAlmostEqual(changes[0]['rate'], 1 / 0.31)
        self.assertAlmostEqual(changes[0]['rate_from'], 1 / 1.0)

    def test_a_load_that_comes_and_goes_is_followed(self):
        """A busy process starts (2 threads' step 6x slower: the step time moves past the margin) and, with one
        thread chosen, ends (one thread's step unchanged: the idle core is seen): 2 -> 1, then 1 -> 2, each
        within a few steps."""
        fake = FakeMachine({1: 0.30, 2: 0.16})
        choice = machine.ThreadChoice(cores=2)
        self.run_steps(fake, choice, 40)
        fake.times = {1: 0.31, 2: 1.0}
        with mock.patch.object(machine, 'idle_cores', return_value=0.0):
            changes = self.run_steps(fake, choice, 15)
        self.assertEqual([(c['from'], c['threads']) for c in changes], [(2, 1)])
        fake.times = {1: 0.30, 2: 0.16}
        with mock.patch.object(machine, 'idle_cores', return_value=0.0):       # nobody says the core is free
            self.assertEqual(self.run_steps(fake, choice, 15), [])
        with mock.patch.object(machine, 'idle_cores', return_value=1.0):
            changes = self.run_steps(fake, choice, 20)
        self.assertEqual([(c['from'], c['threads']) for c in changes], [(1, 2)])

    def test_measuring_costs_under_two_percent_of_a_quiet_run(self):
        """2,000 quiet steps: the time spent measuring the slower count, against 2 threads throughout, is
        under 2% (periodic measuring every 250 steps, a slower count left after its tries)."""
        fake = FakeMachine({1: 0.30, 2: 0.16})
        choice = machine.ThreadChoice(cores=2)
        with mock.patch.object(machine, 'idle_cores', return_value=0.0):
            self.run_steps(fake, choice, 2000)
        self.assertLess(fake.spent / (2000 * 0.16), 1.02)
        self.assertGreater(fake.spent / (2000 * 0.16), 1.0)            # it did measure

    def test_a_fixed_count_is_never_changed(self):
        """--threads (fixed) or a single core: the count is set once, and no step changes it."""
        for kw, want in ((dict(cores=2, fixed=1), 1), (dict(cores=1), 1), (dict(cores=4, fixed=3), 3)):
            choice = machine.ThreadChoice(**kw)
            with self.subTest(**kw):
                self.assertEqual(self.run_steps(FakeMachine({1: 0.3, 2: 0.1, 3: 0.1, 4: 0.1}), choice, 40), [])
                self.assertEqual(torch.get_num_threads(), want)

    def test_candidates_are_powers_of_two_and_the_cores(self):
        self.assertEqual(machine.ThreadChoice(cores=6).candidates, [1, 2, 4, 6])
        self.assertEqual(machine.ThreadChoice(cores=2).candidates, [1, 2])


class TestOddCounts(unittest.TestCase):
    """Numbers where the thread flags expect a count (issue 90): a bool, a count too large for torch, one far
    above the cores, OMP_NUM_THREADS that is no ASCII count."""

    def setUp(self):
        self.addCleanup(torch.set_num_threads, torch.get_num_threads())

    def test_the_mfu_peak_counts_the_cores_not_more_threads(self):
        """measure_matmul_flops on a clock that says every batch of 4 products took 0.1 s (the best rate then
        8 n^3 / 0.1 FLOP/s a thread): 8 torch threads on 2 cores give the rate x 2, not x 8 (the peak was
        multiplied by every thread, once); 1 thread on 2 cores x 1."""
        ticks = iter(range(10 ** 6))
        rate = 4 * 2 * 64 ** 3 / 0.1
        with mock.patch.object(machine.time, 'thread_time', lambda: next(ticks) * 0.1), \
                mock.patch.object(machine, 'cpu_share', return_value=2):
            for threads, want in ((8, 2 * rate), (1, rate)):
                torch.set_num_threads(threads)
                self.assertAlmostEqual(machine.measure_matmul_flops('cpu', n=64, seconds=0.3), want, delta=1)
                self.assertEqual(torch.get_num_threads(), threads)

    def test_omp_num_threads_odd_values(self):
        """OMP_NUM_THREADS above the cores: used, one warning line; a non-ASCII digit ('\u00b2', which
        str.isdigit takes: a ValueError once) or a list ('4,2'): not a count, the threads chosen; a count
        torch cannot run (a crash, once): ignored with one warning line."""
        for omp, fixed, warning in (('64', 64, 'OMP_NUM_THREADS=64 is more threads than the 2 cores'),
                                    ('\u00b2', None, None), ('4,2', None, None),
                                    ('99999999999999999999', None, 'ignored, the threads are chosen by')):
            with self.subTest(omp=omp), mock.patch.dict(os.environ, {'OMP_NUM_THREADS': omp}), \
                    mock.patch.object(machine, 'cpu_share', return_value=2), \
                    contextlib.redirect_stderr(io.StringIO()) as err:
                os.environ.pop('LOCAL_WORLD_SIZE', None)
                choice = machine.thread_choice()
                self.assertEqual((choice.candidates == [], torch.get_num_threads()),
                                 (True, fixed) if fixed else (False, 2))
                lines = err.getvalue().splitlines()
                self.assertEqual(len(lines), 1 if warning else 0, lines)
                if warning:
                    self.assertIn(warning, lines[0])

    def test_train_threads_flag(self):
        """train.py --threads=True (bool is an int to Python: a traceback from torch once), a count torch
        cannot run, and the other None-default counts given a bool: one line, exit 2; --threads=3 on 2 cores:
        one warning line, the run goes on with 3 threads, and log.jsonl's config record says 3."""
        out = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, out, ignore_errors=True)
        args = ['train.py', f'--data_dir={prepared_data()}', '--d_model=32', '--n_layer=1', '--n_ctx=32',
                '--batch_size=4', '--eval_windows=4', '--max_iters=2', '--eval_interval=2']
        for flag, words in (('--threads=True', 'threads must be None (chosen by measuring) or an int from 1'),
                            (f'--threads={10 ** 13}', 'threads must be None'),
                            ('--lr_decay_iters=True', 'lr_decay_iters must be None or an int >= 1, got True'),
                            ('--chunk_size=True', 'chunk_size must be None'),
                            ('--mixing_weight_decay=False', 'mixing_weight_decay must be a number >= 0')):
            with self.subTest(flag):
                r = run_in_process(*args, f'--out_dir={os.path.join(out, "bad")}', flag)
                lines = r.stderr.splitlines()
                self.assertEqual((r.returncode, len(lines)), (2, 1), r.stderr)
                self.assertTrue(lines[0].startswith('train.py: error: ') and words in lines[0], lines[0])
                self.assertFalse(os.path.exists(os.path.join(out, 'bad', 'log.jsonl')))
        with mock.patch.object(machine, 'cpu_share', return_value=2):
            r = run_in_process(*args, f'--out_dir={os.path.join(out, "many")}', '--threads=3')
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.splitlines(), ['warning: threads=3 is more threads than the 2 cores this '
                                                 'process may use: they wait for one another (a slower step), '
                                                 'and the MFU peak counts the cores alone'])
        config, = [e for e in read_log(os.path.join(out, 'many')) if e['event'] == 'config']
        self.assertEqual((config['config']['threads'], config['threads']), (3, 3))


class TestEvalTasksThreads(unittest.TestCase):

    def test_eval_tasks_chooses_as_train_does(self):
        """experiments.eval_tasks' model (ProjectLM) holds a ThreadChoice over the process's cores (OMP_NUM_THREADS
        unset) and feeds it each forward's seconds a token: work = the batch's tokens; OMP_NUM_THREADS fixes it."""
        from experiments import eval_tasks
        self.addCleanup(torch.set_num_threads, torch.get_num_threads())
        env = {k: v for k, v in os.environ.items() if k != 'OMP_NUM_THREADS'}
        with mock.patch.dict(os.environ, env, clear=True), mock.patch.object(machine, 'cpu_share', return_value=2):
            lm = eval_tasks.ProjectLM(tiny_model('flat'), None, batch_size=2)
        self.assertEqual(lm.threads.candidates, [1, 2])
        works = []
        with mock.patch.object(lm.threads, 'stepped', lambda seconds, work=1.0: works.append(work)):
            lm._loglikelihood_tokens([(None, [1, 2, 3], [4, 5]), (None, [1], [2]), (None, [1, 2], [3])])
        self.assertEqual(works, [2 * 4, 1 * 1])           # two forwards, longest first: [2, 4] (padded) and [1, 1]
        self.assertEqual(eval_tasks.ProjectLM(tiny_model('flat'), None).threads.candidates, [])   # OMP_NUM_THREADS=1


class TestTrainPyThreads(unittest.TestCase):

    def test_train_logs_each_change_and_resumes(self):
        """train.py on the CPU, its threads chosen (OMP_NUM_THREADS unset, --threads None) with a change
        made at its 12th step: the line 'threads 2 -> 1' and a 'threads' event at that step in log.jsonl; a
        resumed run goes on from its checkpoint; --threads=1 fixes the count (no choice)."""
        out, real = tempfile.mkdtemp(), machine.ThreadChoice.stepped
        calls = []

        def stepped(choice, seconds, work=1.0):
            calls.append(choice.candidates)
            real(choice, seconds, work)
            return {'threads': 1, 'from': 2, 'rate': 2.0, 'rate_from': 1.0} if len(calls) == 12 else None
        args = ['train.py', f'--data_dir={prepared_data()}', f'--out_dir={out}', '--d_model=32', '--n_layer=1',
                '--n_ctx=32', '--batch_size=4', '--eval_windows=4', '--eval_interval=10', '--log_interval=5',
                '--dtype=float32']     # the precision fixed: every step goes to the thread choice
        env = {k: v for k, v in os.environ.items() if k != 'OMP_NUM_THREADS'}
        with mock.patch.object(machine, 'cpu_share', return_value=2), \
                mock.patch.object(machine.ThreadChoice, 'stepped', stepped):
            r = run_in_process(*args, '--max_iters=20', env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn('step    12/20 | threads 2 -> 1: 0.1k -> 0.3k tokens/s', r.stdout)   # 128 tokens a step
            events = [e for e in read_log(out) if e['event'] == 'threads']
            self.assertEqual([(e['step'], e['from'], e['threads'], e['tokens_per_s']) for e in events], [(12, 2, 1, 256)])
            self.assertEqual(calls[0], [1, 2])
            calls.clear()
            r = run_in_process(*args, '--max_iters=30', '--init_from=resume', '--threads=1', env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(calls[0], [])                                     # fixed: nothing to choose
        self.assertEqual([e['step'] for e in read_log(out) if e['event'] == 'eval'], [0, 10, 20, 30])


if __name__ == '__main__':
    unittest.main()
