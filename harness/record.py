"""A training run's record, kept for train.py's loop: its console lines and log.jsonl (events config, schedule,
train, eval, summary), the checkpoint saved whole, the speed it measured, the line a stopped run ends with;
and every rank stopping together (a NaN on one rank, a failed save).

    record = Record(cfg, env, run, meta, ckpt_path, log_file, trackers)    # log_file, trackers: rank 0's
    record.start(ckpt)                         # the header: 'config' and 'schedule'
    record.train(loss, lr, steps, clock)       # every log_interval steps; record.threads(change) as they change
    record.evaluated(ev, clock)                # at an evaluation: the line, the eval event, the checkpoint
    record.summary(clock, t_wall, len(train_data))   # at the end; record.stopped(what, code) when it stops early
"""

import math
import os
import sys
import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from harness import checkpoint, machine, optim
from harness.cli import deferred_interrupt


class Stop(Exception):
    """Ends a run early with a one-line message (train.main prints it and exits 1)."""


def agree_to_stop(env, reason=None):
    """Stop every rank together: each rank's reason to stop (None: none) is shared, so a NaN on one
    rank never leaves the others waiting in a collective. Raises Stop naming each reason."""
    if env.ddp:
        flag = torch.tensor([float(reason is not None)], device=env.dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            reasons = [None] * env.world
            dist.all_gather_object(reasons, reason)
            reason = '; '.join(f'rank {r}: {m}' for r, m in enumerate(reasons) if m)
    if reason is not None:
        raise Stop(reason)


def check_finite(env, pending):
    """Check the pending (step, loss tensor) pairs with one device sync, then clear them; a
    non-finite loss on any rank stops every rank (agree_to_stop)."""
    reason = None
    if pending:
        losses = torch.stack([l for _, l in pending]).float().cpu()
        bad = (~torch.isfinite(losses)).nonzero()
        if len(bad):
            reason = f'non-finite train loss {losses[bad[0, 0]].item()} at step {pending[bad[0, 0]][0]}'
        pending.clear()
    agree_to_stop(env, reason)


def tokens_per_step(cfg, env):
    """Tokens of one optimiser step over all processes."""
    return cfg['batch_size'] * cfg['n_ctx'] * cfg['grad_accum'] * env.world


class Record:
    """What a run has done and said. cfg: train.py's settings; env: machine.setup_device's; run: the
    run's model, raw_model, optimizers, batch_gen, model_cfg, flops (FLOPs a token, forward + backward),
    step and best_val (train.build_run); meta: the data's meta.json; ckpt_path: where the checkpoint goes;
    log: log.jsonl open for appending (rank 0; None on other ranks); trackers: harness/trackers.py's, which get
    every record too (None: none). It keeps the step the checkpoint
    holds (saved_step), the latest evaluation (last_ev), the peak MFU is measured against and the logged
    intervals' training time (steady speed)."""

    def __init__(self, cfg, env, run, meta, ckpt_path, log, trackers=None):
        self.cfg, self.env, self.run, self.meta, self.ckpt_path = cfg, env, run, meta, ckpt_path
        self.log, self.trackers = log, trackers
        self.start_step = run.step
        self.saved_step = run.step if cfg['init_from'] == 'resume' else None
        self.last_ev, self.peak = None, None
        self.start_tokens = 0              # tokens seen at start_step (on resume the checkpoint's: start)
        self.intervals_logged, self.steady_steps, self.steady_seconds = 0, 0, 0.0

    def write(self, rec):
        """Append one record to the log (rank 0; others have none), and send it to the trackers. A failed write
        of the log: Stop naming it (a tracker's failure is its own warning)."""
        if self.log:
            try:
                checkpoint.append_log(self.log, rec)
            except OSError as e:
                raise Stop(f'could not write {self.log.name} ({checkpoint.write_error(e, self.log.name)})') from None
        if self.trackers:
            self.trackers.log(rec)

    def close(self):
        """Close the log and the trackers (what this rank holds)."""
        for f in (self.log, self.trackers):
            if f:
                f.close()

    def say(self, *a, **k):
        """print on rank 0."""
        if self.env.master:
            print(*a, **k)

    def start(self, ckpt):
        """The run's header: the 'config' and 'schedule' events and the console lines naming the model, the
        processes, the peak MFU is measured against and the schedule. Sets the peak (FLOP/s: the device's
        nominal peak, or a matmul measured for about 0.3 s)."""
        cfg, env, run = self.cfg, self.env, self.run
        self.start_tokens = checkpoint.tokens_seen(ckpt, cfg)    # a batch changed on resume counts from here
        self.peak, peak_name = machine.peak_flops(env.dev, getattr(torch, env.dtype))
        n_params = run.raw_model.num_params()
        self.write({'event': 'config', 'config': cfg, 'model_config': asdict(run.model_cfg), 'world_size': env.world,
                    'device': env.dev, 'dtype': env.dtype, 'params': n_params, 'flops_per_token': run.flops,
                    'peak_flops': self.peak, 'peak': peak_name, 'meta': self.meta,
                    'threads': env.threads.threads})
        self.say(f'{cfg["variant"]} ({run.model_cfg.kind}, token_mixing={run.model_cfg.token_mixing}, task={cfg["task"]}): '
                 f'{n_params / 1e6:.2f}M params, {run.flops / 1e6:.1f} MFLOP/token (fwd+bwd), '
                 f'{env.world} process(es) on {env.dev}, {env.dtype}, {tokens_per_step(cfg, env)} tokens/step')
        self.say(f'MFU is reported against {peak_name}')
        decay_iters = cfg['lr_decay_iters'] or cfg['max_iters']
        schedule = {'event': 'schedule', 'from_step': run.step, 'max_iters': cfg['max_iters'],
                    'warmup_iters': cfg['warmup_iters'], 'learning_rate': cfg['learning_rate'], 'min_lr': cfg['min_lr'],
                    'lr_decay_iters': decay_iters, 'lr_now': optim.lr_at(run.step, cfg)}
        if ckpt is not None:
            schedule['lr_saved_schedule'] = optim.lr_at(run.step, {**cfg, **{k: ckpt['config'].get(k, cfg[k]) for k in (
                'learning_rate', 'min_lr', 'warmup_iters', 'lr_decay_iters', 'max_iters')}})
        self.write(schedule)
        self.say(f'schedule: steps {run.step} -> {cfg["max_iters"]}; lr warm-up {cfg["warmup_iters"]} steps to '
                 f'{cfg["learning_rate"]:.2e}, cosine to {cfg["min_lr"]:.2e} at step {decay_iters}; lr now '
                 f'{schedule["lr_now"]:.2e}' + (f' (the saved run\'s schedule: {schedule["lr_saved_schedule"]:.2e})'
                                                if ckpt is not None else ''))

    def evaluated(self, ev, clock):
        """At an evaluation step: ev, rank 0's evaluation ({'val_loss', 'val_bpb', 'val_acc', ...}; None on other
        ranks), printed and logged, and the checkpoint saved; every rank agrees to stop on a non-finite loss or
        a failed save."""
        cfg, run = self.cfg, self.run
        rng, reason = checkpoint.gather_rng(run.batch_gen, self.env), None
        if ev is not None and math.isfinite(ev['val_loss']):
            run.best_val, self.last_ev = min(run.best_val, ev['val_loss']), {'step': run.step, **ev}
            print(f'step {run.step:5d}/{cfg["max_iters"]} | val loss {ev["val_loss"]:.4f} nats/token | '
                  f'{ev["val_bpb"]:.4f} bits/byte | acc {ev["val_acc"]:.3f} | '
                  + (f'train windows {ev["train_windows_loss"]:.4f} | ' if cfg['eval_train'] else '') +
                  f'ETA {clock.eta(run.step - self.start_step, cfg["max_iters"] - run.step)}', flush=True)
            self.write({'event': 'eval', 'step': run.step, 'tokens': self.tokens_seen(), **ev})
            if cfg['save_checkpoint'] and run.step > 0:
                try:
                    self.save(rng)
                except checkpoint.CheckpointError as e:     # every rank stops, not rank 0 alone
                    reason = str(e)
        elif ev is not None:
            reason = f'non-finite val loss {ev["val_loss"]} at step {run.step}'
        agree_to_stop(self.env, reason)
        if cfg['save_checkpoint'] and run.step > 0:     # rank 0 saved (else agree_to_stop raised): every rank knows
            self.saved_step = run.step

    def save(self, rng):
        """Write the run's checkpoint (rank 0), Ctrl-C waiting for its end. A failed write: checkpoint.CheckpointError
        naming the cause, the previous checkpoint kept."""
        run = self.run
        with deferred_interrupt():
            checkpoint.save_checkpoint(self.ckpt_path, run.raw_model, asdict(run.model_cfg), self.cfg, run.step,
                                       run.best_val, rng, os.path.join(self.cfg['data_dir'], self.meta['tokenizer']),
                                       self.meta['tokenizer_sha256'], run.optimizers, self.tokens_seen())
            self.saved_step = run.step

    def train(self, loss, lr, steps, clock):
        """Every log_interval steps: the loss (the mean over ranks under DDP), ms/step, tokens/s and MFU of
        the `steps` steps since the last line -> the console line and a 'train' event."""
        cfg, env, step = self.cfg, self.env, self.run.step
        if env.ddp:                                        # the mean over ranks, not rank 0's alone
            loss = loss.reshape(1).float()
            dist.all_reduce(loss)
            loss = loss / env.world
        ms = 1000 * clock.interval / steps
        tok_s = tokens_per_step(cfg, env) / (ms / 1000)
        rec = {'event': 'train', 'step': step, 'tokens': self.tokens_seen(), 'loss': loss.item(), 'lr': lr,
               'ms_per_step': ms, 'tokens_per_s': tok_s,
               'mfu': self.run.flops * tok_s / env.world / self.peak}
        if self.intervals_logged:          # the first interval holds the warm-up (compilation, allocator, autotune)
            self.steady_steps, self.steady_seconds = self.steady_steps + steps, self.steady_seconds + clock.interval
        self.intervals_logged += 1
        self.say(f'step {step:5d}/{cfg["max_iters"]} | loss {rec["loss"]:.4f} | lr {lr:.2e} | {ms:.1f} ms/step | '
                 f'{tok_s:,.0f} tok/s | MFU {machine.fmt_mfu(rec["mfu"])} | '
                 f'ETA {clock.eta(step - self.start_step, cfg["max_iters"] - step)}', flush=True)
        self.write(rec)

    def tokens_seen(self):
        """Tokens trained on at the current step, over every process: the checkpoint's count, then this
        session's steps at its own batch (after a resume with another batch_size, each step counts the batch
        it ran with)."""
        return self.start_tokens + (self.run.step - self.start_step) * tokens_per_step(self.cfg, self.env)

    def threads(self, change):
        """A change of the CPU's threads (machine.ThreadChoice.stepped's) -> its line and a 'threads' event."""
        tok = tokens_per_step(self.cfg, self.env)
        rates = [None if r is None else r * tok for r in (change['rate_from'], change['rate'])]
        self.say(f'step {self.run.step:5d}/{self.cfg["max_iters"]} | threads {change["from"]} -> {change["threads"]}: '
                 + ' -> '.join('?' if r is None else f'{r / 1e3:.1f}k' for r in rates) + ' tokens/s', flush=True)
        self.write({'event': 'threads', 'step': self.run.step, 'threads': change['threads'], 'from': change['from'],
                    'tokens_per_s': rates[1], 'tokens_per_s_from': rates[0]})

    def summary(self, clock, t_wall, train_tokens):
        """The 'summary' event and line (rank 0): final and best validation loss (nats/token, bits per byte),
        steps, tokens and epochs (of train_tokens, the training split's length), wall and training time;
        tokens/s and MFU over the whole training time (tokens_per_s, mfu) and steady (steady_tokens_per_s,
        steady_mfu: the logged intervals after the first, whose warm-up, e.g. torch.compile's, they leave out,
        as nanoGPT's running MFU does; None before a second interval); on CUDA the peak memory the run's
        tensors took (peak_memory_gib, torch.cuda.max_memory_allocated, GiB)."""
        cfg, env, run = self.cfg, self.env, self.run
        ev, tokens_seen = self.last_ev, self.tokens_seen()      # the loop evaluated the last step
        tok_s = (run.step - self.start_step) * tokens_per_step(cfg, env) / clock.total if clock.total > 0 else 0.0
        steady = self.steady_steps * tokens_per_step(cfg, env) / self.steady_seconds if self.steady_seconds > 0 else None
        mfu_of = lambda t: None if t is None else run.flops * t / env.world / self.peak      # noqa: E731
        summary = {'event': 'summary', 'final_val_loss': ev['val_loss'], 'final_val_bpb': ev['val_bpb'],
                   'final_val_acc': ev['val_acc'], 'best_val_loss': run.best_val, 'step': run.step,
                   'tokens_seen': tokens_seen, 'epochs': tokens_seen / train_tokens,
                   'train_seconds': clock.total, 'wall_seconds': time.perf_counter() - t_wall,
                   'tokens_per_s': tok_s, 'mfu': mfu_of(tok_s), 'steady_tokens_per_s': steady,
                   'steady_mfu': mfu_of(steady),
                   'peak_memory_gib': torch.cuda.max_memory_allocated(env.dev) / 2 ** 30 if env.cuda else None,
                   **({'final_train_windows_loss': ev['train_windows_loss']} if cfg['eval_train'] else {})}
        self.write(summary)
        speed = (f'steady {steady:,.0f} tok/s, MFU {machine.fmt_mfu(summary["steady_mfu"])} (logged steps after the '
                 f'first interval); ' if steady else '')
        speed += f'whole run {tok_s:,.0f} tok/s, MFU {machine.fmt_mfu(summary["mfu"])}'
        memory = f' | peak GPU memory {summary["peak_memory_gib"]:.1f} GiB' if env.cuda else ''
        print(f'summary: final val loss {summary["final_val_loss"]:.4f} nats/token '
              f'({summary["final_val_bpb"]:.4f} bits/byte, acc {summary["final_val_acc"]:.3f}), '
              f'best {run.best_val:.4f} | {run.step} steps, {tokens_seen:,} tokens = {summary["epochs"]:.2f} epochs | '
              f'wall {machine.hms(summary["wall_seconds"])}, training {machine.hms(clock.total)} | {speed}{memory} | '
              f'checkpoint {self.ckpt_path if self.saved_step is not None else "none"}', flush=True)

    def stopped(self, what, code):
        """Print the line a stopped run ends with on stderr (what happened, the step reached, what the
        checkpoint holds and how to go on) -> `code`, its exit status."""
        held = (f'{self.ckpt_path} holds step {self.saved_step}; resume: python train.py --init_from=resume '
                f'--out_dir={self.cfg["out_dir"]}' if self.saved_step is not None else 'no checkpoint was written')
        print(f'train.py: {what} at step {self.run.step}; {held}', file=sys.stderr)
        return code


if __name__ == '__main__':
    from harness.cli import fail
    fail("train.py's record of a run, not a command: python train.py --help", 'harness/record.py')
