"""The experiments' process pool, its processes' life: how one starts (Ctrl-C held while it starts, then
ignored: the main process handles it), what ends one (SIGTERM, or the end of the main process: it ends the
command it runs too), and how the main process ends the pool at once (end_pool). experiments/runner.py's
Runner runs its jobs on it.
"""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print('pool.py: error: the process pool of experiments/runner.py, not a command: python -m '
          'experiments.mqar --help', file=sys.stderr)
    sys.exit(2)

import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from experiments.commands import CHILD


def new_pool(workers, threads):
    """A ProcessPoolExecutor of `workers` spawned processes, each started by _pool_init with `threads` torch
    threads (spawned: a fresh interpreter, no state forked from this one)."""
    return ProcessPoolExecutor(workers, mp_context=get_context('spawn'), initializer=_pool_init,
                               initargs=(threads, os.getpid()))


def end_pool(pool, timeout=10):
    """End a ProcessPoolExecutor now and wholly: its processes terminated (and the commands they run:
    _stop_worker), each waited for (killed after `timeout` seconds), then its manager thread joined
    (shutdown(wait=True): seeing no process left, it fails or cancels the futures and closes its pipes).
    Nothing of the pool is then left for concurrent.futures' exit hook, which wakes every manager thread
    still registered without its lock: one that was closing its wake-up pipe at that moment made Python
    3.11 print 'Exception ignored ... _python_exit ... OSError: [Errno 9] Bad file descriptor' after a
    command's last line."""
    procs = list((getattr(pool, '_processes', None) or {}).values())
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()
    pool.shutdown(wait=True, cancel_futures=True)


def _stop_worker(signum, frame):
    """SIGTERM in a pool process (Runner.stop): end the command it runs, then itself, at once."""
    for child in list(CHILD):
        child.kill()
    os._exit(128 + signum)


def _watch_parent(parent):
    """A pool process's daemon thread: when the main process `parent` (a pid) is gone (kill -9, a
    SIGTERM it had no handler for), end this process and its command, rather than train on unseen."""
    while os.getppid() == parent:
        time.sleep(1)
    _stop_worker(signal.SIGTERM, None)


def _pool_init(threads, parent):
    """A pool process starts: `threads` torch threads; Ctrl-C is the main process's to handle
    (no traceback from every worker: ignored here, and held until here, as Runner.submit started it
    with SIGINT blocked: cli.deferred_interrupt); SIGTERM ends it and its command (_stop_worker), and so does
    the end of the main process `parent` (its pid, given by the main process: a main process killed
    while this one still imported would make os.getppid() here the pid that adopted it, and the
    watcher would wait for that one; _watch_parent)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # a Ctrl-C held since its start (deferred_interrupt) is dropped
    if hasattr(signal, 'pthread_sigmask'):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGTERM, _stop_worker)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    import torch
    torch.set_num_threads(threads)
