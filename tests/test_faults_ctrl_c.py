"""Ctrl-C at any moment of a command that runs a pool or a thread: one line, exit 130, no traceback, not even
from Python's exit (a pool's thread, an atexit hook), and no process left (issue #81):
python test_mixer.py test_faults_ctrl_c

    TestPool      the experiments' pool (experiments/runner.py, under claims, icl and mqar): a Ctrl-C held
                  while a pool process starts, not lost; SIGINT at 13
                  moments of tests/pool_command.py's calibration, runs and report, and during claims' own
                  calibration, each under tests.faults.EXIT_RACE (a pool left stopping at exit trips
                  concurrent.futures' exit hook every time, not by luck)
    TestCommands  the other commands' pools, threads and processes, each signalled while it runs: prepare.py
                  --dataset's process pool, prepare.py's encoding threads, eval_tasks' probe of the Hugging Face
                  Hub (a thread), bench.py's spinning processes (--tables loaded)
"""

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest
from concurrent.futures import ThreadPoolExecutor

from tests.common import prepared_data, tiny_checkpoint
from tests.faults import ENV, LINUX, PROGRESS, alive, assert_interrupted, exit_race, interrupt, interrupt_pool, write
from tests.test_corpus import make_docs, write_jsonl

# (the stderr line a signal waits for, seconds after it) of tests/pool_command.py: its workers starting, busy,
# a job ending, the next phase submitting, the pool closing, the report after it
POOL_MOMENTS = [('calibration: 4 runs', s) for s in (0.0, 0.02, 0.1, 0.25, 0.5)] + \
               [('[1/4] calibration', s) for s in (0.0, 0.1)] + \
               [('runs: 6 runs', s) for s in (0.0, 0.15, 0.4)] + \
               [('[6/6] runs', 0.0), ('[5/6] runs', 0.1), ('report: writing', 0.0)]
POOL_LINES = PROGRESS + (r'^\w+: (starting|writing)$', r'^done$')      # tests/pool_command.py's own


@unittest.skipUnless(LINUX, 'reads /proc')
class TestPool(unittest.TestCase):
    """Runner.stop and Runner.close leave nothing running for concurrent.futures' exit hook, and Runner.submit
    loses no Ctrl-C."""

    def test_a_ctrl_c_while_a_pool_process_starts_is_held_not_lost(self):
        """cli.deferred_interrupt (Runner.submit's, train.py's save): a SIGINT inside the block raises
        KeyboardInterrupt when it ends, not before, and a process started inside starts with SIGINT blocked (its
        start-up is no traceback; its pool initializer then ignores it); with SIGINT ignored (a pool process
        saving a checkpoint) it is ignored after the block too."""
        from harness.cli import deferred_interrupt
        self.addCleanup(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler))
        steps = []
        with self.assertRaises(KeyboardInterrupt):
            with deferred_interrupt():
                os.kill(os.getpid(), signal.SIGINT)
                status = subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout
                steps.append('after the signal')
        self.assertEqual(steps, ['after the signal'])
        blocked = int(next(l for l in status.splitlines() if l.startswith('SigBlk:')).split()[1], 16)
        self.assertTrue(blocked >> (signal.SIGINT - 1) & 1, status)
        self.assertFalse(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []), 'SIGINT left blocked')
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with deferred_interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            steps.append('ignored')
        self.assertEqual((steps[-1], signal.getsignal(signal.SIGINT)), ('ignored', signal.SIG_IGN))

    def test_ctrl_c_at_every_moment_of_the_pool(self):
        """SIGINT (once, or twice 50 ms apart as `timeout -s INT` sends it) at each of POOL_MOMENTS of
        tests/pool_command.py, three commands at a time: exit 130, one line, no traceback, no process left.
        Its pool processes import a stand-in torch (the pool's Ctrl-C is under test, not torch: a real import
        costs 1.6 s of CPU a process)."""
        tmp = tempfile.mkdtemp(prefix='mixer_ctrl_c_')
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        stub = os.path.dirname(os.path.dirname(write(os.path.join(tmp, 'stub', 'torch', '__init__.py'),
                                                     'def set_num_threads(n):\n    pass\n')))
        env = {**ENV, 'PYTHONPATH': stub}

        def one(i):
            ready, settle = POOL_MOMENTS[i]
            return interrupt(exit_race('tests.pool_command', os.path.join(tmp, f'out{i}')), ready, settle,
                             sigints=1 + i % 2, env=env)
        with ThreadPoolExecutor(3) as ex:
            got = list(ex.map(one, range(len(POOL_MOMENTS))))
        for (ready, settle), g in zip(POOL_MOMENTS, got):
            with self.subTest(ready=ready, settle=settle):
                assert_interrupted(self, g, ready, POOL_LINES)

    def test_ctrl_c_during_the_claims_pool(self):
        """SIGINT to the group while claims --quick calibrates on its pool (under EXIT_RACE): exit 130 and one
        line after the interrupt (the progress lines before it are claims' own), no traceback from any worker
        or at exit, the runs stopped (not left to finish: a full run's would take minutes) and no process left."""
        out = tempfile.mkdtemp(prefix='mixer_ctrl_c_')
        self.addCleanup(shutil.rmtree, out, ignore_errors=True)
        interrupt_pool(self, exit_race('experiments.claims', '--quick', '--models', 'flat', '--data_dir',
                                       prepared_data(), '--out', out), 'runs, about', settle=0.2)   # workers starting
        finished = [d for d, _, files in os.walk(os.path.join(out, 'calibration')) if 'result.json' in files]
        self.assertEqual(finished, [], 'the pool was left to finish its runs after Ctrl-C, not stopped')



