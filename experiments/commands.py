"""Running a project command line (`python script.py ...` or `python -m module ...`) from a pool process of
experiments/runner.py, its console to a file: the commands claims.py measures with (retrieval, representation,
memory, a sample).
"""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print('commands.py: error: the command runner of experiments/runner.py, not a command: python -m '
          'experiments.claims --help', file=sys.stderr)
    sys.exit(2)

import contextlib
import importlib
import os
import signal
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository root

CHILD = []          # the command a pool process runs now (run_command), for pool._stop_worker


# Commands run by their main(argv) in the pool process, which has Python and torch started already (a new
# process costs about 5 s of CPU before its first line: torch, then torch._dynamo on the first optimiser).
# The others start a process of their own: bench.py's memory table reads its own process's peaks.
IN_PROCESS = ('retrieval', 'sample', 'experiments.represent')


def run_command(args, out_path):
    """Run a project script (python args...: 'script.py ...' or '-m module ...') from the repository
    root, its stdout and stderr to out_path (written whole when it ends: cli.written) -> exit status. An
    IN_PROCESS module runs in this process (run_main); any other in a process of its own."""
    from harness.cli import written
    module, argv = (args[1], args[2:]) if args[0] == '-m' else (args[0][:-3].replace('/', '.'), args[1:])
    with written(out_path) as tmp, open(tmp, 'w') as f:
        if module in IN_PROCESS:
            rc = run_main(module, argv, f)
        else:
            child = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                     preexec_fn=_default_sigint)
            CHILD.append(child)
            try:
                rc = child.wait()
            finally:
                CHILD.remove(child)
    return rc


def run_main(module, argv, f):
    """module.main(argv) in this process as `python -m module argv` would run it: from the repository
    root, stdout and stderr to the open file f, the exit status its SystemExit gives (an exception: its
    one line, 1); torch's thread count (a --threads flag sets it) as it was before -> exit status."""
    import torch
    threads, cwd, argv0 = torch.get_num_threads(), os.getcwd(), sys.argv
    os.chdir(ROOT)
    sys.argv = [module.replace('.', '/') + '.py', *argv]               # argparse's program name
    try:
        with contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            try:
                importlib.import_module(module).main(argv)
                rc = 0
            except SystemExit as e:                   # sys.exit(n), sys.exit() or sys.exit('message')
                if isinstance(e.code, str):
                    print(e.code)
                rc = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
            except Exception as e:
                print(f'{type(e).__name__}: {e}', flush=True)
                rc = 1
    finally:
        sys.argv = argv0
        os.chdir(cwd)
        torch.set_num_threads(threads)
    return rc


def _default_sigint():
    """In a command's process before it starts: Ctrl-C back to its default (pool processes ignore it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
