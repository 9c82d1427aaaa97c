"""Train any model kind of mixer.py on prepared token files (a nanoGPT-style loop).

    python train.py config/tinystories_cpu.py --variant=toeplitz --max_iters=500
    torchrun --standalone --nproc_per_node=2 train.py config/tinystories_cpu.py
    python train.py config/tinystories_cpu.py --init_from=resume     # continue out_dir/ckpt.pt

Settings are the module-level defaults below; a config file (plain Python
assignments) and then --key=value arguments override them (harness/configurator.py).
`--variant=NAME` applies mixer.VARIANTS[NAME] on top of the defaults, below anything
set explicitly. Unknown keys, wrong types and values out of range are an error.
`python train.py --help` lists every setting. The optimisers and the schedule: harness/optim.py.
"""

import contextlib
import gc
import json
import math
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass, fields
from types import SimpleNamespace

from harness.cli import begin, deferred_interrupt, fail, run_command
begin('train.py', __name__, keep=True)     # first: Ctrl-C is one line from here; a closed stdout never stops the run

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from harness import checkpoint
from harness import configurator
from harness import machine
import mixer
from harness import optim
from harness.trackers import open_trackers

# ----------------------------------------------------------------------------- defaults
# I/O
out_dir = 'out'                 # checkpoint ckpt.pt and log.jsonl go here
data_dir = 'data/tinystories'   # train.bin, val.bin, meta.json, tokenizer from data/prepare.py
init_from = 'scratch'           # 'scratch' or 'resume' (from out_dir/ckpt.pt, with its saved settings)
overwrite = False               # a 'scratch' run may replace an out_dir that holds ckpt.pt / log.jsonl
variant = 'flat'                # a name in mixer.VARIANTS
task = 'lm'                     # 'lm' (next token) or 'autoencode'
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
# evaluation and logging
eval_interval = 250
eval_windows = 64               # fixed, evenly spaced validation windows
eval_train = False              # also the same number of fixed windows of train.bin (the generalisation gap)
log_interval = 10
save_checkpoint = True
log_to = ''                     # also to trackers: 'tensorboard,trackio,wandb' (harness/trackers.py)
run_name = None                 # their run's name (None: out_dir's last folder)
project = None                  # their project (None: data_dir's last folder)
# system
device = 'auto'                 # 'auto', 'cpu', 'cuda', 'cuda:1', ...
dtype = 'auto'                  # 'auto' (bf16 on CUDA, fp32 on CPU), 'float32', 'bfloat16'
compile = False                 # torch.compile the model
ddp_timeout = 300               # seconds a DDP rank waits for the others in a collective before the run stops
# model: mixer.ModelConfig's fields and defaults (vocab_size is meta.json's, task is above; test_train checks)
n_ctx = 256                     # tokens a window; position-indexed weights have n_ctx rows
d_model = 256                   # the residual stream's width
n_layer = 4
n_head = 1                      # mixer: 1 is the papers' flat mixer; > 1 adds Linear(d, d) in and out
kind = 'mixer'                  # mixer.KINDS: 'mixer', 'transformer' (llama-style), 'gpt' (GPT-2-style), ...
token_mixing = 'flat'           # the masked token mixing of 'mixer' and 'hybrid': mixer.TOKEN_MIXINGS
expansion = 1                   # > 1: the expanded mixer (two masked mixings, GELU between)
kernel = 1                      # > 1: the convolutional mixer (k taps over the feature axis)
recurrent_form = 'mixed'        # the recurrent mixing's heads: 'column', 'row' or 'mixed' (alternating)
norm = True                     # norm=False with activation='none' is the linear mixer
activation = 'gelu'
posenc = False                  # learned absolute positions
attention = 'sdpa'              # 'sdpa' (fused) or 'naive' (the T x T scores materialised; same outputs)
embed_linear = False            # a Linear(d, d) after the embedding
ff_mult = 4                     # the feed-forward's width d_ff, in d_model
tie_embeddings = True
dropout = 0.0
fft_threshold = None            # speed only, never results: None takes machine.DEVICE_TUNING's for the device,
chunk_size = None               # and both may change on resume
hybrid = 'serial'               # 'serial': Mix(Attn(z)); 'parallel': Attn(z) + Mix(z)
mixing_init = 'average'         # the Toeplitz mixing's start: 'average' (a moving average) or 'normal'
block_order = 'mix_ff'          # or 'ff_mix': each block's feed-forward before its token mixing
final_norm = True               # False: no norm before the head
init = 'gpt2'                   # or 'kaiming': Linear weights N(0, 2 / fan_in), no depth scaling
# -----------------------------------------------------------------------------
MODEL_KEYS = [f.name for f in fields(mixer.ModelConfig) if f.name not in ('vocab_size', 'task')]
TUNING_KEYS = ('fft_threshold', 'chunk_size')
DEFAULTS = configurator.collect_defaults(globals(), skip=('MODEL_KEYS', 'TUNING_KEYS'))


