"""Faults at every entry point, second part (issue #35; the first and the shared helpers:
tests/test_faults.py, tests/faults.py): python test_mixer.py test_faults_outputs

    TestCachesAndOutputs prepare.py's stale temporary files, its lock and Ctrl-C; the run folder's
                         lock; the runner's damaged caches and torn logs; write_atomic; retrieval's --json failing
                         at the end and its cache failing (Ctrl-C during claims' pool: test_faults_ctrl_c)
    TestWritten          cli.written (an output whole, or as it was; the umask's modes) and
                         remove_stale_temps (a killed process's temporaries; an old folder put back)
    TestDistributed      slow (about 30 s): two gloo ranks under torchrun, one stopped (SIGSTOP)
                         or with a NaN loss: the other ends with one line, nothing hangs
    TestICLNoise         icl --noise inf refused
"""

import contextlib
import errno
import glob
import io
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
from types import SimpleNamespace
from unittest import mock

import torch

from tests.common import run, run_in_process
from tests.faults import (ENV, LINUX, TINY, Base, alive, ckpt_step, error_lines, hashes, kill_session,
                          popen, write)


# ----------------------------------------------------------------------------- caches and outputs

def cached_job(argv, run_dir):
    """A Runner job (run in a pool process): -> {'rc': 0, 'line', 'ran': argv, 'sigint': whether the pool
    process ignores Ctrl-C}."""
    return {'rc': 0, 'line': 'ran', 'ran': argv, 'sigint_ignored': signal.getsignal(signal.SIGINT) == signal.SIG_IGN}


def failing_job(argv, run_dir):
    """A Runner job that raises (a full disk, a GPU out of memory) when argv says so, else as cached_job."""
    if argv == ['raise']:
        raise OSError(errno.ENOSPC, 'No space left on device')
    return cached_job(argv, run_dir)


