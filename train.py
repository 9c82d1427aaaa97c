"""Train any model of mixer.py on prepared token files: a nanoGPT-style loop, read top to bottom (the
settings, the data, the model and its optimisers, one step and the loop, main).

    python train.py config/tinystories_cpu.py --variant=toeplitz --max_iters=500
    torchrun --standalone --nproc_per_node=2 train.py config/tinystories_cpu.py
    python train.py config/tinystories_cpu.py --init_from=resume     # continue out_dir/ckpt.pt

The settings are the module-level values below and every other field of mixer.ModelConfig; a config file
(plain Python assignments), then --key=value (or --key value) arguments override them, checked by
harness/configurator.py; --variant=NAME applies mixer.VARIANTS[NAME] below anything set explicitly.
What keeps a run safe (its folder's lock, Ctrl-C, every rank stopping together, the log) is in harness/.
"""

import contextlib
import math
import os
import sys
import time
import warnings
from dataclasses import asdict
from datetime import timedelta
from types import SimpleNamespace

from harness.cli import begin, fail, run_command
begin('train.py', __name__, keep=True)     # first: Ctrl-C is one line from here; a closed stdout: no stop

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import mixer
from harness import checkpoint, configurator, machine, optim
from data.tokens import read_prepared
from harness.record import RunLog, Stop, StopRequests, stop_together, stopped_line

# ----------------------------------------------------------------------------- settings
# the model (every other field of mixer.ModelConfig is a setting too: python train.py --help)
variant = 'flat'                # a name in mixer.VARIANTS: the fields it sets, below anything set here
n_ctx = 256                     # tokens per window: the token-mixing matrices have n_ctx rows
d_model = 256                   # width of the residual stream
n_layer = 4                     # blocks
n_head = 1                      # heads of the sequence mixing (the papers' flat mixer: 1)
# I/O
out_dir = 'out'                 # checkpoint ckpt.pt and log.jsonl go here
data_dir = 'data/tinystories'   # train.bin, val.bin, meta.json, tokenizer from data/prepare.py
init_from = 'scratch'           # 'scratch' or 'resume' (from out_dir/ckpt.pt, with its saved settings)
overwrite = False               # a 'scratch' run may replace an out_dir that holds ckpt.pt / log.jsonl
seed = 1337
# optimisation
batch_size = 16                 # windows per micro-step per process
grad_accum = 1                  # micro-steps per optimiser step
optimizer = 'adamw'             # 'adamw', or 'muon': torch.optim.Muon for the blocks' 2-D Linear weights
max_iters = 1000
learning_rate = 2e-3
min_lr = 2e-4                   # cosine decay floor
warmup_iters = 50
lr_decay_iters = None           # None: max_iters
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0                 # 0: off
mixing_lr_mult = 1.0            # learning rate multiplier for the token-mixing matrices (W, c)
mixing_weight_decay = None      # weight decay of the token-mixing matrices alone (None: weight_decay)
# evaluation, checkpoints and logging
eval_interval = 250
eval_windows = 64               # fixed, evenly spaced validation windows
eval_train = False              # also the same number of fixed windows of train.bin (the generalisation gap)
save_checkpoint = True          # at every evaluation, every save_interval steps and when the run is stopped
save_interval = 250             # also a checkpoint every this many steps (0: only at evaluations and stops)
log_interval = 10
log_to = ''                     # also to trackers: 'tensorboard,trackio,wandb' (harness/trackers.py)
run_name = None                 # their run's name (None: out_dir's last folder)
project = None                  # their project (None: data_dir's last folder)
# system
device = 'auto'                 # 'auto', 'cpu', 'cuda', 'cuda:1', ...
dtype = 'auto'                  # 'float32', 'bfloat16'; 'auto': bf16 on CUDA, on a CPU the faster, measured
compile = False                 # torch.compile the model
threads = None                  # torch's CPU threads; None: chosen by measuring as the load moves
ddp_timeout = 300               # seconds a DDP rank waits for the others in a collective before the run stops
DEFAULTS = configurator.collect_defaults(globals())


# ----------------------------------------------------------------------------- data