# ----------------------------------------------------------------------------- data and evaluation

def load_tokens(path, vocab_size=None, dtype='uint16'):
    """Token ids of one split, memory-mapped (numpy [N], `dtype`: 'uint16', or 'uint32' for a vocabulary over
    65,536, as meta.json's "dtype" says). A missing or empty file, one whose size is not a whole number of ids,
    or ids at or above vocab_size (the data's tokenizer is not the one meta.json names): one line, exit 2."""
    if not os.path.isfile(path):
        fail(f'{path} not found: run data/prepare.py first (or set --data_dir)')
    size, width = os.path.getsize(path), np.dtype(dtype).itemsize
    if size == 0 or size % width:
        fail(f'{path} holds {size} bytes: not a token file of {dtype} ids (run data/prepare.py again)')
    data = np.memmap(path, dtype=dtype, mode='r')
    if vocab_size is not None and int(data.max()) >= vocab_size:
        fail(f'{path} holds token id {int(data.max())}, but the vocabulary has {vocab_size} tokens '
             '(meta.json and the token files are from different runs of data/prepare.py)')
    return data


def load_data(cfg):
    """meta.json and the two token files of cfg['data_dir'] -> (meta dict, train [N], val [M]: uint16, or
    uint32 where meta.json's "dtype" says so); a missing or damaged file, or too short a split: one line, exit 2."""
    meta_path = os.path.join(cfg['data_dir'], 'meta.json')
    if not os.path.isfile(meta_path):
        fail(f'{meta_path} not found: run data/prepare.py first (or set --data_dir)')
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        meta['vocab_size'], meta['val']['bytes_per_token'], meta['tokenizer_sha256']
        if meta.get('dtype', 'uint16') not in ('uint16', 'uint32'):
            raise ValueError(f'dtype {meta["dtype"]!r} is not uint16 or uint32')
    except (ValueError, KeyError, TypeError) as e:
        fail(f'{meta_path} is damaged ({type(e).__name__}: {e}); run data/prepare.py again')
    train_data, val_data = (load_tokens(os.path.join(cfg['data_dir'], f'{s}.bin'), meta['vocab_size'],
                                        meta.get('dtype', 'uint16')) for s in ('train', 'val'))
    if min(len(train_data), len(val_data)) < cfg['n_ctx'] + 2:
        fail(f'token files are shorter than n_ctx + 2 = {cfg["n_ctx"] + 2} tokens')
    return meta, train_data, val_data


def draw_windows(gen, n_tokens, n_ctx, batch_size, grad_accum, world):
    """Start positions of one optimiser step's windows for every rank and micro-step: long [world,
    grad_accum, batch_size], uniform over the n_tokens - n_ctx - 1 starts. Every rank holds the same
    generator and takes its own row, so the windows of a step depend on the global batch alone: 2 ranks x
    batch 4 draw exactly what one process with batch 8, or batch 4 and grad_accum 2, draws."""
    n = world * grad_accum * batch_size
    return torch.randint(n_tokens - n_ctx - 1, (n,), generator=gen).view(world, grad_accum, batch_size)


