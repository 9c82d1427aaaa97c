"""The trackers train.py logs to besides log.jsonl: `--log_to=tensorboard,trackio,wandb` (any of them, commas
between), `--project` (default: the data folder's name, as nanoGPT's wandb_project 'owt') and `--run_name`
(default: out_dir's last folder, which each config names after itself). Each library is imported only when named.

    trackers = open_trackers(cfg, resumed_step, params, world)    # rank 0, before checkpoint.prepare_run_folder
    trackers.log(rec)                                             # every record train.py appends to log.jsonl
    trackers.close()                                              # in train.py's finally

What each tracker gets from the records (units as in log.jsonl: losses in nats/token):
  the settings and the parameter count, once: the resolved settings, `params` and the 'config' record's
      model_config, world_size, device, dtype, flops_per_token, peak_flops, meta (the data's meta.json);
  'train'   train/loss, train/lr, speed/ms_per_step, speed/tokens_per_s, speed/mfu (every log_interval);
  'eval'    val/loss, val/bpb (bits per byte), val/acc, and train_windows/... with eval_train (every eval);
  'summary' summary/final_val_loss, summary/tokens_per_s, ... (the run's last record);
against the optimiser step and against tokens seen (tokens_seen = step x batch_size x n_ctx x grad_accum x world
size, the summary's count): TensorBoard has a second event folder whose step axis is tokens; Trackio and W&B get
tokens_seen in every record, to choose as their x-axis.

Where they go: tensorboard: OUT_DIR/tensorboard/step and OUT_DIR/tensorboard/tokens (`tensorboard --logdir out`
shows every run); trackio: its local store ($TRACKIO_DIR, by default ~/.cache/huggingface/trackio; `trackio show
--project PROJECT`); wandb: OUT_DIR/wandb (`WANDB_MODE=offline` needs no account). OUT_DIR/trackers.json holds
the trackio and wandb run ids.

A resumed run (--init_from=resume) continues the same tracker runs, the ids read from trackers.json: TensorBoard
purges the events after the checkpoint's step (SummaryWriter's purge_step; the stopped session's are hidden), and
Trackio and W&B, which cannot take a step back, are not sent the steps they hold already (those the stopped session
logged after its checkpoint: on resume they are computed again, the same windows from the same state). No step is
logged twice.

A named library that is not installed, or a tracker that cannot start, is one line and exit 2 before training
(check_log_to, open_trackers). A tracker that fails later (its folder gone, its disk full, its writer thread
dead) costs one warning line on stderr and is dropped: never the run, its log or its checkpoint.
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
    None: one line 'train.py: error: ...', exit 2. The libraries are imported here, before the model is built."""
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


def tokens_per_step(cfg, world):
    """Tokens of one optimiser step over every process: batch_size x n_ctx x grad_accum x world."""
    return cfg['batch_size'] * cfg['n_ctx'] * cfg['grad_accum'] * world


