"""The trackers train.py logs to besides log.jsonl: `--log_to=tensorboard,trackio,wandb` (any of them, commas
between), `--project` (default: the data folder's name, as nanoGPT's wandb_project 'owt') and `--run_name`
(default: out_dir's last folder, which each config names after itself). Each library is imported only when named.

    trackers = open_trackers(cfg, resumed_step, params, world)    # rank 0, before record.prepare_run_folder
    trackers.log(rec)                                             # every record train.py appends to log.jsonl
    trackers.close()                                              # in train.py's finally

What each tracker gets from the records (units as in log.jsonl: losses in nats/token):
  the settings and the parameter count, once a session: the 'config' record's settings, params, model_config,
      world_size, device, dtype, flops_per_token, peak_flops, threads, meta (the data's meta.json);
  'train'   train/loss, train/lr, speed/ms_per_step, speed/tokens_per_s, speed/mfu (every log_interval);
  'eval'    val/loss, val/bpb (bits per byte), val/acc, and train_windows/... with eval_train (every eval);
  'summary' summary/final_val_loss, summary/tokens_per_s, ... (the run's last record);
against the optimiser step and against tokens seen (the record's 'tokens', the tokens trained on so far across
every resume, a changed batch_size included; a log written before train.py kept the count: step x the tokens a
step of its session): TensorBoard has a second event folder whose step axis is tokens; Trackio and W&B get
tokens_seen in every record, to choose as their x-axis.

Where they go: tensorboard: OUT_DIR/tensorboard/step and OUT_DIR/tensorboard/tokens (`tensorboard --logdir out`
shows every run); trackio: its local store ($TRACKIO_DIR, by default ~/.cache/huggingface/trackio; `trackio show
--project PROJECT`); wandb: OUT_DIR/wandb (`WANDB_MODE=offline` needs no account). OUT_DIR/trackers.json holds
the trackio and wandb run ids.

After any stop and resume (--init_from=resume; a kill -9 included) each tracker's curve equals log.jsonl: the
log a resume continues is the one record.prepare_run_folder keeps (the records after the checkpoint's step
dropped: the stopped session wrote them after its last save, and the resumed one computes those steps again),
and each tracker is brought to hold exactly it before training goes on, then gets every new record:
  tensorboard  its event files are written again from that log (the old ones removed: they may hold the
               dropped steps, or miss records, a tracker added on resume or dropped mid-run);
  trackio      the run of trackers.json's id is continued: its rows from the first step where they differ from
               that log (the dropped steps, or a step it lacks) are deleted from its local store and the log's
               records from that step on sent again; a new run (a tracker added on resume, or the run gone or
               no longer the latest of its name) gets the whole log;
  wandb        which cannot take a step back: the run continues only if it holds exactly that log (it was live
               through the whole stopped session, which logged nothing after its checkpoint); else a new
               run of the same name gets the whole log, with a note line.
The replayed records carry their own values and tokens; only their wall times are the resume's.

A named library that is not installed, a tracker that cannot start, or a log a resume cannot read (a damaged
line, a line that is JSON but not a record) is one line and exit 2 before training (check_log_to,
open_trackers). A tracker that fails later (its folder gone, its disk full, its writer thread dead) costs one
warning line on stderr and is dropped (trackers.json says so): never the run, its log or its checkpoint.
"""

import sys

if __name__ == '__main__':       # not a command: said before any import
    print("trackers.py: error: train.py's trackers, not a command: python train.py --log_to=tensorboard,trackio",
          file=sys.stderr)
    sys.exit(2)

import contextlib
import glob
import importlib
import io
import json
import os
import threading
import warnings
from types import SimpleNamespace

from harness.cli import fail, write_atomic

PACKAGES = {'tensorboard': 'tensorboard', 'trackio': 'trackio', 'wandb': 'wandb'}   # --log_to name -> pip's
STATE = 'trackers.json'         # in out_dir: the trackio and wandb runs a resume continues