def draw_windows(gen, n_tokens, n_ctx, batch_size, grad_accum, world):
    """Start positions of one step's windows for every rank and micro-step: long [world, grad_accum,
    batch_size], uniform over the n_tokens - n_ctx - 1 starts. Every rank holds the same generator (a resumed
    one too) and takes its row: 2 ranks x batch 4 draw what 1 process draws with batch 8."""
    n = world * grad_accum * batch_size
    return torch.randint(n_tokens - n_ctx - 1, (n,), generator=gen).view(world, grad_accum, batch_size)


def get_batch(data, starts, n_ctx, task, dev):
    """Windows of n_ctx + 1 tokens of data (token ids, a numpy memmap) at `starts` -> (x, y) long [B, n_ctx];
    y is x shifted by one for 'lm' and x itself for 'autoencode'."""
    w = torch.stack([torch.from_numpy(data[s:s + n_ctx + 1].astype('int64')) for s in starts.tolist()])
    if str(dev).startswith('cuda'):                    # page-locked, one asynchronous copy
        w = w.pin_memory().to(dev, non_blocking=True)
    return w[:, :-1], (w[:, 1:] if task == 'lm' else w[:, :-1])


@torch.no_grad()
def evaluate(model, data, cfg, dev, autocast, bytes_per_token, split='val'):
    """Mean loss (nats/token), bits per byte and token accuracy on eval_windows fixed, evenly spaced windows
    of data -> {split_loss, split_bpb, split_acc}. Bits per byte = nats / ln 2 / the split's UTF-8 bytes per
    token."""
    model.eval()
    n_ctx, B = cfg['n_ctx'], cfg['batch_size']
    starts = torch.linspace(0, len(data) - n_ctx - 2, cfg['eval_windows']).long()
    nats, correct, count = 0.0, 0, 0
    for i in range(0, len(starts), B):
        x, y = get_batch(data, starts[i:i + B], n_ctx, cfg['task'], dev)
        with autocast:
            logits, loss = model(x, y)
        nats += loss.item() * y.numel()
        correct += (logits.argmax(-1) == y).sum().item()
        count += y.numel()
    model.train()
    loss = nats / count
    return {f'{split}_loss': loss, f'{split}_bpb': loss / math.log(2) / bytes_per_token,
            f'{split}_acc': correct / count}


def evaluate_splits(model, train_data, val_data, cfg, dev, autocast, meta):
    """evaluate() on the validation windows and, with eval_train, on fixed training windows (keys
    train_windows_loss, _bpb, _acc: the loss on seen text beside the unseen), each split's bits per byte by
    its own bytes per token (meta: the data's meta.json)."""
    ev = evaluate(model, val_data, cfg, dev, autocast, meta['val']['bytes_per_token'])
    if cfg['eval_train']:
        ev.update(evaluate(model, train_data, cfg, dev, autocast, meta['train']['bytes_per_token'],
                           split='train_windows'))
    return ev


# ----------------------------------------------------------------------------- the model and its optimisers

def build_run(cfg, ckpt, env, meta):
    """The model, its optimisers and the window generator (a resumed run: their saved states) ->
    SimpleNamespace(model_cfg; raw_model, evaluated and saved; model, what the loop steps: raw_model under
    DDP and torch.compile; optimizers [(checkpoint key, optimizer)]; batch_gen; flops per token; step; tokens
    seen; best_val; last_eval; saved_step: the step ckpt.pt holds, None before a save; ckpt_path). Invalid
    model settings, a model too large for the device or another tokenizer than the checkpoint's: one line,
    exit 2; a saved optimiser state that does not fit: checkpoint.CheckpointError."""
    tuned = machine.device_tuning(env.dev.split(':')[0])            # fft_threshold, chunk_size: speed only
    try:
        model_cfg = mixer.ModelConfig(vocab_size=meta['vocab_size'], task=cfg['task'], **{
            k: tuned[k] if cfg[k] is None and k in tuned else cfg[k] for k in configurator.MODEL_KEYS})
    except (ValueError, TypeError) as e:
        fail(str(e))
    machine.check_memory(model_cfg, env)
    checkpoint.check_tokenizer(ckpt, meta, cfg['data_dir'])
    torch.manual_seed(cfg['seed'] + env.rank)
    raw_model = mixer.build_model(model_cfg).to(env.dev)
    optimizers = optim.build_optimizers(raw_model, cfg, env.cuda)
    batch_gen = torch.Generator().manual_seed(cfg['seed'])      # the same on every rank: see draw_windows
    step, tokens, best_val = 0, 0, float('inf')
    if ckpt is not None:
        step, tokens, best_val = checkpoint.restore(ckpt, raw_model, optimizers, batch_gen, env)
        if env.master:
            print(f'resumed from {os.path.join(cfg["out_dir"], "ckpt.pt")} at step {step}')
    return SimpleNamespace(model_cfg=model_cfg, raw_model=raw_model, model=wrap_model(raw_model, cfg, env),
                           optimizers=optimizers, batch_gen=batch_gen, step=step, tokens=tokens,
                           best_val=best_val, flops=machine.flops_per_token(raw_model, cfg['n_ctx']),
                           last_eval=None, saved_step=step if ckpt is not None else None,
                           ckpt_path=os.path.join(cfg['out_dir'], 'ckpt.pt'))


