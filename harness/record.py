"""What keeps train.py's loop safe, reached from it by a few named calls: every rank stopping together (a
non-finite loss, a failed save, Ctrl-C or SIGTERM), the run's record (log.jsonl and the trackers), its
header and its summary.

    with StopRequests() as requests:                  # Ctrl-C / SIGTERM: stop after this step, saved
        stop_together(env, pending, requests)          # raises Stop on every rank, or on none
    log = RunLog(cfg, env, ckpt, params)               # log.jsonl and the trackers (rank 0)
    log.write(rec, line)                               # line printed, rec appended to log.jsonl (rank 0)
"""

import os
import signal
import threading
from dataclasses import asdict

import torch
import torch.distributed as dist

from harness import checkpoint, machine
from harness.cli import one_line, own_line, remove_stale_temps


class Stop(Exception):
    """Ends a run early: `what` happened (one line), `code` is the exit status (1: a fault; 130: Ctrl-C;
    143: SIGTERM; the checkpoint of the step reached was saved first for those two)."""

    def __init__(self, what, code=1):
        super().__init__(what)
        self.code = code


class StopRequests:
    """Ctrl-C (SIGINT) and SIGTERM while the loop runs: the first asks the run to stop at the end of the step
    it is in, with a checkpoint of that step (stop_together reads `requested`); a second stops at once
    (KeyboardInterrupt), the checkpoint on disk as it was. Outside the main thread, or where SIGINT is
    ignored (a pool process), that signal is left as it is."""

    def __enter__(self):
        self.requested, self.old = None, {}
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(s) is not signal.SIG_IGN:
                    self.old[s] = signal.signal(s, self.handle)
        return self

    def handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = ('interrupted (Ctrl-C)', 130) if signum == signal.SIGINT else \
            ('terminated (SIGTERM)', 143)

    def __exit__(self, *exc):
        for s, handler in self.old.items():
            signal.signal(s, handler)


def stop_together(env, pending=(), requests=None, reason=None):
    """Stop every rank together, or none: checks the pending (step, loss tensor) pairs with one device sync
    (then clears them), a stop request (StopRequests) and `reason` (a fault of this rank, one line); under
    DDP the ranks share their answers (none waits alone in a collective). Raises Stop naming each cause."""
    if pending:
        losses = torch.stack([loss for _, loss in pending]).float().cpu()
        bad = (~torch.isfinite(losses)).nonzero()
        if len(bad):
            reason = f'non-finite train loss {losses[bad[0, 0]].item()} at step {pending[bad[0, 0]][0]}'
        pending.clear()
    asked = requests.requested if requests else None
    if env.ddp:
        flags = torch.tensor([float(reason is not None), float(asked is not None)], device=env.dev)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[0].item():
            reasons = [None] * env.world
            dist.all_gather_object(reasons, reason)
            reason = '; '.join(f'rank {r}: {m}' for r, m in enumerate(reasons) if m)
        elif flags[1].item():
            asked = asked or ('interrupted (Ctrl-C)', 130)     # another rank's
    if reason is not None:
        raise Stop(f'error: {reason}; stopping')
    if asked is not None:
        raise Stop(*asked)


def prepare_run_folder(cfg, ckpt, rank=0):
    """After every check passed: remove an old run's files (overwrite) or drop the log records after the
    checkpoint's step (resume: loading.resume_log) -> log.jsonl open for appending (None on other ranks).
    Raises CheckpointError (one line) when the folder cannot be prepared."""
    if rank != 0:
        return None
    ckpt_path, log_path = (os.path.join(cfg['out_dir'], f) for f in ('ckpt.pt', 'log.jsonl'))
    try:
        remove_stale_temps(cfg['out_dir'], 'train.py')        # a killed save's temporary file
        if ckpt is None:
            for p in (ckpt_path, log_path, ckpt_path + '.tmp'):     # (.tmp: an older version's temporary)
                if os.path.exists(p):
                    os.remove(p)
        else:
            from harness.loading import resume_log      # here: a fresh run reads no log
            resume_log(log_path, ckpt['step'])
        return open(log_path, 'ab')
    except OSError as e:
        raise checkpoint.CheckpointError(f'cannot prepare {cfg["out_dir"]} ({one_line(e)})') from None