def get_batch(data, starts, n_ctx, task, dev):
    """Windows of n_ctx + 1 tokens at `starts` -> (x, y) long [B, n_ctx]; y is x shifted
    by one for 'lm' and x itself for 'autoencode'."""
    w = torch.from_numpy(np.stack([data[s:s + n_ctx + 1].astype(np.int64) for s in starts.tolist()]))
    if str(dev).startswith('cuda'):                    # page-locked, one asynchronous copy
        w = w.pin_memory().to(dev, non_blocking=True)
    return w[:, :-1], (w[:, 1:] if task == 'lm' else w[:, :-1])


@torch.no_grad()
def evaluate(model, data, cfg, dev, autocast, bytes_per_token, split='val'):
    """Mean loss (nats/token), bits per byte and token accuracy on eval_windows fixed,
    evenly spaced windows of data -> {split_loss, split_bpb, split_acc}."""
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


def evaluate_splits(model, train_data, val_data, cfg, dev, autocast, bytes_per_token):
    """evaluate() on the validation windows and, with eval_train, on fixed training windows
    (keys train_windows_loss, _bpb, _acc: the loss on seen text beside the unseen)."""
    ev = evaluate(model, val_data, cfg, dev, autocast, bytes_per_token)
    if cfg['eval_train']:
        ev.update(evaluate(model, train_data, cfg, dev, autocast, bytes_per_token, split='train_windows'))
    return ev


# ----------------------------------------------------------------------------- one step

def train_step(model, optimizers, data, starts, lr, cfg, env):
    """One optimiser step over the windows at starts long [grad_accum, batch_size]
    -> mean training loss, a 0-d tensor (not synchronised: no .item() per step).
    Under DDP, gradients are all-reduced on the last micro-step only (no_sync)."""
    for _, opt in optimizers:
        for group in opt.param_groups:
            group['lr'] = lr * group.get('lr_mult', 1.0)      # checkpoints from before lr_mult: 1
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


# ----------------------------------------------------------------------------- the run: its state, stopping, the log

@dataclass(slots=True)
class Run:
    """Everything a run holds. build_run makes it; main adds the data and the run folder's files, log_start
    the peak; the loop and the logging functions advance the step, the evaluations and the speed counters."""
    cfg: dict                       # the resolved settings (DEFAULTS' keys)
    env: SimpleNamespace            # machine.setup_device's: dev, cuda, ddp, rank, world, master, dtype, autocast
    meta: dict                      # the data's meta.json (vocab_size, val bytes_per_token, tokenizer)
    model_cfg: mixer.ModelConfig    # the model's hyper-parameters: the settings', vocab_size meta.json's
    raw_model: torch.nn.Module      # the model, on env.dev: what is evaluated and saved
    model: torch.nn.Module          # what the loop steps: raw_model under DDP and torch.compile (wrap_model)
    optimizers: list                # [(checkpoint key, torch.optim.Optimizer)] (optim.build_optimizers)
    batch_gen: torch.Generator      # draws the training windows; the same on every rank (draw_windows)
    flops: float                    # training FLOPs a token (forward + backward), machine.flops_per_token
    step: int                       # optimiser steps taken
    start_step: int                 # the step this process started at: 0, or the checkpoint's
    best_val: float                 # the lowest validation loss so far, nats/token
    saved_step: int | None          # the step ckpt.pt holds (None before the first save)
    train_data: np.ndarray = None   # uint16 token ids [N], memory-mapped (load_data, in main)
    val_data: np.ndarray = None     # likewise [M]
    last_ev: dict | None = None     # the latest evaluation: {'step', 'val_loss', 'val_bpb', 'val_acc', ...}
    ckpt_path: str | None = None    # out_dir/ckpt.pt (main, once out_dir is prepared)
    log: object = None              # log.jsonl, a binary file open for appending (likewise; rank 0 only)
    trackers: object = None         # harness/trackers.Trackers: every log record also goes there (rank 0 only)
    peak: float | None = None       # the FLOP/s MFU is measured against (log_start)
    intervals_logged: int = 0       # log_train's lines so far
    steady_steps: int = 0           # optimiser steps in the logged intervals after the first (steady speed)
    steady_seconds: float = 0.0     # their training time, seconds