def wrap_model(raw_model, cfg, env):
    """The model the loop steps: DDP, then torch.compile (its graph split at DDP's buckets, so all-reduces
    overlap the backward pass). broadcast_buffers=False: the buffers (masks, RoPE tables) are constants."""
    model = raw_model
    if env.ddp:
        with warnings.catch_warnings():          # torch 2.13 deprecates the argument, but it is still the one
            warnings.filterwarnings('ignore', '`broadcast_buffers` is deprecated', FutureWarning)
            model = DDP(model, device_ids=[env.local] if env.cuda else None, broadcast_buffers=False)
    return torch.compile(model) if cfg['compile'] else model


def save(run, cfg, env, meta):
    """Write the run's checkpoint (rank 0; every rank gives its RNG states) and record its step; a failed
    write stops every rank together, the previous checkpoint kept (harness/checkpoint.py's format)."""
    rng, reason = checkpoint.gather_rng(run.batch_gen, env), None
    if env.master:
        try:
            config = {**cfg, 'dtype': env.tuning.dtype_setting(cfg['dtype'])}    # a resume trains as this run
            checkpoint.save_checkpoint(run.ckpt_path, run.raw_model, asdict(run.model_cfg), config, run.step,
                                       run.best_val, rng, os.path.join(cfg['data_dir'], meta['tokenizer']),
                                       meta['tokenizer_sha256'], run.optimizers, run.tokens)
            run.saved_step = run.step        # known at once on rank 0: a stalled rank may never answer below
        except checkpoint.CheckpointError as e:
            reason = str(e)
    stop_together(env, reason=reason)
    run.saved_step = run.step


# ----------------------------------------------------------------------------- one step and the loop

def get_lr(step, cfg):
    """The learning rate of optimiser step `step` (nanoGPT's schedule): a linear warm-up to learning_rate over
    warmup_iters steps, then a cosine decay to min_lr at lr_decay_iters (None: max_iters), min_lr after."""
    decay_iters = cfg['lr_decay_iters'] or cfg['max_iters']
    if step < cfg['warmup_iters']:
        return cfg['learning_rate'] * (step + 1) / cfg['warmup_iters']
    if step >= decay_iters:
        return cfg['min_lr']
    ratio = (step - cfg['warmup_iters']) / max(1, decay_iters - cfg['warmup_iters'])
    return cfg['min_lr'] + 0.5 * (1 + math.cos(math.pi * ratio)) * (cfg['learning_rate'] - cfg['min_lr'])


def train_step(model, optimizers, data, starts, cfg, env):
    """One optimiser step over the windows at starts long [grad_accum, batch_size] -> the mean training loss,
    a 0-d tensor (not synchronised: no .item() per step). Under DDP, gradients are all-reduced on the last
    micro-step only (no_sync): the others would send gradients that the last one sends again."""
    loss_sum = 0.0
    for micro, s in enumerate(starts):
        x, y = get_batch(data, s, cfg['n_ctx'], cfg['task'], env.dev)
        sync = not env.ddp or micro == len(starts) - 1
        with (contextlib.nullcontext() if sync else model.no_sync()), env.autocast:
            _, loss = model(x, y)
            (loss / len(starts)).backward()
        loss_sum = loss_sum + loss.detach()
    if cfg['grad_clip'] > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg['grad_clip'])
    for _, opt in optimizers:           # disjoint parameters: one's zero_grad leaves the others' gradients
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss_sum / len(starts)


