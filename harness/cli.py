"""What every command of the project shares, a leaf that imports nothing of the project: the one-line
error and its exit status (`fail`), its first instruction (`begin`: Ctrl-C and stdout's faults), the one
Ctrl-C handler of its work (`run_command`), outputs written whole (`written`, the one way a file or folder
is written; `write_atomic`, `save_results`), what a killed process left of them (`remove_stale_temps`) and
the lock of a run's folder (`hold_lock`). The commands' flags are harness/flags.py's.

    fail('no such file', 'sample.py')          # 'sample.py: error: no such file' on stderr, exit 2
    begin('sample.py', __name__)          # the first instruction, before torch: Ctrl-C one line from here
    sys.exit(run_command('sample.py', sample, argv))   # Ctrl-C: one line, exit 130
    with written(path) as tmp: torch.save(state, tmp)      # path replaced whole, or left as it was
"""

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import threading


def fail(msg, prog='train.py', code=2):
    """Print a one-line error 'PROG: error: msg' and exit with status `code`: 2, every command's bad
    input (train.py's settings here; the experiments and tools pass their own name); 1, a run that
    could not finish (a failed job, a full disk)."""
    own_line(f'{prog}: error: {msg}')
    sys.exit(code)


def own_line(text):
    """Write `text` to stderr as a line of its own, in one write (a Ctrl-C cannot cut it from its newline):
    after a partial line on stdout or stderr (a progress line without its newline, or one a Ctrl-C cut before
    its newline: begin()'s streams know), that line is ended first, on its own stream."""
    if getattr(sys.stdout, 'open', False):
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.stream.write('\n')
            sys.stdout.stream.flush()
        sys.stdout.open = False
    sys.stderr.write(('\n' if getattr(sys.stderr, 'open', False) else '') + text + '\n')
    sys.stderr.flush()


def one_line(e):
    """An exception as one short line: 'TypeName: the first line of its message' (at most 120 characters)."""
    return f'{type(e).__name__}: {(str(e).strip().splitlines() or [""])[0][:120]}'


def failing(prog):
    """fail() for the command `prog` (e.g. 'mqar.py') -> fail(msg) printing 'prog: error: msg', exit 2."""
    return lambda msg: fail(msg, prog)


# ----------------------------------------------------------------------------- Ctrl-C and a closed stdout

def begin(prog, name='__main__', keep=False):
    """A command's first instruction, before torch and the project are imported (a no-op unless `name`, the
    caller's __name__, is '__main__'). Ctrl-C outside run_command's work is one line 'PROG: interrupted
    (Ctrl-C)' and exit 130 at once (os._exit: nothing is written yet; an import that catches every exception
    cannot swallow it). A reader of stdout that goes away (`| head`) points it at os.devnull: the work goes on
    if `keep` (its result is a file), else exit 1, quietly; any other failed write (`>/dev/full`) is one
    line 'PROG: error: cannot write to stdout (why)', exit 1. Both streams note a line left partial (own_line
    ends it before its own)."""
    if name == '__main__' and threading.current_thread() is threading.main_thread():
        _STARTED[:] = [prog]
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _interrupted)
        sys.stdout, sys.stderr = _Stream(sys.stdout, prog, keep), _Stream(sys.stderr)


_STARTED = []           # the command begin() started in this process