class Stop(Exception):
    """Ends a run early with a one-line message (train.main prints it and exits 1)."""


def agree_to_stop(run, reason=None):
    """Stop every rank together: each rank's reason to stop (None: none) is shared, so a NaN on one
    rank never leaves the others waiting in a collective. Raises Stop naming each reason."""
    if run.env.ddp:
        flag = torch.tensor([float(reason is not None)], device=run.env.dev)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            reasons = [None] * run.env.world
            dist.all_gather_object(reasons, reason)
            reason = '; '.join(f'rank {r}: {m}' for r, m in enumerate(reasons) if m)
    if reason is not None:
        raise Stop(reason)


def check_finite(run, pending):
    """Check the pending (step, loss tensor) pairs with one device sync, then clear them; a
    non-finite loss on any rank stops every rank (agree_to_stop)."""
    reason = None
    if pending:
        losses = torch.stack([l for _, l in pending]).float().cpu()
        bad = (~torch.isfinite(losses)).nonzero()
        if len(bad):
            reason = f'non-finite train loss {losses[bad[0, 0]].item()} at step {pending[bad[0, 0]][0]}'
        pending.clear()
    agree_to_stop(run, reason)


def wrap_model(raw_model, cfg, env):
    """The model the loop steps: DDP first, then torch.compile, so that the compiled graph is split
    at DDP's buckets and gradient all-reduces overlap the backward pass (compile before DDP would run
    them all after it). broadcast_buffers=False: the models' buffers are constants (masks, RoPE
    tables), identical on every rank, so re-sending them from rank 0 every step is wasted."""
    model = raw_model
    if env.ddp:
        with warnings.catch_warnings():          # torch 2.13 deprecates the argument, but it is still the one
            warnings.filterwarnings('ignore', message='`broadcast_buffers` is deprecated', category=FutureWarning)
            model = DDP(model, device_ids=[env.local] if env.cuda else None, broadcast_buffers=False)
    return torch.compile(model) if cfg['compile'] else model


def build_run(cfg, ckpt, env, meta):
    """The model, its optimisers and the window generator of the settings -> Run (a resumed run gets its
    saved states). A model config the settings make invalid, a model whose parameters (counted on the meta
    device) need more than the device's memory, or a tokenizer other than the checkpoint's: one line, exit 2;
    a saved optimiser state that does not fit: checkpoint.CheckpointError."""
    tuned = {k: cfg[k] if cfg[k] is not None else machine.DEVICE_TUNING[env.dev.split(':')[0]][k]
             for k in TUNING_KEYS}
    try:
        model_cfg = mixer.ModelConfig(vocab_size=meta['vocab_size'], task=cfg['task'],
                                      **{**{k: cfg[k] for k in MODEL_KEYS}, **tuned})
    except (ValueError, TypeError) as e:
        fail(str(e))
    with torch.device('meta'):                               # counted without memory: 16 bytes a parameter for
        n = mixer.build_model(model_cfg).num_params()        # its float32 weight, gradient and two Adam moments
    if why := machine.memory_error(16 * n, env.dev, f'training the model of {n:,} parameters'):
        fail(why)
    if ckpt is not None and ckpt.get('tokenizer', {}).get('sha256') != meta['tokenizer_sha256']:
        fail(f'the data in {cfg["data_dir"]} was encoded with another tokenizer (sha256 '
             f'{meta["tokenizer_sha256"][:12]}...) than the checkpoint\'s ({ckpt.get("tokenizer", {}).get("sha256", "?")[:12]}'
             '...): its token ids mean other text; prepare the data with the checkpoint\'s tokenizer')
    torch.manual_seed(cfg['seed'] + env.rank)
    raw_model = mixer.build_model(model_cfg).to(env.dev)
    optimizers = optim.build_optimizers(raw_model, cfg, env.cuda)
    batch_gen = torch.Generator().manual_seed(cfg['seed'])      # the same on every rank: see draw_windows
    step, best_val = 0, float('inf')
    if ckpt is not None:
        step, best_val = checkpoint.restore(ckpt, raw_model, optimizers, batch_gen, env)
        if env.master:
            print(f'resumed from {os.path.join(cfg["out_dir"], "ckpt.pt")} at step {step}')
    return Run(cfg, env, meta, model_cfg, raw_model, wrap_model(raw_model, cfg, env), optimizers, batch_gen,
               flops=machine.flops_per_token(raw_model, cfg['n_ctx']), step=step, start_step=step,
               best_val=best_val, saved_step=step if ckpt is not None else None)