def train(run, train_data, val_data, meta, log, requests, cfg, env):
    """The loop: evaluate and save every eval_interval steps and at max_iters (a resumed run does not evaluate
    its saved step again), save every save_interval steps, log every log_interval steps, until max_iters.
    Every rank stops together (stop_together: a non-finite loss, Ctrl-C or SIGTERM, a failed save); a stop
    asked by a signal saves the step reached first. -> seconds and tokens of the logged intervals, {'seconds',
    'tokens', 'steady_seconds', 'steady_tokens'} (steady: after the first interval, whose warm-up it leaves
    out)."""
    max_iters, tokens_per = cfg['max_iters'], checkpoint.tokens_per_step(cfg, env.world)
    speed = dict.fromkeys(('seconds', 'tokens', 'steady_seconds', 'steady_tokens'), 0)
    pending, since_log, first_step, peak = [], 0, run.step, env.tuning.peak()[0]  # pending: losses to check
    t_start = t_log = time.perf_counter()
    eta = lambda now: timedelta(seconds=round((now - t_start) / max(1, run.step - first_step)     # noqa: E731
                                              * (max_iters - run.step)))
    while True:
        # evaluate (rank 0), log and save every eval_interval steps and at the end; not training time
        if (run.step % cfg['eval_interval'] == 0 or run.step == max_iters) and run.step != run.saved_step:
            t_eval = time.perf_counter()
            stop_together(env, pending)
            ev = evaluate_splits(run.raw_model, train_data, val_data, cfg, env.dev, env.autocast, meta) \
                if env.master else None
            if ev is not None and math.isfinite(ev['val_loss']):
                run.best_val, run.last_eval = min(run.best_val, ev['val_loss']), {'step': run.step, **ev}
                log.write({'event': 'eval', 'step': run.step, 'tokens': run.tokens, **ev},
                          f'step {run.step:5d}/{max_iters} | val loss {ev["val_loss"]:.4f} nats/token | '
                          f'{ev["val_bpb"]:.4f} bits/byte | acc {ev["val_acc"]:.3f} | '
                          + (f'train windows {ev["train_windows_loss"]:.4f} | ' if cfg['eval_train'] else '')
                          + f'ETA {eta(t_eval) if run.step > first_step else "?"}')
            stop_together(env, reason=None if ev is None or math.isfinite(ev['val_loss']) else
                          f'non-finite val loss {ev["val_loss"]} at step {run.step}')
            if cfg['save_checkpoint'] and run.step > 0:
                save(run, cfg, env, meta)
            t_log += time.perf_counter() - t_eval
        if run.step >= max_iters:
            return speed
        # every rank stops together (a non-finite loss, Ctrl-C or SIGTERM): checked every step on the CPU,
        # on a GPU before each log line and save (one device sync); a stop asked by a signal saves its step
        save_due = cfg['save_checkpoint'] and cfg['save_interval'] and run.step % cfg['save_interval'] == 0 \
            and 0 < run.step != run.saved_step
        if not env.cuda or run.step % cfg['log_interval'] == 0 or save_due:
            try:
                stop_together(env, pending, requests)
            except Stop as stop:
                if stop.code != 1 and cfg['save_checkpoint'] and run.step != run.saved_step:
                    save(run, cfg, env, meta)
                raise
        if save_due:                                               # a checkpoint between evaluations
            t_save = time.perf_counter()
            save(run, cfg, env, meta)
            t_log += time.perf_counter() - t_save
        # one optimiser step at this step's learning rate (the token mixings' own: optim.param_groups)
        lr = get_lr(run.step, cfg)
        for _, opt in run.optimizers:
            for group in opt.param_groups:
                group['lr'] = lr * group['lr_mult']
        starts = draw_windows(run.batch_gen, len(train_data), cfg['n_ctx'], cfg['batch_size'],
                              cfg['grad_accum'], env.world)[env.rank]
        t_step = time.perf_counter()
        loss = train_step(run.model, run.optimizers, train_data, starts, cfg, env)
        run.step, run.tokens, since_log = run.step + 1, run.tokens + tokens_per, since_log + 1
        pending.append((run.step, loss))
        if change := env.tuning.stepped(time.perf_counter() - t_step):     # the CPU's precision and threads
            peak = log.tuned(change, run.step, tokens_per)                   # the peak of the precision now
        # the log line: the loss (the mean over ranks), time per step, tokens/s, MFU against `peak`
        if run.step % cfg['log_interval'] == 0:
            loss = loss.reshape(1).float()
            if env.ddp:
                torch.distributed.all_reduce(loss)
                loss = loss / env.world
            now = time.perf_counter()
            seconds, t_log, tokens = now - t_log, now, since_log * tokens_per
            if speed['seconds']:
                speed['steady_seconds'], speed['steady_tokens'] = speed['steady_seconds'] + seconds, \
                    speed['steady_tokens'] + tokens
            speed['seconds'], speed['tokens'] = speed['seconds'] + seconds, speed['tokens'] + tokens
            ms, tok_s = 1000 * seconds / since_log, tokens / seconds
            mfu = run.flops * tok_s / env.world / peak
            log.write({'event': 'train', 'step': run.step, 'tokens': run.tokens, 'loss': loss.item(),
                       'lr': lr, 'ms_per_step': ms, 'tokens_per_s': tok_s, 'mfu': mfu},
                      f'step {run.step:5d}/{max_iters} | loss {loss.item():.4f} | lr {lr:.2e} | '
                      f'{ms:.1f} ms/step | {tok_s:,.0f} tok/s | MFU {100 * mfu:.1f}% | ETA {eta(now)}')
            since_log = 0