class RunLog:
    """A run's record on rank 0: the console lines and log.jsonl (events config, schedule, train, eval,
    threads, precision, summary), each record sent to the trackers too. Made once every check has passed:
    it starts the trackers of cfg['log_to'] (harness/trackers.py; params: the model's parameter count) and
    prepares the run folder (prepare_run_folder: ckpt None a fresh run, else the resumed checkpoint), on
    rank 0; CheckpointError when the folder cannot be prepared. 'train' records get the machine's load
    (other_load: cores busy with other processes' work over the interval, machine.LoadMeter)."""

    def __init__(self, cfg, env, ckpt, params):
        self.cfg, self.env, self.trackers = cfg, env, None
        if cfg['log_to'] and env.master:     # before the folder is prepared: they read the log's last step
            from harness.trackers import open_trackers
            self.trackers = open_trackers(cfg, ckpt and ckpt['step'], params, env.world)
        self.file = prepare_run_folder(cfg, ckpt, env.rank)
        self.load, self.loads = machine.LoadMeter(), []

    def write(self, rec, line=None):
        """Print `line` (rank 0) and append `rec` to the log and the trackers. A failed write of the log: Stop
        naming it (a tracker's failure is its own warning)."""
        if line is not None and self.env.master:
            print(line, flush=True)
        if rec.get('event') == 'train':
            rec['other_load'] = self.load.read()
            self.loads += [rec['other_load']] if rec['other_load'] is not None else []
        if self.file:
            try:
                checkpoint.append_log(self.file, rec)
            except OSError as e:
                raise Stop(f'error: could not write {self.file.name} '
                           f'({checkpoint.write_error(e, self.file.name)}); stopping') from None
        if self.trackers:
            self.trackers.log(rec)

    def close(self):
        """Close the log and the trackers (what this rank holds)."""
        for f in (self.file, self.trackers):
            if f:
                f.close()

    def tuned(self, change, step, tokens_per):
        """A change of the precision or the CPU's threads (machine.Tuning.stepped's `change`, rates in
        steps/s) at `step` -> its line and a 'precision' or 'threads' event (rates in tokens/s); returns the
        peak MFU is measured against from now on (FLOP/s: the precision's)."""
        at = f'step {step:5d}/{self.cfg["max_iters"]} | '
        peak, peak_name = self.env.tuning.peak()
        if change['event'] == 'precision':
            rates = {k: r * tokens_per for k, r in change['rates'].items()}
            self.write({'event': 'precision', 'step': step, 'dtype': change['dtype'], 'tokens_per_s': rates,
                        'peak_flops': peak, 'peak': peak_name},
                       at + f'precision {change["dtype"]}: '
                       + ', '.join(f'{k} {r / 1e3:.1f}k' for k, r in rates.items())
                       + f' tokens/s; MFU now against {peak_name}')
            return peak
        rates = [None if r is None else r * tokens_per for r in (change['rate_from'], change['rate'])]
        self.write({'event': 'threads', 'step': step, 'threads': change['threads'], 'from': change['from'],
                    'tokens_per_s': rates[1], 'tokens_per_s_from': rates[0]},
                   at + f'threads {change["from"]} -> {change["threads"]}: '
                   + ' -> '.join('?' if r is None else f'{r / 1e3:.1f}k' for r in rates) + ' tokens/s')
        return peak

    def start(self, run, ckpt, meta, get_lr):
        """The run's header: the 'config' and 'schedule' events and their lines (the model, the processes, the
        peak MFU is measured against, the schedule: get_lr(step, settings), train.py's learning rate)."""
        cfg, env, n_params = self.cfg, self.env, run.raw_model.num_params()
        peaks = {d: machine.peak_flops(env.dev, getattr(torch, d)) for d in env.tuning.dtypes}  # measured now
        peak, peak_name = peaks[env.dtype]
        self.write({'event': 'config', 'config': cfg, 'model_config': asdict(run.model_cfg),
                    'world_size': env.world, 'device': env.dev, 'dtype': env.dtype, 'params': n_params,
                    'flops_per_token': run.flops, 'peak_flops': peak, 'peak': peak_name, 'meta': meta,
                    'threads': env.tuning.threads.threads},
                   f'{cfg["variant"]} ({run.model_cfg.kind}, token_mixing={run.model_cfg.token_mixing}, task='
                   f'{cfg["task"]}): {n_params / 1e6:.2f}M params, {run.flops / 1e6:.1f} MFLOP/token '
                   f'(fwd+bwd), {env.world} process(es) on {env.dev}, {env.dtype}, '
                   f'{checkpoint.tokens_per_step(cfg, env.world)} tokens/step\n'
                   f'MFU is reported against {peak_name}')
        decay_iters = cfg['lr_decay_iters'] or cfg['max_iters']
        rec = {'event': 'schedule', 'from_step': run.step, 'max_iters': cfg['max_iters'],
               'warmup_iters': cfg['warmup_iters'], 'learning_rate': cfg['learning_rate'],
               'min_lr': cfg['min_lr'], 'lr_decay_iters': decay_iters, 'lr_now': get_lr(run.step, cfg)}
        saved = ''
        if ckpt is not None:
            rec['lr_saved_schedule'] = get_lr(run.step, {**cfg, **{k: ckpt['config'].get(k, cfg[k]) for k in (
                'learning_rate', 'min_lr', 'warmup_iters', 'lr_decay_iters', 'max_iters')}})
            saved = f' (the saved run\'s schedule: {rec["lr_saved_schedule"]:.2e})'
        self.write(rec, f'schedule: steps {run.step} -> {cfg["max_iters"]}; lr warm-up '
                        f'{cfg["warmup_iters"]} steps to {cfg["learning_rate"]:.2e}, cosine to '
                        f'{cfg["min_lr"]:.2e} at step {decay_iters}; lr now {rec["lr_now"]:.2e}{saved}')

    def summary(self, run, speed, wall_seconds, train_tokens):
        """The 'summary' event and line: final and best validation loss (nats/token, bits per byte), steps,
        tokens and epochs (of train_tokens, the training split's length), wall and training seconds; tokens/s
        and MFU over the whole training time (tokens_per_s, mfu) and steady (steady_tokens_per_s, steady_mfu:
        the logged intervals after the first, whose warm-up, e.g. torch.compile's, they leave out, as
        nanoGPT's running MFU does; None before a second interval); the machine's mean load (other_load); on
        CUDA the peak memory of the run's tensors (peak_memory_gib). speed: {'seconds', 'tokens',
        'steady_seconds', 'steady_tokens'} of this session's training."""
        ev, env = run.last_eval, self.env
        tok_s = speed['tokens'] / speed['seconds'] if speed['seconds'] > 0 else 0.0
        steady = speed['steady_tokens'] / speed['steady_seconds'] if speed['steady_seconds'] > 0 else None
        peak, peak_name = env.tuning.peak()
        mfu_of = lambda t: None if t is None else run.flops * t / env.world / peak      # noqa: E731
        rec = {'event': 'summary', 'final_val_loss': ev['val_loss'], 'final_val_bpb': ev['val_bpb'],
               'final_val_acc': ev['val_acc'], 'best_val_loss': run.best_val, 'step': run.step,
               'tokens_seen': run.tokens, 'epochs': run.tokens / train_tokens,
               'train_seconds': speed['seconds'], 'wall_seconds': wall_seconds, 'tokens_per_s': tok_s,
               'mfu': mfu_of(tok_s), 'steady_tokens_per_s': steady, 'steady_mfu': mfu_of(steady),
               'other_load': sum(self.loads) / len(self.loads) if self.loads else None,
               'peak_memory_gib': torch.cuda.max_memory_allocated(env.dev) / 2 ** 30 if env.cuda else None,
               **({'final_train_windows_loss': ev['train_windows_loss']} if self.cfg['eval_train'] else {})}
        line = (f'steady {steady:,.0f} tok/s, MFU {machine.fmt_mfu(rec["steady_mfu"])} (logged steps '
                f'after the first interval); ' if steady else '')
        line += f'whole run {tok_s:,.0f} tok/s, MFU {machine.fmt_mfu(rec["mfu"])} (against {peak_name})'
        line += f' | peak GPU memory {rec["peak_memory_gib"]:.1f} GiB' if env.cuda else ''
        self.write(rec, f'summary: final val loss {ev["val_loss"]:.4f} nats/token ({ev["val_bpb"]:.4f} '
                        f'bits/byte, acc {ev["val_acc"]:.3f}), best {run.best_val:.4f} | {run.step} steps, '
                        f'{run.tokens:,} tokens = {rec["epochs"]:.2f} epochs | wall '
                        f'{machine.hms(wall_seconds)}, training {machine.hms(speed["seconds"])} | {line} | '
                        f'checkpoint '
                        f'{run.ckpt_path if run.saved_step is not None else "none"}')


def stopped_line(what, run, cfg):
    """The line a stopped run ends with, on stderr: what happened, the step reached, what the checkpoint
    holds and how to go on."""
    held = (f'{run.ckpt_path} holds step {run.saved_step}; resume: python train.py --init_from=resume '
            f'--out_dir={cfg["out_dir"]}' if run.saved_step is not None else 'no checkpoint was written')
    own_line(f'train.py: {what} at step {run.step}; {held}')


if __name__ == '__main__':
    from harness.cli import fail
    fail("what keeps train.py's loop safe, not a command: python train.py --help", 'harness/record.py')