def save(run, rng):
    """Write the run's checkpoint (rank 0). A failed write: checkpoint.CheckpointError naming the cause, the
    previous checkpoint kept."""
    with deferred_interrupt():
        checkpoint.save_checkpoint(run.ckpt_path, run.raw_model, asdict(run.model_cfg), run.cfg, run.step,
                                   run.best_val, rng, os.path.join(run.cfg['data_dir'], run.meta['tokenizer']),
                                   run.meta['tokenizer_sha256'], run.optimizers)
        run.saved_step = run.step


def write_log(run, rec):
    """Append one record to the log (rank 0; others have none). A failed write: Stop naming it."""
    if run.log:
        try:
            checkpoint.append_log(run.log, rec)
        except OSError as e:
            raise Stop(f'could not write {run.log.name} ({checkpoint.write_error(e, run.log.name)})') from None
    if run.trackers:
        run.trackers.log(rec)


def tokens_per_step(cfg, env):
    """Tokens of one optimiser step over all processes."""
    return cfg['batch_size'] * cfg['n_ctx'] * cfg['grad_accum'] * env.world


def log_start(run, ckpt):
    """The run's header: the 'config' and 'schedule' events and the console lines naming the
    model, the processes, the peak MFU is measured against and the schedule. Sets run.peak (FLOP/s:
    the device's nominal peak, or a matmul measured for about a second)."""
    cfg, env = run.cfg, run.env
    say = print if env.master else (lambda *a, **k: None)
    run.peak, peak_name = machine.peak_flops(env.dev, getattr(torch, env.dtype))
    n_params = run.raw_model.num_params()
    write_log(run, {'event': 'config', 'config': cfg, 'model_config': asdict(run.model_cfg), 'world_size': env.world,
                    'device': env.dev, 'dtype': env.dtype, 'params': n_params, 'flops_per_token': run.flops,
                    'peak_flops': run.peak, 'peak': peak_name, 'meta': run.meta})
    say(f'{cfg["variant"]} ({run.model_cfg.kind}, token_mixing={run.model_cfg.token_mixing}, task={cfg["task"]}): '
        f'{n_params / 1e6:.2f}M params, {run.flops / 1e6:.1f} MFLOP/token (fwd+bwd), '
        f'{env.world} process(es) on {env.dev}, {env.dtype}, {tokens_per_step(cfg, env)} tokens/step')
    say(f'MFU is reported against {peak_name}')
    decay_iters = cfg['lr_decay_iters'] or cfg['max_iters']
    schedule = {'event': 'schedule', 'from_step': run.step, 'max_iters': cfg['max_iters'],
                'warmup_iters': cfg['warmup_iters'], 'learning_rate': cfg['learning_rate'], 'min_lr': cfg['min_lr'],
                'lr_decay_iters': decay_iters, 'lr_now': optim.lr_at(run.step, cfg)}
    if ckpt is not None:
        schedule['lr_saved_schedule'] = optim.lr_at(run.step, {**cfg, **{k: ckpt['config'].get(k, cfg[k]) for k in (
            'learning_rate', 'min_lr', 'warmup_iters', 'lr_decay_iters', 'max_iters')}})
    write_log(run, schedule)
    say(f'schedule: steps {run.step} -> {cfg["max_iters"]}; lr warm-up {cfg["warmup_iters"]} steps to '
        f'{cfg["learning_rate"]:.2e}, cosine to {cfg["min_lr"]:.2e} at step {decay_iters}; lr now '
        f'{schedule["lr_now"]:.2e}' + (f' (the saved run\'s schedule: {schedule["lr_saved_schedule"]:.2e})'
                                       if ckpt is not None else ''))