def tracker_names(log_to):
    """--log_to's text ('tensorboard,trackio'; '' none) -> the names, in order. Raises ValueError (one line)
    on a name not in PACKAGES or given twice."""
    names = [n.strip() for n in str(log_to).split(',') if n.strip()]
    for i, n in enumerate(names):
        if n not in PACKAGES:
            raise ValueError(f'--log_to: unknown tracker {n!r}; choose from {", ".join(PACKAGES)} (commas between)')
        if n in names[:i]:
            raise ValueError(f'--log_to names {n} twice; give each once')
    return names


def check_log_to(cfg):
    """train.py's check of log_to, run_name and project (harness/configurator.check_settings, every rank): an
    unknown name, a library that does not import, or a run_name / project that is not a non-empty string or
    None: one line 'train.py: error: ...', exit 2. The libraries are imported here, before the model is
    built."""
    try:
        names = tracker_names(cfg['log_to'])
    except ValueError as e:
        fail(str(e))
    for key in ('run_name', 'project'):
        if cfg[key] is not None and not (isinstance(cfg[key], str) and cfg[key].strip()):
            fail(f'{key} must be a name (or None: the default), got {cfg[key]!r}')
    for name in names:
        try:
            importlib.import_module(name)
            if name == 'tensorboard':
                importlib.import_module('torch.utils.tensorboard')
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            fail(f'--log_to={name} needs the package {PACKAGES[name]}: pip install {PACKAGES[name]}')
        except ImportError as e:
            fail(f'--log_to={name}: the package {PACKAGES[name]} does not import ({type(e).__name__}: {e})')


def run_names(cfg):
    """-> (project, run name) of the settings: run_name and project, or their defaults, the last folder of
    data_dir and of out_dir."""
    last = lambda path: os.path.basename(os.path.normpath(os.path.abspath(path)))     # noqa: E731
    return cfg['project'] or last(cfg['data_dir']), cfg['run_name'] or last(cfg['out_dir'])


def session_tps(rec, tps):
    """The tokens a step of the session a 'config' record `rec` starts (its settings and world_size), or
    `tps` where the record lacks them (a log written before train.py counted tokens: step x it)."""
    from harness.checkpoint import tokens_per_step    # here: check_log_to runs before torch is imported
    try:
        count = tokens_per_step(rec['config'], rec['world_size'])
    except (KeyError, TypeError):
        return tps
    return count if is_int(count) else tps


def is_int(x):
    """True for an int that is not a bool (a JSON number without a fraction)."""
    return isinstance(x, int) and not isinstance(x, bool)