def metrics_of(rec):
    """A log.jsonl record -> {tag: number} a tracker plots: 'train' -> train/loss, train/lr, speed/...;
    'eval' -> SPLIT/NAME of each SPLIT_NAME value (val/loss, val/bpb, val/acc); 'summary' -> summary/NAME of
    each number; {} for the others (config, schedule) and for None values."""
    kind = rec.get('event')
    if kind == 'train':
        out = {'train/loss': rec['loss'], 'train/lr': rec['lr'],
               **{f'speed/{k}': rec[k] for k in ('ms_per_step', 'tokens_per_s', 'mfu')}}
    elif kind == 'eval':
        out = {'/'.join(k.rsplit('_', 1)): v for k, v in rec.items() if k not in ('event', 'step', 'tokens')}
    elif kind == 'summary':
        out = {f'summary/{k}': v for k, v in rec.items() if k not in ('event', 'step')}
    else:
        return {}
    return {k: v for k, v in out.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def last_logged_step(out_dir):
    """The highest step of out_dir/log.jsonl as the stopped session left it (None without one): the steps it
    sent its trackers. Read before checkpoint.prepare_run_folder drops those after the checkpoint."""
    from harness.checkpoint import CheckpointError, read_log      # here: the check above needs no torch
    try:
        steps = [r['step'] for r in read_log(os.path.join(out_dir, 'log.jsonl')) if isinstance(r.get('step'), int)]
    except (CheckpointError, OSError):
        return None
    return max(steps, default=None)


@contextlib.contextmanager
def quiet():
    """The trackers' own console lines (trackio's banner, wandb's) kept off train.py's stdout."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


# ----------------------------------------------------------------------------- the trackers
# Each: Kind(cfg, resumed_step, tps, state) starts it (tps: tokens a step; state: trackers.json's dict, where it
# puts its ids), raising what its library raises; settings(config) the run's settings, once a start;
# record(metrics {tag: number}, step, tokens seen); close(). skips_logged: a resumed run does not send it the
# steps it holds (it cannot take them back).

class TensorBoard:
    """torch.utils.tensorboard.SummaryWriter twice: OUT_DIR/tensorboard/step (x: the optimiser step) and
    OUT_DIR/tensorboard/tokens (x: tokens seen); flushed after every record (the dashboard follows the run,
    and a failed write is seen at once). A fresh run removes the event files an earlier run left there; a
    resumed one purges what the stopped session wrote after the checkpoint."""
    name, skips_logged = 'tensorboard', False

    def __init__(self, cfg, resumed_step, tps, state):
        from torch.utils.tensorboard import SummaryWriter
        self.dirs = [os.path.join(cfg['out_dir'], 'tensorboard', axis) for axis in ('step', 'tokens')]
        if resumed_step is None:
            for d in self.dirs:
                for f in glob.glob(os.path.join(d, 'events.out.tfevents.*')):
                    os.remove(f)
        purge = (None, None) if resumed_step is None else (resumed_step + 1, resumed_step * tps + 1)
        self.writers = [SummaryWriter(d, purge_step=p) for d, p in zip(self.dirs, purge)]
        self.start = resumed_step or 0
        print(f'tensorboard: {os.path.dirname(self.dirs[0])} '
              f'(tensorboard --logdir {os.path.dirname(cfg["out_dir"]) or "."})')

    def settings(self, config):
        """The settings as a text (JSON) at the start step."""
        text = '```\n' + json.dumps(config, indent=1, default=str) + '\n```'
        self.writers[0].add_text('settings', text, self.start)
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
    trackers.json's id (resume='allow' by name, its id checked)."""
    name, skips_logged = 'trackio', True

    def __init__(self, cfg, resumed_step, tps, state):
        import trackio
        project, name = run_names(cfg)
        old = state.get('trackio', {})
        resume = resumed_step is not None and old.get('project') == project and old.get('name') == name
        start = lambda how: trackio.init(project=project, name=name, config={}, resume=how, embed=False,  # noqa: E731
                                         auto_log_cpu=False, auto_log_gpu=False)
        with quiet():
            self.run = start('allow' if resume else 'never')
        if resume and self.run.id != old.get('id'):        # trackio resumes the latest run of the name
            with quiet():
                self.run = start('never')
            print(f'note: trackio: run {name!r} (id {old.get("id")}) is not the latest of its name in project '
                  f'{project!r}, or is gone: a new run from step {resumed_step}')
        state['trackio'] = {'project': project, 'name': name, 'id': self.run.id}
        print(f'trackio: project {project!r}, run {name!r} (trackio show --project {project})')

    def settings(self, config):
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
    """A W&B run (online, or offline with WANDB_MODE=offline) in OUT_DIR/wandb, id kept in trackers.json for
    a resume; every metric plotted against the 'step' value it is logged with."""
    name, skips_logged = 'wandb', True

    def __init__(self, cfg, resumed_step, tps, state):
        import wandb
        project, name = run_names(cfg)
        old = state.get('wandb', {})
        resume = resumed_step is not None and old.get('project') == project and 'id' in old
        with quiet():
            self.run = wandb.init(project=project, name=name, dir=cfg['out_dir'], config={},
                                  id=old['id'] if resume else None, resume='allow' if resume else None,
                                  settings=wandb.Settings(silent=True, console='off'))
            self.run.define_metric('step')
            self.run.define_metric('*', step_metric='step')
        state['wandb'] = {'project': project, 'name': name, 'id': self.run.id}
        print(f'wandb: project {project!r}, run {name!r} (id {self.run.id}' + (f', {self.run.url})' if
                                                                                self.run.url else ', offline)'))

    def settings(self, config):
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


KINDS = {'tensorboard': TensorBoard, 'trackio': Trackio, 'wandb': WandB}


# ----------------------------------------------------------------------------- what train.py calls

class Trackers:
    """The trackers of one training process (none: every call does nothing). log() sends a record to each; a
    tracker that raises, or whose library reports a failure in its own thread (a warning, an exception in
    TensorBoard's writer thread), is dropped with one warning line on stderr."""

    def __init__(self, trackers=(), tps=0, settings=None, skip_to=None):
        self.live, self.tps, self.config, self.skip_to, self.step = list(trackers), tps, settings or {}, skip_to, None
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
        settings, then the metrics of 'train', 'eval' and 'summary' (metrics_of) at its step and tokens seen.
        A tracker that already holds the step (skip_to, on resume) is not sent it again."""
        if rec.get('event') == 'config':
            extra = {k: v for k, v in rec.items() if k not in ('event', 'config')}
            self._each(lambda t: t.settings({**self.config, **extra}))
            return
        metrics, step = metrics_of(rec), rec.get('step')
        if not metrics or not isinstance(step, int):
            return
        self.step = step
        old = self.skip_to is not None and step <= self.skip_to
        tokens = rec['tokens'] if isinstance(rec.get('tokens'), int) else step * self.tps     # older logs: none
        self._each(lambda t: t.record(metrics, step, tokens), skip=lambda t: old and t.skips_logged)

    def _each(self, call, skip=lambda t: False):
        for t in list(self.live):
            if skip(t):
                continue
            try:
                call(t)
            except Exception as e:              # a tracker's failure is never the run's
                self._drop(t, e)

    def _drop(self, t, why):
        """Stop sending to tracker t, with one warning line naming why (an exception or a message); close()
        finishes it, quietly (from the main thread: this may run in the tracker's own)."""
        with self.lock:
            if t not in self.live:
                return
            self.live.remove(t)
            self.dropped.append(t)
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
    checkpoint.prepare_run_folder) -> Trackers (empty for log_to ''). resumed_step: the checkpoint's step on
    --init_from=resume, else None; params: the model's parameter count; world: the number of processes. A
    tracker that cannot start (its folder, its server, its account): one line 'train.py: error: ...', exit 2."""
    names = tracker_names(cfg['log_to'])
    if not names:
        return Trackers()
    state_path = os.path.join(cfg['out_dir'], STATE)
    state = {}
    if resumed_step is not None:
        with contextlib.suppress(OSError, ValueError):
            with open(state_path) as f:
                state = json.load(f)
    skip_to = last_logged_step(cfg['out_dir']) if resumed_step is not None else None
    tps, started = tokens_per_step(cfg, world), []
    for name in names:
        try:
            started.append(KINDS[name](cfg, resumed_step, tps, state))
        except Exception as e:                  # a library raises many types: one line names it
            for t in started:
                with contextlib.suppress(Exception), quiet():
                    t.close()
            fail(f'--log_to={name} could not start ({type(e).__name__}: {" ".join(str(e).split())[:200]})')
    try:
        write_atomic(state_path, json.dumps(state, indent=1))
    except OSError as e:
        fail(f'could not write {state_path} ({e.strerror or e})')
    return Trackers(started, tps, {**cfg, 'params': params}, skip_to)