def evaluate_and_save(run, clock):
    """At an evaluation step: rank 0 evaluates (loss in nats/token, bits per byte, accuracy), prints
    and logs it, and saves the checkpoint; every rank agrees to stop on a non-finite loss."""
    cfg, env = run.cfg, run.env
    rng, reason = checkpoint.gather_rng(run.batch_gen, env), None
    if env.master:
        ev = evaluate_splits(run.raw_model, run.train_data, run.val_data, cfg, env.dev, env.autocast,
                             run.meta['val']['bytes_per_token'])
        if math.isfinite(ev['val_loss']):
            run.best_val, run.last_ev = min(run.best_val, ev['val_loss']), {'step': run.step, **ev}
            print(f'step {run.step:5d}/{cfg["max_iters"]} | val loss {ev["val_loss"]:.4f} nats/token | '
                  f'{ev["val_bpb"]:.4f} bits/byte | acc {ev["val_acc"]:.3f} | '
                  + (f'train windows {ev["train_windows_loss"]:.4f} | ' if cfg['eval_train'] else '') +
                  f'ETA {clock.eta(run.step - run.start_step, cfg["max_iters"] - run.step)}', flush=True)
            write_log(run, {'event': 'eval', 'step': run.step, **ev})
            if cfg['save_checkpoint'] and run.step > 0:
                try:
                    save(run, rng)
                except checkpoint.CheckpointError as e:     # every rank stops, not rank 0 alone
                    reason = str(e)
        else:
            reason = f'non-finite val loss {ev["val_loss"]} at step {run.step}'
    agree_to_stop(run, reason)
    if cfg['save_checkpoint'] and run.step > 0:     # rank 0 saved (else agree_to_stop raised): every rank knows
        run.saved_step = run.step


def log_train(run, loss, lr, steps, clock):
    """Every log_interval steps: the loss (the mean over ranks under DDP), ms/step,
    tokens/s and MFU since the last line -> the console line and a 'train' event."""
    cfg, env = run.cfg, run.env
    if env.ddp:                                        # the mean over ranks, not rank 0's alone
        loss = loss.reshape(1).float()
        dist.all_reduce(loss)
        loss = loss / env.world
    ms = 1000 * clock.interval / steps
    tok_s = tokens_per_step(cfg, env) / (ms / 1000)
    rec = {'event': 'train', 'step': run.step, 'loss': loss.item(), 'lr': lr, 'ms_per_step': ms,
           'tokens_per_s': tok_s, 'mfu': run.flops * tok_s / env.world / run.peak}
    if run.intervals_logged:           # the first interval holds the warm-up (compilation, allocator, autotune)
        run.steady_steps, run.steady_seconds = run.steady_steps + steps, run.steady_seconds + clock.interval
    run.intervals_logged += 1
    if env.master:
        print(f'step {run.step:5d}/{cfg["max_iters"]} | loss {rec["loss"]:.4f} | lr {lr:.2e} | {ms:.1f} ms/step | '
              f'{tok_s:,.0f} tok/s | MFU {machine.fmt_mfu(rec["mfu"])} | '
              f'ETA {clock.eta(run.step - run.start_step, cfg["max_iters"] - run.step)}', flush=True)
    write_log(run, rec)