# ----------------------------------------------------------------------------- main

def main(argv):
    """Train with the settings of `argv` (config files and --key=value). Writes out_dir/ckpt.pt
    (harness/checkpoint.py's format) and log.jsonl (events config, schedule, train, eval, summary), under a
    lock on out_dir. Exits 2 on bad settings, data, checkpoint or folder (one line); 1 when the run stops
    early (a non-finite loss on any rank, a failed write, a stalled rank); 130 on Ctrl-C and 143 on SIGTERM,
    after saving the step reached (a second Ctrl-C stops at once); each with one line saying what the
    checkpoint holds."""
    t_wall = time.perf_counter()
    cfg, ckpt = configurator.settings(argv, DEFAULTS, __doc__, sys.modules[__name__])
    try:
        lock = checkpoint.claim_run_folder(cfg, ckpt, int(os.environ.get('RANK', 0)))   # rank 0 locks out_dir
        env = machine.setup_device(cfg)
        meta, train_data, val_data = read_prepared(cfg['data_dir'], cfg['n_ctx'])
        run = build_run(cfg, ckpt, env, meta)
        log = RunLog(cfg, env, ckpt, run.raw_model.num_params())     # log.jsonl, the trackers (rank 0)
    except (checkpoint.CheckpointError, ValueError) as e:
        fail(str(e))
    code = 0
    try:
        log.start(run, ckpt, meta, get_lr)
        with StopRequests() as requests:
            speed = train(run, train_data, val_data, meta, log, requests, cfg, env)
        if env.master:
            log.summary(run, speed, time.perf_counter() - t_wall, len(train_data))
    except Stop as e:
        code = e.code
        stopped_line(e, run, cfg)
    except KeyboardInterrupt:
        code = 130
        stopped_line('interrupted (Ctrl-C)', run, cfg)
    except RuntimeError as e:
        what = machine.collective_failure(e, cfg, env) if env.ddp else None
        if what is None:
            raise
        code = 1
        stopped_line(f'error: {what}; stopping', run, cfg)
    finally:
        log.close()                    # log.jsonl and the trackers
        if lock:                       # out_dir free for the next run (a pool process trains several)
            lock.close()
    if env.ddp:
        del run, log                   # DDP sits in reference cycles: freed before its process group ends
        machine.end_ddp(clean=code == 0)
    if code:
        sys.exit(code)


if __name__ == '__main__':
    sys.exit(run_command('train.py', main, sys.argv[1:]))