def written_file(pattern):
    """interrupt()'s `ready`: a non-empty file matching the glob `pattern` exists."""
    def ready(p, lines):
        return any(os.path.exists(f) and os.path.getsize(f) > 0 for f in glob.glob(pattern))
    return ready


def spinners(pid):
    """Pids of the processes whose parent is `pid`, that run bench_decode.SPIN and have spun 0.1 s of CPU (past
    their start-up: in their loop) (Linux /proc)."""
    found, tick = [], os.sysconf('SC_CLK_TCK')
    for d in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{d}/stat') as f:
                fields = f.read().rsplit(')', 1)[1].split()
            with open(f'/proc/{d}/cmdline', 'rb') as f:
                spin = b'getppid' in f.read()
        except (OSError, IndexError, ValueError):
            continue
        if int(fields[1]) == pid and spin and int(fields[11]) + int(fields[12]) >= 0.1 * tick:
            found.append(int(d))
    return found


@unittest.skipUnless(LINUX, 'reads /proc')
class TestCommands(unittest.TestCase):
    """Ctrl-C while a command's pool, threads or helper processes run: one line, exit 130, nothing left."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix='mixer_ctrl_c_')
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def test_prepare_dataset_on_its_process_pool(self):
        """prepare.py --dataset --num_proc 2 (a forked pool from before the BPE): SIGINT as the BPE starts, and
        once the pool has written a shard: each one line, exit 130, no worker left."""
        corpus = write_jsonl(os.path.join(self.tmp, 'docs.jsonl'), make_docs(30000, seed=1))
        moments = [('the BPE', lambda p, lines: any('training the BPE' in l for l in lines)),
                   ('shard 1', written_file(os.path.join(self.tmp, 'out1', 'shards-*', 'all-0000001.npz')))]
        for i, (when, ready) in enumerate(moments):
            with self.subTest(when=when):
                got = interrupt(['data/prepare.py', '--dataset', corpus, '--out', os.path.join(self.tmp, f'out{i}'),
                                 '--vocab_size', '300', '--num_proc', '2'], ready, merged=True)
                assert_interrupted(self, got, when, allow=(r'^training the BPE', r'^bpe: '))

    def test_prepare_text_on_its_threads(self):
        """prepare.py --train/--valid encodes on a pool of threads: SIGINT once train.bin's temporary file has
        tokens: one line, exit 130."""
        text = '<|endoftext|>'.join(d or 'x' for d in make_docs(30000, seed=2))
        train, valid = write(os.path.join(self.tmp, 'train.txt'), text), write(os.path.join(self.tmp, 'valid.txt'),
                                                                                text[:50000])
        out = os.path.join(self.tmp, 'out')
        got = interrupt(['data/prepare.py', '--train', train, '--valid', valid, '--out', out, '--vocab_size', '300'],
                        written_file(os.path.join(out, '.train.bin.tmp*')), merged=True)
        assert_interrupted(self, got, 'train.bin written', allow=(r'^training the BPE', r'^bpe: '))

    def test_eval_tasks_while_it_probes_the_hub(self):
        """eval_tasks.py probes the Hugging Face Hub on a thread before a task of its own (--include_path): SIGINT
        while the probe waits on a hub that accepts and never answers (a socket here, HF_ENDPOINT): one line,
        exit 130."""
        server = socket.create_server(('127.0.0.1', 0))
        self.addCleanup(server.close)
        probed, held = threading.Event(), []

        def accept():
            with contextlib.suppress(OSError):
                while True:
                    held.append(server.accept()[0])
                    probed.set()
        threading.Thread(target=accept, daemon=True).start()
        folder = os.path.join(self.tmp, 'mine')
        write(os.path.join(folder, 'docs.jsonl'), json.dumps({'q': 'Once', 'a': 'upon'}) + '\n')
        write(os.path.join(folder, 'mine.yaml'),
              f'task: my_words\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder}/docs.jsonl\n'
              'output_type: generate_until\ntest_split: test\ndoc_to_text: "q"\ndoc_to_target: "a"\n'
              'metric_list:\n  - metric: exact_match\n')
        env = {k: v for k, v in ENV.items() if k not in ('HF_HUB_OFFLINE', 'HF_DATASETS_OFFLINE')}
        env['HF_ENDPOINT'] = f'http://127.0.0.1:{server.getsockname()[1]}'
        got = interrupt(['-m', 'experiments.eval_tasks', '--ckpt', tiny_checkpoint(), '--tasks', 'my_words',
                         '--include_path', folder, '--output', os.path.join(self.tmp, 'out.json')],
                        lambda p, lines: probed.is_set(), env=env, merged=True)
        for c in held:
            c.close()
        assert_interrupted(self, got, 'the hub probed')
        self.assertFalse(os.path.exists(os.path.join(self.tmp, 'out.json')))

    def test_bench_loaded_beside_its_spinning_processes(self):
        """bench.py --tables loaded runs processes that only spin: SIGINT once both spin (past their start-up): one
        line from bench.py (none from them), exit 130, and both are gone."""
        seen = []

        def spinning(p, lines):
            seen[:] = spinners(p.pid)
            return len(seen) == 2
        got = interrupt(['-m', 'experiments.bench', '--quick', '--tables', 'loaded', '--busy', '2', '--tries', '20'],
                        spinning, merged=True)
        assert_interrupted(self, got, 'two spinners', allow=(r'^(#|\||_|machine: )',))
        t0 = time.time()
        while any(map(alive, seen)) and time.time() - t0 < 60:
            time.sleep(0.1)
        self.assertEqual([pid for pid in seen if alive(pid)], [], 'a spinning process outlived bench.py')


if __name__ == '__main__':
    unittest.main()