def log_summary(run, clock, t_wall):
    """The 'summary' event and line: final and best validation loss (nats/token, bits per byte), steps,
    tokens and epochs, wall and training time; tokens/s and MFU over the whole training time (tokens_per_s,
    mfu) and steady (steady_tokens_per_s, steady_mfu: the logged intervals after the first, whose warm-up,
    e.g. torch.compile's, they leave out, as nanoGPT's running MFU does; None before a second interval); on
    CUDA the peak memory the run's tensors took (peak_memory_gib, torch.cuda.max_memory_allocated, GiB)."""
    cfg, env, step = run.cfg, run.env, run.step
    ev, tokens_seen = run.last_ev, step * tokens_per_step(cfg, env)      # train() evaluated the last step
    tok_s = (step - run.start_step) * tokens_per_step(cfg, env) / clock.total if clock.total > 0 else 0.0
    steady = run.steady_steps * tokens_per_step(cfg, env) / run.steady_seconds if run.steady_seconds > 0 else None
    mfu_of = lambda t: None if t is None else run.flops * t / env.world / run.peak      # noqa: E731
    summary = {'event': 'summary', 'final_val_loss': ev['val_loss'], 'final_val_bpb': ev['val_bpb'],
               'final_val_acc': ev['val_acc'], 'best_val_loss': run.best_val, 'step': step,
               'tokens_seen': tokens_seen, 'epochs': tokens_seen / len(run.train_data),
               'train_seconds': clock.total, 'wall_seconds': time.perf_counter() - t_wall,
               'tokens_per_s': tok_s, 'mfu': mfu_of(tok_s), 'steady_tokens_per_s': steady,
               'steady_mfu': mfu_of(steady),
               'peak_memory_gib': torch.cuda.max_memory_allocated(env.dev) / 2 ** 30 if env.cuda else None,
               **({'final_train_windows_loss': ev['train_windows_loss']} if cfg['eval_train'] else {})}
    write_log(run, summary)
    speed = (f'steady {steady:,.0f} tok/s, MFU {machine.fmt_mfu(summary["steady_mfu"])} (logged steps after the '
             f'first interval); ' if steady else '') + f'whole run {tok_s:,.0f} tok/s, MFU {machine.fmt_mfu(summary["mfu"])}'
    memory = f' | peak GPU memory {summary["peak_memory_gib"]:.1f} GiB' if env.cuda else ''
    print(f'summary: final val loss {summary["final_val_loss"]:.4f} nats/token '
          f'({summary["final_val_bpb"]:.4f} bits/byte, acc {summary["final_val_acc"]:.3f}), '
          f'best {run.best_val:.4f} | {step} steps, {tokens_seen:,} tokens = {summary["epochs"]:.2f} epochs | '
          f'wall {machine.hms(summary["wall_seconds"])}, training {machine.hms(clock.total)} | {speed}{memory} | '
          f'checkpoint {run.ckpt_path if run.saved_step is not None else "none"}', flush=True)


# ----------------------------------------------------------------------------- main

def train(run, clock):
    """The loop: evaluate (and save) every eval_interval steps and at max_iters, log every
    log_interval steps; run.step advances."""
    cfg, env, max_iters = run.cfg, run.env, run.cfg['max_iters']
    skip_eval = run.saved_step is not None and run.step < max_iters     # the saved step was evaluated
    pending, interval_steps = [], 0                                      # losses not yet checked
    while True:
        if (run.step % cfg['eval_interval'] == 0 or run.step == max_iters) and not skip_eval:
            clock.lap()
            check_finite(run, pending)
            evaluate_and_save(run, clock)
            clock.skip()                                       # evaluation time is not training time
        skip_eval = False
        if run.step >= max_iters:
            return
        lr = optim.lr_at(run.step, cfg)
        starts = draw_windows(run.batch_gen, len(run.train_data), cfg['n_ctx'], cfg['batch_size'],
                              cfg['grad_accum'], env.world)[env.rank]
        loss = train_step(run.model, run.optimizers, run.train_data, starts, lr, cfg, env)
        run.step += 1
        interval_steps += 1
        pending.append((run.step, loss))
        if not env.cuda:
            check_finite(run, pending)                         # cheap on the CPU: every step
        if run.step % cfg['log_interval'] == 0:
            clock.lap()
            check_finite(run, pending)
            log_train(run, loss, lr, interval_steps, clock)
            clock.interval, interval_steps = 0.0, 0