class TestCachesAndOutputs(Base):
    """prepare.py's temporary files and lock, the experiments' caches, Ctrl-C during a pool."""

    def test_prepare_removes_stale_temporary_files_and_keeps_live_ones(self):
        """A killed run's .NAME.tmpPID files (its pid gone) are removed with a note; a live run's are kept."""
        out = os.path.join(self.f.tmp, 'prep_stale')
        dead = subprocess.Popen(['true'])
        dead.wait()
        stale = write(os.path.join(out, f'.train.bin.tmp{dead.pid}'), b'\0' * 10)
        live = write(os.path.join(out, f'.val.bin.tmp{os.getpid()}'), b'\0' * 10)
        text = os.path.dirname(self.f.data)
        r = run('data/prepare.py', '--train', os.path.join(text, 'train.txt'), '--valid',
                os.path.join(text, 'valid.txt'), '--vocab_size', '300', '--out', out, env=ENV, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(error_lines(r.stderr), [f'prepare.py: note: removed 1 temporary files left in {out} by a '
                                                 f'run that stopped: {os.path.basename(stale)}'])
        self.assertFalse(os.path.exists(stale))
        self.assertTrue(os.path.exists(live))
        made, other = (hashes(os.path.join(d, 'train.bin')).popitem()[1] for d in (out, self.f.other))
        self.assertEqual(made, other)

    def test_prepare_refuses_a_folder_another_run_writes(self):
        """A second prepare.py on an --out that a live run holds: exit 2 naming its pid, the folder as it was."""
        import fcntl
        out = os.path.join(self.f.tmp, 'prep_locked')
        write(os.path.join(out, f'.train.bin.tmp{os.getpid()}'), b'\0' * 10)
        before = hashes(out)
        fd = os.open(out, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            r = run('data/prepare.py', '--train', 'x', '--valid', 'y', '--out', out, env=ENV, timeout=600)
        finally:
            os.close(fd)
        self.assert_fault(r, 2, ['another prepare.py', f'pid {os.getpid()}'])
        self.assertEqual(hashes(out), before)

    def test_a_lock_is_held_once_and_a_file_system_that_cannot_lock_is_named(self):
        """hold_lock (filelock's lock_descriptor): while one open file of a run folder's .lock holds it,
        another is refused (two runs, as the OS sees them); closed (its process gone, however it died), the
        next takes it. A file system that cannot lock is lock_run's one line naming the folder, not 'in use by
        another run' (every OSError read so) nor a traceback."""
        from harness.checkpoint import CheckpointError, lock_run
        from harness.cli import hold_lock
        out = os.path.join(self.f.tmp, 'lock_once')
        first = lock_run(out)
        with open(os.path.join(out, '.lock')) as second:
            self.assertFalse(hold_lock(second.fileno()))
            first.close()
            self.assertTrue(hold_lock(second.fileno()))
        cannot = OSError(errno.ENOLCK, 'No locks available')
        with mock.patch('harness.checkpoint.hold_lock', side_effect=cannot):
            with self.assertRaisesRegex(CheckpointError, f"^cannot lock the run folder '{out}' .*No locks"):
                lock_run(out)

    def test_runner_reruns_a_job_whose_cached_result_is_damaged(self):
        """A torn result.json: one warning line, the job runs again and its result is cached whole. (The pool
        process ignores Ctrl-C: the main process handles it, test_faults_ctrl_c.)"""
        from experiments.runner import Runner, job as make_job
        out = os.path.join(self.f.tmp, 'runner')
        j = make_job(out, 'job', ['a'], 1.0, 'v1')
        job = write(os.path.join(j.dir, 'result.json'), '{"argv": ["a"], "rc"')
        runner = Runner(out, 1, 1)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                res = runner.map(cached_job, [j], 'test')
        finally:
            runner.close()
        self.assertEqual(res[0]['ran'], ['a'])
        self.assertTrue(res[0]['sigint_ignored'])
        warnings = [l for l in err.getvalue().splitlines() if 'warning' in l]
        self.assertEqual(len(warnings), 1, err.getvalue())
        self.assertIn('result.json', warnings[0])
        with open(job) as fh:
            self.assertEqual(json.load(fh)['ran'], ['a'])

    def test_a_job_that_raises_is_a_failed_job_and_ends_its_chain(self):
        """A job raising in its pool process: a failed result naming the error (no traceback ending the run),
        nothing cached, the chain's later job not run, the other chain run, the progress count at its total."""
        from experiments.runner import Runner, job
        out = os.path.join(self.f.tmp, 'runner_raises')
        runner = Runner(out, 1, 1)
        jobs = [[job(out, 'a1', ['raise'], 1.0, 'v1'), job(out, 'a2', ['a2'], 1.0, 'v1')],
                [job(out, 'b1', ['b1'], 1.0, 'v1')]]
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                (a1, a2), (b1,) = runner.chains(failing_job, jobs, 'test')
        finally:
            runner.close()
        self.assertEqual((a1['rc'], a2['rc'], b1['rc']), (1, 1, 0))
        self.assertIn('OSError', a1['line'])
        self.assertIn('No space left on device', a1['line'])
        self.assertIn('not run', a2['line'])
        self.assertFalse(os.path.exists(os.path.join(jobs[0][0].dir, 'result.json')))
        self.assertEqual(runner.ran, 2)
        self.assertIn('[3/3]', err.getvalue())

    def test_claims_measures_a_damaged_step_time_again(self):
        """A torn result.json of a claims calibration job: one warning line, the step time (train.py's own
        step, measured in this process: a runner whose pool is this process) measured again and cached whole."""
        from concurrent.futures import Future
        from experiments import claims
        from experiments.runner import Runner

        class Inline(Runner):
            def __init__(self, out):
                self.out, self.workers, self.threads, self.ran = out, 1, 1, 0

            def submit(self, fn, *args):
                fut = Future()
                fut.set_result(fn(*args))
                return fut
        out = os.path.join(self.f.tmp, 'calibration')
        base = {'lm': [*TINY, f'--data_dir={self.f.data}'], 'ae': []}
        with contextlib.redirect_stderr(io.StringIO()):
            claims.calibrate(Inline(out), out, ['flat'], base, 5, False)
        path, = glob.glob(os.path.join(out, 'calibration', 'flat-*', 'result.json'))
        write(path, '{"rc": 0, "s_per_step": 0.0')
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            step_s = claims.calibrate(Inline(out), out, ['flat'], base, 5, False)
        self.assertGreater(step_s['flat'], 0)
        warnings = [l for l in err.getvalue().splitlines() if 'warning' in l]
        self.assertEqual(len(warnings), 1, err.getvalue())
        self.assertIn('result.json', warnings[0])
        with open(path) as fh:
            self.assertEqual(json.load(fh)['s_per_step'], step_s['flat'])

    def test_runner_read_log_drops_a_torn_last_line(self):
        """runner.read_log reads through loading.read_log: a torn last line is one warning, not a crash."""
        from experiments.runner import read_log
        path = write(os.path.join(self.f.tmp, 'torn', 'log.jsonl'),
                     json.dumps({'event': 'eval', 'step': 5, 'val_loss': 3.0, 'val_bpb': 1.0, 'val_acc': 0.1})
                     + '\n{"event": "eval", "st')
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            evals, summary = read_log(path)
        self.assertEqual((evals, summary), ([(5, 3.0, 1.0, 0.1)], None))
        self.assertEqual(len(err.getvalue().strip().splitlines()), 1, err.getvalue())

    def test_write_atomic_keeps_the_old_file_when_the_write_fails(self):
        """cli.write_atomic (retrieval's and represent's outputs): a failed write leaves the old
        file byte-identical and no temporary file."""
        from harness.cli import write_atomic
        path = write(os.path.join(self.f.tmp, 'atomic', 'results.json'), '{"old": 1}\n')
        with mock.patch('os.replace', side_effect=OSError(errno.ENOSPC, 'No space left on device')), \
                self.assertRaises(OSError):
            write_atomic(path, '{"new": 2}\n')
        self.assertEqual(os.listdir(os.path.dirname(path)), ['results.json'])
        with open(path) as fh:
            self.assertEqual(fh.read(), '{"old": 1}\n')

    def test_prepare_interrupted_leaves_its_out_folder_as_it_was(self):
        """Ctrl-C (KeyboardInterrupt, staged in the second split's encoding): exit 130, one line, --out as
        it was (the previous outputs byte-identical, no temporary file)."""
        from data import prepare
        out = os.path.join(self.f.tmp, 'prep_ctrl_c')
        shutil.copytree(self.f.other, out)
        before = hashes(out)
        text = os.path.dirname(self.f.data)
        calls = []

        def interrupted(enc, stream, fh, **kw):
            calls.append(1)
            if len(calls) == 2:
                fh.write(bytes(6))
                raise KeyboardInterrupt
            return real(enc, stream, fh, **kw)
        real = prepare.encode_stream
        err = io.StringIO()
        with mock.patch.object(prepare, 'encode_stream', interrupted), contextlib.redirect_stderr(err), \
                contextlib.redirect_stdout(io.StringIO()):
            try:
                code = prepare.main(['--train', os.path.join(text, 'train.txt'), '--valid',
                                     os.path.join(text, 'valid.txt'), '--vocab_size', '300', '--out', out,
                                     '--overwrite'])
            except KeyboardInterrupt:
                code = 'KeyboardInterrupt escaped prepare.main'
        self.assertEqual(code, 130)
        self.assert_fault(SimpleNamespace(returncode=code, stdout='', stderr=err.getvalue()), 130, ['interrupted'])
        self.assertEqual(hashes(out), before)

    def test_retrieval_json_that_fails_at_the_end_keeps_the_printed_results(self):
        """--json passes the check before the work but its write fails at the end (a full disk): the
        tables are on stdout, one line names the failure, exit 1, the old --json byte-identical. And an
        embedding cache that cannot be written is a warning, not a crash (the cache only saves time)."""
        from data import embeddings
        from harness import cli
        import retrieval
        out = {'source': 'src', 'train_pairs': 1, 'val_pairs': 0, 'test_pairs': 1, 'train_n': 2, 'eval_trials': 1,
               'ns': [2], 'notes': [], 'results': []}
        path = write(os.path.join(self.f.tmp, 'retrieval_end', 'res.json'), '{"old": 1}\n')
        err, stdout = io.StringIO(), io.StringIO()
        with mock.patch.object(retrieval, 'run', return_value=out), \
                mock.patch.object(cli, 'write_atomic', side_effect=OSError(errno.ENOSPC, 'No space left')), \
                contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout), \
                self.assertRaises(SystemExit) as stop:
            retrieval.main(['--ckpt', self.f.ckpt, '--json', path, '--overwrite'])
        self.assert_fault(SimpleNamespace(returncode=stop.exception.code, stdout='', stderr=err.getvalue()), 1,
                          ['could not write', path, 'tables above'])
        self.assertIn('| (chance) | 1/N | 0.500 |', stdout.getvalue())
        with open(path) as fh:
            self.assertEqual(fh.read(), '{"old": 1}\n')
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            embeddings.save_cache(os.path.join(self.f.bad, 'cache', 'x.pt'), {'query': torch.zeros(1)})
        self.assertEqual(len(error_lines(err.getvalue())), 1, err.getvalue())
        self.assertIn('going on without it', err.getvalue())


# ----------------------------------------------------------------------------- two ranks (slow)

@unittest.skipUnless(LINUX, 'reads /proc')
class TestWritten(unittest.TestCase):
    """cli.written, the one way the project writes an output (a checkpoint, an export, a result, a figure, prepare's
    four files), and cli.remove_stale_temps, which clears what a killed process left of it."""

    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def test_an_output_is_replaced_whole_or_kept_as_it_was(self):
        """Ctrl-C (a KeyboardInterrupt) in the block, and between the two renames that replace a folder (the
        old one aside, the new one not yet in place), leaves each path byte-identical and no temporary; the
        exception goes through. Without one, files and folders are replaced, several in their order."""
        from harness.cli import written
        a, b, folder = (os.path.join(self.dir, n) for n in ('a.txt', 'b.txt', 'out'))
        for path in (a, b, os.path.join(folder, 'x'), os.path.join(folder, 'y')):
            write(path, f'old {os.path.basename(path)}')
        before = hashes(self.dir)
        with self.assertRaises(KeyboardInterrupt), written(a, b) as (ta, tb):
            write(ta, 'new a')
            write(tb, 'half of')
            raise KeyboardInterrupt
        self.assertEqual(hashes(self.dir), before)
        real = os.replace

        def replace(src, dst, *args, **kw):
            if dst == folder:
                self.assertFalse(os.path.exists(folder))        # between the two renames
                raise KeyboardInterrupt
            return real(src, dst, *args, **kw)
        with self.assertRaises(KeyboardInterrupt), mock.patch('os.replace', replace), written(folder) as tmp:
            write(os.path.join(tmp, 'z'), 'new z')
        self.assertEqual(hashes(self.dir), before)
        self.assertEqual(sorted(os.listdir(self.dir)), ['a.txt', 'b.txt', 'out'])
        with written(folder) as tmp, written(a, b) as (ta, tb):
            for path in (os.path.join(tmp, 'z'), ta, tb):
                write(path, 'new')
        self.assertEqual((sorted(os.listdir(self.dir)), os.listdir(folder)), (['a.txt', 'b.txt', 'out'], ['z']))
        self.assertEqual(set(hashes(a, b).values()), set(hashes(os.path.join(folder, 'z')).values()))

    def test_modes_are_the_umask_s(self):
        """A file the block makes private (as safetensors makes its files) ends with the umask's mode."""
        from harness.cli import written
        mask = os.umask(0o022)
        os.umask(mask)
        path = os.path.join(self.dir, 'weights.bin')
        with written(path) as tmp:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600))
        self.assertEqual(oct(os.stat(path).st_mode & 0o777), oct(0o666 & ~mask))

    def test_stale_temporaries_are_cleared_and_an_old_folder_put_back(self):
        """A dead process's .NAME.tmpPID is removed; its .NAME.oldPID renamed back to NAME when NAME is missing
        (killed between the two renames), else removed; a live process's and this one's are kept; `name`
        limits it to one output. One note a kind, on stderr."""
        from harness.cli import remove_stale_temps
        dead = subprocess.Popen(['true'])
        dead.wait()
        for name in (f'.out.old{dead.pid}/x', f'.out.tmp{dead.pid}/x', f'.kept.old{dead.pid}/x', 'kept/x',
                     f'.a.txt.tmp{dead.pid}', f'.a.txt.tmp{os.getppid()}', f'.a.txt.tmp{os.getpid()}'):
            write(os.path.join(self.dir, name), name)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            remove_stale_temps(self.dir, 'prog.py', 'out')
        self.assertEqual(sorted(os.listdir(self.dir)), sorted(['out', f'.kept.old{dead.pid}', 'kept',
                         f'.a.txt.tmp{dead.pid}', f'.a.txt.tmp{os.getppid()}', f'.a.txt.tmp{os.getpid()}']))
        with open(os.path.join(self.dir, 'out', 'x')) as fh:
            self.assertEqual(fh.read(), f'.out.old{dead.pid}/x')
        with contextlib.redirect_stderr(err):
            remove_stale_temps(self.dir, 'prog.py')
        self.assertEqual(sorted(os.listdir(self.dir)), sorted(['out', 'kept', f'.a.txt.tmp{os.getppid()}',
                                                               f'.a.txt.tmp{os.getpid()}']))
        self.assertEqual(err.getvalue().splitlines(), [
            f'prog.py: note: {self.dir}/out was moved aside by a run that stopped while replacing it (pid {dead.pid}); '
            f'renamed back from .out.old{dead.pid}',
            f'prog.py: note: removed 1 temporary files left in {self.dir} by a run that stopped: .out.tmp{dead.pid}',
            f'prog.py: note: removed 2 temporary files left in {self.dir} by a run that stopped: '
            f'.a.txt.tmp{dead.pid}, .kept.old{dead.pid}'])