def _interrupted(signum, frame):
    """SIGINT handler from begin() until run_command's work and after it: one line, exit 130."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    own_line(f'{_STARTED[0]}: interrupted (Ctrl-C)')
    os._exit(130)


class _Stream:
    """sys.stdout or sys.stderr of a command begin() started: the stream's own; `open` says whether the last
    text written ended inside a line (set before the write: a Ctrl-C during it leaves it True, at worst one
    blank line). stdout's (`prog` given) failed write or flush is begin()'s: a reader gone (`| head`) points
    it at os.devnull and, unless `keep`, exits 1 quietly; any other failure is one line, exit 1."""

    def __init__(self, stream, prog=None, keep=False):
        self.stream, self.prog, self.keep, self.open = stream, prog, keep, False

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def write(self, text):
        if text:
            self.open = not text.endswith('\n')
        return self._do(self.stream.write, text)

    def flush(self):
        return self._do(self.stream.flush)

    def _do(self, fn, *args):
        try:
            return fn(*args)
        except OSError as e:
            if self.prog is None:                          # stderr: the failure is the caller's
                raise
            null = os.open(os.devnull, os.O_WRONLY)        # what is left goes nowhere, at exit too
            os.dup2(null, self.stream.fileno())
            os.close(null)
            if not isinstance(e, BrokenPipeError):
                print(f'{self.prog}: error: cannot write to stdout ({e.strerror or e})', file=sys.stderr,
                      flush=True)
            elif self.keep:
                return None
            (os._exit if sys.is_finalizing() else sys.exit)(1)     # at Python's last flush, no traceback


def _interrupt_once(signum, frame):
    """SIGINT handler while a command runs: the first Ctrl-C raises KeyboardInterrupt, any later one
    is ignored while the command stops (`timeout -s INT` signals the process, then its group)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def run_command(prog, work, *args, kept=None, exits=False):
    """The one way a command runs its work: work(*args) -> its exit status (its return value, None read as 0;
    a SystemExit, e.g. fail()'s 2, goes through), stdout flushed (a gone reader or a full disk is seen here:
    begin()). Ctrl-C in the work, after its `finally` blocks (no half-written file): one line 'PROG:
    interrupted (Ctrl-C)' on stderr, '; ' + `kept` after it when given ('what finished is cached'), status
    130; a second Ctrl-C while it stops is ignored. SIGINT's handler is the caller's again after, unless
    `exits` (the caller exits at once, as a pool's finalizers run, and every command begin() started) and
    Ctrl-C stopped the work: SIGINT then stays ignored (a second Ctrl-C in those finalizers: no traceback)."""
    handler = signal.getsignal(signal.SIGINT)
    own = handler in (signal.default_int_handler, _interrupted)
    own = own and threading.current_thread() is threading.main_thread()
    exits = exits or handler is _interrupted
    if own:                                 # an ignored SIGINT (a background job) stays ignored
        signal.signal(signal.SIGINT, _interrupt_once)
    try:
        code = work(*args)
        sys.stdout.flush()
        return 0 if code is None else code
    except KeyboardInterrupt:
        own_line(f'{prog}: interrupted (Ctrl-C)' + (f'; {kept}' if kept else ''))
        return 130
    finally:
        if own and not (exits and signal.getsignal(signal.SIGINT) == signal.SIG_IGN):    # SIG_IGN: stopping
            signal.signal(signal.SIGINT, handler)


# ----------------------------------------------------------------------------- the commands' flags

@contextlib.contextmanager
def deferred_interrupt():
    """Ctrl-C held while the block runs, then given to SIGINT's handler as it was (the command's:
    KeyboardInterrupt, after the block; ignored, as in a pool process: nothing): train.py's checkpoint and the
    step it holds are recorded together, and the experiments' pool starts a process whole. SIGINT is blocked
    in this thread meanwhile, and a process started inside inherits that (its handler reset by exec, its
    mask kept): a Ctrl-C to the group during its start-up waits in it until it chooses (a pool process
    ignores it). Outside the main thread, where no signal handler can be set, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got = []
    old = signal.signal(signal.SIGINT, lambda *a: got.append(1))     # delivered to another thread: run here
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if hasattr(signal, 'pthread_sigmask') \
        else None
    try:
        yield
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)          # one held meanwhile comes now: got
        signal.signal(signal.SIGINT, old)
        if got:
            signal.raise_signal(signal.SIGINT)


# ----------------------------------------------------------------------------- results written whole


# written()'s names beside NAME: .NAME.tmpPID, .NAME.oldPID
TEMP_NAME = re.compile(r"^\.(.+)\.(?:tmp|old)(\d+)$")


def temp_path(path, kind="tmp"):
    """The name beside `path` (FOLDER/NAME) that written() gives this process's temporary: FOLDER/.NAME.tmpPID
    (kind 'old': an old folder moved aside, .NAME.oldPID)."""
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}.{kind}{os.getpid()}")


@contextlib.contextmanager
def written(*paths):
    """Write files or folders whole or not at all, the one way the project writes an output:

        with written(path) as tmp:          # tmp: FOLDER/.NAME.tmpPID beside path (temp_path)
            torch.save(state, tmp)          # the block makes a file, or a folder, at tmp
        # here path is the new file or folder

    Yields the temporary path of each of `paths` (one path: a str; several: a list, replaced in their order
    at the end, as data/prepare.py commits its four files); their folders are made. When the block ends
    without an exception, each replaces its path: a file by os.replace; a folder that replaces a folder
    by two renames, the old one aside (.NAME.oldPID) until the new one is in place, then removed. The files
    made get the modes the umask gives (open()'s: a library that makes its files private, as safetensors
    does, makes them so no more). On any exception (KeyboardInterrupt included), in the block or while
    replacing, every temporary is removed, every path not yet replaced is as it was (an old folder moved
    aside is renamed back) and the exception goes through. A process killed between a folder's two renames
    leaves its old folder aside, and remove_stale_temps renames it back."""
    tmps, aside = [temp_path(p) for p in paths], []
    try:
        for p in paths:
            os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
        yield tmps[0] if len(paths) == 1 else tmps
        for tmp, path in zip(tmps, paths):
            _umask_modes(tmp)
            if os.path.isdir(tmp) and os.path.isdir(path) and not os.path.islink(path):
                aside.append((temp_path(path, "old"), path))
                os.rename(path, aside[-1][0])
            os.replace(tmp, path)
    except BaseException:
        for old, path in aside:
            if not os.path.lexists(path):       # between the two renames: the old folder goes back
                os.rename(old, path)
        raise
    finally:
        for p in tmps + [old for old, path in aside if os.path.lexists(path)]:
            _remove(p)


def _umask_modes(path):
    """Give the file or folder `path` and everything under it the mode the umask gives a new one."""
    umask = os.umask(0o022)                     # read by setting it, for a moment
    os.umask(umask)
    if not os.path.isdir(path):
        return os.chmod(path, 0o666 & ~umask)
    for folder, _, files in os.walk(path):
        os.chmod(folder, 0o777 & ~umask)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o666 & ~umask)


def _remove(path):
    """Remove the file or folder `path` if it is there."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def hold_lock(fd):
    """Take an exclusive lock on the open file or folder descriptor fd for this process's life (filelock's
    lock_descriptor: flock on POSIX, LockFileEx on Windows): the OS releases it when the process dies, however
    it dies, so a killed run never blocks the next -> True, or False when another process holds it. Raises
    OSError when the file system cannot lock. It locks train.py's run folder and data/prepare.py's --out."""
    from filelock import lock_descriptor
    return lock_descriptor(fd, blocking=False)