def stopped(run, what, code):
    """Print the line a stopped run ends with on stderr (what happened, the step reached, what the
    checkpoint holds and how to go on) -> `code`, its exit status."""
    held = (f'{run.ckpt_path} holds step {run.saved_step}; resume: python train.py --init_from=resume '
            f'--out_dir={run.cfg["out_dir"]}' if run.saved_step is not None else 'no checkpoint was written')
    print(f'train.py: {what} at step {run.step}; {held}', file=sys.stderr)
    return code


def main(argv):
    """Train with the settings of `argv` (config files and --key=value). Writes out_dir/ckpt.pt
    (harness/checkpoint.py's format) and log.jsonl (events config, schedule, train, eval, summary), under a
    lock on out_dir. Exits 2 on bad settings, data, checkpoint or folder (one line); 1 when the run
    stops early (a non-finite loss on any rank, a failed write, a stalled rank), 130 on Ctrl-C, each
    with one line saying what the checkpoint holds."""
    t_wall = time.perf_counter()
    cfg, ckpt = configurator.resolve_settings(configurator.parse_overrides(argv, DEFAULTS, __doc__),
                                              DEFAULTS, [k for k in MODEL_KEYS if k not in TUNING_KEYS])
    configurator.check_settings(cfg)
    rank = int(os.environ.get('RANK', 0))
    try:
        lock = checkpoint.claim_run_folder(cfg, ckpt, rank)     # rank 0's; out_dir is locked while main runs
        env = machine.setup_device(cfg)
        meta, train_data, val_data = load_data(cfg)
        run = build_run(cfg, ckpt, env, meta)
        run.train_data, run.val_data = train_data, val_data
        if env.master:                 # before prepare_run_folder: it reads the steps a stopped session logged
            run.trackers = open_trackers(cfg, ckpt and ckpt['step'], run.raw_model.num_params(), env.world)
        run.ckpt_path, run.log = checkpoint.prepare_run_folder(cfg, ckpt, rank)
    except checkpoint.CheckpointError as e:
        fail(str(e))
    clock = machine.Clock(env.cuda)
    code = 0
    try:
        log_start(run, ckpt)
        train(run, clock)
        if env.master:
            log_summary(run, clock, t_wall)
    except Stop as e:
        code = stopped(run, f'error: {e}; stopping', 1)
    except KeyboardInterrupt:
        code = stopped(run, 'interrupted (Ctrl-C)', 130)
    except RuntimeError as e:
        what = machine.collective_failure(e, cfg, env) if env.ddp else None
        if what is None:
            raise
        code = stopped(run, f'error: {what}; stopping', 1)
    finally:
        if run.log:
            run.log.close()
        if run.trackers:
            run.trackers.close()
        if lock:                       # out_dir free for the next run (a pool process trains several)
            lock.close()
    if env.ddp:
        if code == 0:
            dist.barrier()             # rank 0 may still be evaluating and saving
        del run                        # DDP sits in reference cycles: freed at interpreter exit, after
        gc.collect()                   # gloo's threads, it aborted about one run in 20 (SIGABRT)
        dist.destroy_process_group()
    if code:
        sys.exit(code)


if __name__ == '__main__':
    sys.exit(run_command('train.py', main, sys.argv[1:]))