class TestDistributed(Base):
    """Slow (about 30 s in all, run in every suite): two gloo ranks under torchrun, each rank's stderr in
    its own file (torchrun --log-dir -r 3: torchrun's own report of a failed worker is torchrun's, not
    train.py's). A stalled rank or a NaN on one rank ends the run with one line, and nothing hangs."""

    def torchrun(self, script, out, *args, **kw):
        """Start torchrun --standalone --nproc_per_node=2 on `script` -> (Popen, its log folder)."""
        logs = os.path.join(self.f.tmp, 'torchrun_logs', os.path.basename(out))
        p = popen(['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', '--log-dir', logs,
                   '--redirects', '3', script, f'--data_dir={self.f.data}', *TINY, f'--out_dir={out}', *args], **kw)
        return p, logs

    def rank_stderr(self, logs, rank):
        """Rank `rank`'s stderr as torchrun saved it."""
        files = glob.glob(os.path.join(logs, '**', 'attempt_0', str(rank), 'stderr.log'), recursive=True)
        self.assertEqual(len(files), 1, files)
        with open(files[0]) as fh:
            return fh.read()

    def workers(self, pid):
        """{rank: pid} of torchrun `pid`'s worker processes."""
        out = {}
        for d in os.listdir('/proc'):
            if d.isdigit():
                try:
                    with open(f'/proc/{d}/stat') as fh:
                        ppid = int(fh.read().rsplit(')', 1)[1].split()[1])
                    if ppid == pid:
                        with open(f'/proc/{d}/environ', 'rb') as fh:
                            env = dict(e.split(b'=', 1) for e in fh.read().split(b'\0') if b'=' in e)
                        out[int(env[b'RANK'])] = int(d)
                except (OSError, KeyError, ValueError):
                    continue
        return out

    def test_a_stalled_rank_ends_the_run_within_the_timeout(self):
        """Rank 1 stopped (SIGSTOP) once it trains: rank 0 ends (within ddp_timeout + 120 s: a loaded machine's
        margin; without the timeout it would wait for ever) with one line naming the timeout and the rank, the
        checkpoint kept; then rank 1 is killed and torchrun ends."""
        out = os.path.join(self.f.tmp, 'ddp_stall')
        p, logs = self.torchrun('train.py', out, '--max_iters=1000000', '--eval_interval=5', '--log_interval=1',
                                '--ddp_timeout=10', stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ranks = {}
        try:
            t0 = time.time()
            while not os.path.exists(os.path.join(out, 'ckpt.pt')) and p.poll() is None and time.time() - t0 < 600:
                time.sleep(0.1)
            ranks = self.workers(p.pid)
            self.assertEqual(sorted(ranks), [0, 1], 'staging: two workers')
            os.kill(ranks[1], signal.SIGSTOP)
            stopped = time.time()
            while alive(ranks[0]) and time.time() - stopped < 10 + 120:
                time.sleep(0.2)
            waited = time.time() - stopped
            os.kill(ranks[1], signal.SIGKILL)
            p.wait(timeout=600)
        finally:
            for pid in ranks.values():                    # torchrun starts each worker in a session of its own
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            kill_session(p)
        self.assertLess(waited, 10 + 120, 'rank 0 did not end within ddp_timeout + 120 s')
        self.assertNotEqual(p.returncode, 0)
        line = self.assert_fault(SimpleNamespace(returncode=1, stdout='', stderr=self.rank_stderr(logs, 0)), 1,
                                 ['ddp_timeout=10', 'rank 0', 'holds step'])
        held = int(re.search(r'holds step (\d+)', line).group(1))
        self.assertEqual(ckpt_step(os.path.join(out, 'ckpt.pt')), held)

    def test_a_nan_on_one_rank_stops_every_rank(self):
        """Rank 1's loss is NaN at step 3 (the wrapper): both ranks stop at step 3, each with one line naming
        rank 1's NaN and the checkpoint of step 2 (a rank that did not save must not say there is none)."""
        out = os.path.join(self.f.tmp, 'ddp_nan')
        p, logs = self.torchrun(self.f.wrapper, out, '--max_iters=10', '--eval_interval=2', '--log_interval=1',
                                '--ddp_timeout=10', env={**ENV, 'NAN_AT': '3', 'NAN_RANK': '1'})
        try:
            _, err = p.communicate(timeout=600)
        finally:
            for pid in self.workers(p.pid).values():     # on a hang: the workers, each in its own session
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            kill_session(p)
        self.assertNotEqual(p.returncode, 0, err[-2000:])
        for rank in (0, 1):
            with self.subTest(rank=rank):
                self.assert_fault(SimpleNamespace(returncode=1, stdout='', stderr=self.rank_stderr(logs, rank)), 1,
                                  ['rank 1: non-finite train loss', 'at step 3', 'holds step 2'])


# ----------------------------------------------------------------------------- icl's noise settings

class TestICLNoise(Base):
    """A noise setting must be a finite sigma."""

    def test_icl_refuses_a_non_finite_noise(self):
        """--noise inf is refused in one line (exit 2), not run with every cell diverged and cached as
        a success (regression.check_noise requires a finite sigma)."""
        out = os.path.join(self.f.tmp, 'icl_inf')
        # in this process (test_faults runs an icl bad argument as a process); were it to run on instead, the
        # timeout stops the test process with every thread's traceback
        r = run_in_process('-m', 'experiments.icl', '--quick', '--noise', 'inf', '--layers', '1', '--params', 'diag',
                           '--iters', '4', '--eval_prompts', '50', '--workers', '1', '--out', out, env=ENV,
                           timeout=600)
        self.assert_fault(r, 2, ['noise', 'inf'])
        self.assertFalse(os.path.exists(out))


if __name__ == '__main__':
    unittest.main()