def metrics_of(rec):
    """A log.jsonl record -> {tag: number} a tracker plots: 'train' -> train/loss, train/lr, speed/...;
    'eval' -> SPLIT/NAME of each SPLIT_NAME value (val/loss, val/bpb, val/acc); 'summary' -> summary/NAME of
    each number; {} for the others (config, schedule, threads); values that are not numbers are left out."""
    kind = rec.get('event')
    if kind == 'train':
        out = {'train/loss': rec.get('loss'), 'train/lr': rec.get('lr'),
               **{f'speed/{k}': rec.get(k) for k in ('ms_per_step', 'tokens_per_s', 'mfu')}}
    elif kind == 'eval':
        out = {'/'.join(k.rsplit('_', 1)): v for k, v in rec.items() if k not in ('event', 'step', 'tokens')}
    elif kind == 'summary':
        out = {f'summary/{k}': v for k, v in rec.items() if k not in ('event', 'step')}
    else:
        return {}
    return {k: v for k, v in out.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def tokens_of(rec, tps):
    """Tokens seen at a record: its 'tokens' (train, eval) or 'tokens_seen' (summary), else (a log written
    before train.py kept the count) its step x tps, the tokens a step of its session."""
    tokens = rec.get('tokens', rec.get('tokens_seen'))
    return tokens if is_int(tokens) else rec['step'] * tps


def points(records, tps):
    """The points log records plot, in order -> list of (step, {tag: number, 'tokens_seen': tokens}), one a
    record with metrics and an integer step; tps: the tokens a step before the first 'config' record."""
    out = []
    for rec in records:
        if rec.get('event') == 'config':
            tps = session_tps(rec, tps)
        elif metrics_of(rec) and is_int(rec.get('step')):
            out.append((rec['step'], {**metrics_of(rec), 'tokens_seen': tokens_of(rec, tps)}))
    return out


def read_run_log(out_dir):
    """out_dir/log.jsonl's records (loading.read_log; its torn last line is dropped without a second
    warning: prepare_run_folder gives one). A damaged line, or one that is JSON but not a record: one line
    naming the file and line, exit 2."""
    from harness.checkpoint import CheckpointError
    from harness.loading import read_log      # here: the check above needs no torch
    path = os.path.join(out_dir, 'log.jsonl')
    try:
        return read_log(path, warn=False)
    except CheckpointError as e:
        fail(str(e))
    except OSError as e:
        fail(f'cannot read {path} ({e.strerror or e})')


@contextlib.contextmanager
def quiet():
    """The trackers' own console lines (trackio's banner, wandb's) kept off train.py's stdout."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


# ----------------------------------------------------------------------------- the trackers
# Each: Kind(cfg, resumed_step, state, past) starts it (state: trackers.json's dict, where it puts its ids;
# past: SimpleNamespace(history: the log records the resume keeps, points: their points(), tail: whether the
# stopped session logged after its checkpoint, session: this session's number, the 'config' records the log
# holds before it)), raising what its library raises, and sets replay_from: None, it holds the history; else
# the step from which it is sent the history again (with the settings). settings(config, step) the run's
# settings, once a session; record(metrics {tag: number}, step, tokens seen); close().

class TensorBoard:
    """torch.utils.tensorboard.SummaryWriter twice: OUT_DIR/tensorboard/step (x: the optimiser step) and
    OUT_DIR/tensorboard/tokens (x: tokens seen); flushed after every record (the dashboard follows the run,
    and a failed write is seen at once). The event files an earlier session left are removed: a resumed run
    writes the log it continues again (its wall times the resume's)."""
    name = 'tensorboard'

    def __init__(self, cfg, resumed_step, state, past):
        from torch.utils.tensorboard import SummaryWriter
        self.dirs = [os.path.join(cfg['out_dir'], 'tensorboard', axis) for axis in ('step', 'tokens')]
        for d in self.dirs:
            for f in glob.glob(os.path.join(d, 'events.out.tfevents.*')):
                os.remove(f)
        self.writers = [SummaryWriter(d) for d in self.dirs]
        self.replay_from = 0 if past.history else None
        print(f'tensorboard: {os.path.dirname(self.dirs[0])} '
              f'(tensorboard --logdir {os.path.dirname(cfg["out_dir"]) or "."})')

    def settings(self, config, step):
        """The settings as a text (JSON) at `step`, the session's first."""
        text = '```\n' + json.dumps(config, indent=1, default=str) + '\n```'
        self.writers[0].add_text('settings', text, step)
        self.writers[0].flush()

    def record(self, metrics, step, tokens):
        """Each metric at `step` in the step folder and at `tokens` in the tokens folder, both flushed."""
        for w, x in zip(self.writers, (step, tokens)):
            for tag, v in metrics.items():
                w.add_scalar(tag, v, x)
            w.flush()

    def close(self):
        """Flush and close both event files."""
        for w in self.writers:
            w.close()


class Trackio:
    """A trackio run in its local store: project and name from run_names; a resumed run continues the run of
    trackers.json's id (resume='allow' by name, its id checked), its rows made equal to the log (sync)."""
    name = 'trackio'

    def __init__(self, cfg, resumed_step, state, past):
        import trackio
        project, name = run_names(cfg)
        old = state.get('trackio') if isinstance(state.get('trackio'), dict) else {}
        resume = resumed_step is not None and old.get('project') == project and old.get('name') == name
        start = lambda how: trackio.init(project=project, name=name, config={}, resume=how, embed=False,  # noqa: E731
                                         auto_log_cpu=False, auto_log_gpu=False)
        with quiet():
            self.run = start('allow' if resume else 'never')
        if resume and self.run.id != old.get('id'):        # trackio resumes the latest run of the name
            with quiet():
                self.run = start('never')
            print(f'note: trackio: run {name!r} (id {old.get("id")}) is not the latest of its name in '
                  f'project {project!r}, or is gone: a new run, sent the log up to step {resumed_step}')
        state['trackio'] = {'project': project, 'name': name, 'id': self.run.id}
        self.replay_from = self.sync(project, past.points)
        print(f'trackio: project {project!r}, run {name!r} (trackio show --project {project})')

    def sync(self, project, want):
        """Make this run's rows in the local store a prefix of `want` (points: the log's, as the resume keeps
        it): find the first step whose rows differ from the log's records there (a step the stopped session
        logged after its checkpoint, or one the run lacks), delete the rows from it on -> that step (None: the
        rows equal the log), from which the log is sent again. The rows are compared whole, step by step."""
        import sqlite3
        from collections import Counter
        from trackio.sqlite_storage import SQLiteStorage
        held = [(r['step'], {k: v for k, v in r.items() if k not in ('step', 'timestamp')})
                for r in SQLiteStorage.get_logs(project, run_id=self.run.id)]
        rows = {}
        for which, pts in enumerate((held, want)):
            for step, metrics in pts:
                rows.setdefault(step, (Counter(), Counter()))[which][frozenset(metrics.items())] += 1
        first = next((s for s in sorted(rows) if rows[s][0] != rows[s][1]), None)
        if first is not None and any(s >= first for s, _ in held):
            db = SQLiteStorage.get_project_db_path(project)
            with SQLiteStorage._get_process_lock(project), contextlib.closing(sqlite3.connect(db)) as conn, \
                    conn:
                conn.execute('DELETE FROM metrics WHERE run_id = ? AND step >= ?', (self.run.id, first))
        return first

    def settings(self, config, step):
        """The run's config (trackio sends it with the first record)."""
        self.run.config.update(json.loads(json.dumps(config, default=str)))

    def record(self, metrics, step, tokens):
        """One trackio record at `step`, tokens_seen in it."""
        self.run.log({**metrics, 'tokens_seen': tokens}, step=step)

    def close(self):
        """Finish the run: its thread writes what it holds."""
        import trackio
        with quiet():
            trackio.finish()            # the module's current run, this one: its exit hook then has none to finish


class WandB:
    """A W&B run (online, or offline with WANDB_MODE=offline) in OUT_DIR/wandb, id kept in trackers.json;
    every metric plotted against the 'step' value it is logged with. A resumed run continues trackers.json's
    run only where it holds exactly the log the resume keeps (W&B cannot delete its rows): it was started or
    continued by the stopped session, not dropped, and that session logged nothing after its checkpoint; else
    a new run of the name is sent the whole log."""
    name = 'wandb'

    def __init__(self, cfg, resumed_step, state, past):
        import wandb
        project, name = run_names(cfg)
        old = state.get('wandb') if isinstance(state.get('wandb'), dict) else {}
        whole = (resumed_step is not None and old.get('project') == project and 'id' in old and not past.tail
                 and old.get('session') == past.session - 1 and not old.get('dropped'))
        with quiet():
            self.run = wandb.init(project=project, name=name, dir=cfg['out_dir'], config={},
                                  id=old['id'] if whole else None, resume='allow' if whole else None,
                                  settings=wandb.Settings(silent=True, console='off'))
            self.run.define_metric('step')
            self.run.define_metric('*', step_metric='step')
        if resumed_step is not None and 'id' in old and not whole:
            print(f'note: wandb: run {old["id"]} holds other steps than the log up to step {resumed_step} '
                  f'(W&B cannot take a step back): a new run {self.run.id}, sent the log')
        self.replay_from = None if whole or not past.history else 0
        state['wandb'] = {'project': project, 'name': name, 'id': self.run.id, 'session': past.session}
        print(f'wandb: project {project!r}, run {name!r} (id {self.run.id}' + (f', {self.run.url})' if
                                                                                self.run.url else ', offline)'))

    def settings(self, config, step):
        """The run's config (a resumed session's changed settings replace the saved ones)."""
        self.run.config.update(config, allow_val_change=True)

    def record(self, metrics, step, tokens):
        """One W&B history row with step and tokens_seen; summary/ values also to the run's summary."""
        summary = {k: v for k, v in metrics.items() if k.startswith('summary/')}
        if summary:
            self.run.summary.update(summary)
        self.run.log({**metrics, 'step': step, 'tokens_seen': tokens})

    def close(self):
        """Finish the run."""
        with quiet():
            self.run.finish()


TRACKERS = {'tensorboard': TensorBoard, 'trackio': Trackio, 'wandb': WandB}


# ----------------------------------------------------------------------------- what train.py calls

class Trackers:
    """The trackers of one training process (none: every call does nothing). log() sends a record to each; a
    tracker that raises, or whose library reports a failure in its own thread (a warning, an exception in
    TensorBoard's writer thread), is dropped with one warning line on stderr, and marked so in trackers.json
    (state, written to state_path). tps: the tokens a step of this session; settings: the base of each
    session's settings (the resolved settings and params)."""

    def __init__(self, trackers=(), tps=0, settings=None, state=None, state_path=None):
        self.live, self.tps, self.config, self.step = list(trackers), tps, settings or {}, None
        self.state, self.state_path = state, state_path
        self.dropped, self.lock = [], threading.Lock()
        self.hooks = None                  # what open trackers replace: (threading.excepthook, showwarning, filter)
        if self.live:
            hooks = threading.excepthook, warnings.showwarning
            threading.excepthook, warnings.showwarning = self._thread_failed, self._warned
            warnings.filterwarnings('always', module='trackio')      # each failure seen, not once a process
            self.hooks = (*hooks, warnings.filters[0])

    def __bool__(self):
        return bool(self.live)

    def log(self, rec):
        """Send one log.jsonl record (dict, as train.py wrote it) to every live tracker: a 'config' record's
        settings (at the last step sent), then the metrics of 'train', 'eval' and 'summary' (metrics_of) at
        its step and tokens seen (tokens_of)."""
        self._send(rec, lambda t: True)

    def replay(self, history):
        """Send each tracker the records of `history` (the log a resume keeps) from its replay_from step on,
        the settings of each session with them (replay_from None: none), as log() sends them."""
        for rec in history:
            step = rec.get('step')
            self._send(rec, lambda t: t.replay_from is not None and not (is_int(step) and
                                                                          step < t.replay_from))
        for t in self.live:
            t.replay_from = None

    def _send(self, rec, to):
        """log()'s work for the trackers `to` (a function of a tracker -> bool) accepts."""
        if rec.get('event') == 'config':
            self.tps = session_tps(rec, self.tps)
            config = rec.get('config') if isinstance(rec.get('config'), dict) else {}
            extra = {k: v for k, v in rec.items() if k not in ('event', 'config')}
            settings = {**self.config, **config, **extra}
            at = self.step or 0
            self._each(lambda t: t.settings(settings, at), to)
            return
        metrics, step = metrics_of(rec), rec.get('step')
        if not metrics or not is_int(step):
            return
        self.step, tokens = step, tokens_of(rec, self.tps)
        self._each(lambda t: t.record(metrics, step, tokens), to)

    def _each(self, call, to):
        for t in list(self.live):
            if not to(t):
                continue
            try:
                call(t)
            except Exception as e:              # a tracker's failure is never the run's
                self._drop(t, e)

    def _drop(self, t, why):
        """Stop sending to tracker t, with one warning line naming why (an exception or a message), and mark
        it dropped in trackers.json (a resume then knows it lacks records); close() finishes it, quietly (from
        the main thread: this may run in the tracker's own)."""
        with self.lock:
            if t not in self.live:
                return
            self.live.remove(t)
            self.dropped.append(t)
            if self.state is not None and t.name in self.state:
                self.state[t.name]['dropped'] = True
                with contextlib.suppress(OSError):
                    write_atomic(self.state_path, json.dumps(self.state, indent=1))
        text = f'{type(why).__name__}: {why}' if isinstance(why, BaseException) else str(why)
        text = ' '.join(text.split())[:200]
        at = f' at step {self.step}' if self.step is not None else ''
        print(f'train.py: warning: --log_to={t.name} failed{at} ({text}); training goes on without it '
              '(log.jsonl holds every record)', file=sys.stderr, flush=True)

    def _thread_failed(self, args):
        """threading.excepthook while trackers are open: TensorBoard's writer thread dies quietly (the next
        flush raises its exception, and the tracker is dropped); any other thread as before."""
        if type(args.thread).__module__.startswith('tensorboard'):
            return
        self.hooks[0](args)

    def _warned(self, message, category, filename, lineno, file=None, line=None):
        """warnings.showwarning while trackers are open: trackio's warnings (it reports its failures so,
        from its own thread) drop it; any other warning is shown as before."""
        if f'{os.sep}trackio{os.sep}' in filename:
            for t in [t for t in self.live if t.name == 'trackio']:
                self._drop(t, message)
            return
        self.hooks[1](message, category, filename, lineno, file, line)

    def close(self):
        """Finish every live tracker (a failure: its warning line) and put back the hooks log() used."""
        for t in list(self.live):
            try:
                t.close()
            except Exception as e:
                self._drop(t, e)
        for t in self.dropped:
            with contextlib.suppress(Exception), quiet(), contextlib.redirect_stderr(io.StringIO()):
                t.close()
        self.live, self.dropped = [], []
        if self.hooks:
            threading.excepthook, warnings.showwarning = self.hooks[:2]
            with contextlib.suppress(ValueError):
                warnings.filters.remove(self.hooks[2])
            warnings._filters_mutated()
            self.hooks = None


def open_trackers(cfg, resumed_step, params, world):
    """Start the trackers cfg['log_to'] names (call on rank 0 only, after check_log_to, before
    record.prepare_run_folder) -> Trackers (empty for log_to ''), each holding exactly the log the run
    continues (on resume: the records up to the checkpoint's step, replayed where a tracker lacks them).
    resumed_step: the checkpoint's step on --init_from=resume, else None; params: the model's parameter count;
    world: the number of processes. A log that cannot be read (read_run_log) or a tracker that cannot start
    (its folder, its server, its account): one line 'train.py: error: ...', exit 2."""
    names = tracker_names(cfg['log_to'])
    if not names:
        return Trackers()
    state_path = os.path.join(cfg['out_dir'], STATE)
    state, history, tail = {}, [], False
    if resumed_step is not None:
        from harness.loading import kept_on_resume
        records = read_run_log(cfg['out_dir'])
        history = kept_on_resume(records, resumed_step)
        tail = len(history) < len(records)
        with contextlib.suppress(OSError, ValueError):
            with open(state_path) as f:
                state = json.load(f)
        state = state if isinstance(state, dict) else {}
    from harness.checkpoint import tokens_per_step
    tps, started = tokens_per_step(cfg, world), []
    past = SimpleNamespace(history=history, points=points(history, tps), tail=tail,
                           session=sum(r.get('event') == 'config' for r in history))
    for name in names:
        try:
            started.append(TRACKERS[name](cfg, resumed_step, state, past))
        except Exception as e:                  # a library raises many types: one line names it
            for t in started:
                with contextlib.suppress(Exception), quiet():
                    t.close()
            fail(f'--log_to={name} could not start ({type(e).__name__}: {" ".join(str(e).split())[:200]})')
    try:
        write_atomic(state_path, json.dumps(state, indent=1))
    except OSError as e:
        fail(f'could not write {state_path} ({e.strerror or e})')
    trackers = Trackers(started, tps, {**cfg, 'params': params}, state, state_path)
    trackers.replay(history)
    return trackers