def pid_alive(pid):
    """True if a process `pid` runs on this machine (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:            # alive, but another user's
        pass
    return True


def remove_stale_temps(folder, prog, name=None):
    """Clear what written() left in `folder` in a process that was killed (only its pid no longer alive;
    never this process's or a live one's; of the output `name` only, when given): a temporary file or
    folder (.NAME.tmpPID) is removed, and an old folder moved aside (.NAME.oldPID) renamed back to NAME
    when NAME is missing (the process died between its two renames), else removed. A note on stderr
    ('PROG: note: ...') says what was done. What cannot be removed is left as it is."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:                             # no folder yet: nothing left in it
        return
    removed = []
    for f in names:
        m = TEMP_NAME.match(f)
        if not m or name is not None and m.group(1) != name or int(m.group(2)) == os.getpid() \
                or pid_alive(int(m.group(2))):
            continue
        path, target = os.path.join(folder, f), os.path.join(folder, m.group(1))
        try:
            if f.endswith(f".old{m.group(2)}") and not os.path.lexists(target):
                os.rename(path, target)
                print(f"{prog}: note: {target} was moved aside by a run that stopped while replacing it "
                      f"(pid {m.group(2)}); renamed back from {f}", file=sys.stderr)
            else:
                _remove(path)
                removed.append(f)
        except OSError:
            continue
    if removed:
        print(f"{prog}: note: removed {len(removed)} temporary files left in {folder} by a run that stopped: "
              f"{', '.join(removed)}", file=sys.stderr)


def write_atomic(path, text):
    """Write `text` (str, as UTF-8, or bytes) to `path` whole or not at all (written): a failed write
    leaves `path` as it was, no temporary file, and raises OSError."""
    with written(path) as tmp, open(tmp, "wb") as f:
        f.write(text if isinstance(text, bytes) else text.encode("utf-8"))


def save_results(path, results, prog, indent=2):
    """Write `results` as JSON to `path` (write_atomic), after the tables were printed; a failed
    write: one line naming the cause, that the printed tables are the results, and exit 1."""
    try:
        write_atomic(path, json.dumps(results, indent=indent))
    except OSError as e:
        fail(f'could not write {path} ({e.strerror or e}); the results are the tables above', prog, 1)


if __name__ == '__main__':
    fail("the commands' shared helpers, not a command: python train.py --help, python sample.py --help",
         'harness/cli.py')
