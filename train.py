"""Train any model kind of mixer.py on prepared token files: a nanoGPT-style loop, read top to bottom
(settings, data, model and optimisers, one step, the loop, main).

    python train.py config/tinystories_cpu.py --variant=toeplitz --max_iters=500
    torchrun --standalone --nproc_per_node=2 train.py config/tinystories_cpu.py
    python train.py config/tinystories_cpu.py --init_from=resume     # continue out_dir/ckpt.pt

Settings are the module-level defaults below and mixer.ModelConfig's fields; a config file (plain Python
assignments) and then --key=value arguments override them (harness/configurator.py). `--variant=NAME`
applies mixer.VARIANTS[NAME] on top of the defaults, below anything set explicitly. Unknown keys, wrong
types and values out of range are an error. `python train.py --help` lists every setting. What keeps a
run safe (its folder's lock, its record and checkpoint, every rank stopping together) is harness/'s.
"""

import contextlib
import math
import os
import sys
import time
import warnings
from types import SimpleNamespace

from harness.cli import begin, fail, run_command
begin('train.py', __name__, keep=True)     # first: Ctrl-C is one line from here; a closed stdout never stops the run

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import mixer
from data.outputs import read_prepared
from harness import checkpoint, configurator, machine, optim
from harness.record import Record, Stop, check_finite
from harness.trackers import open_trackers

# ----------------------------------------------------------------------------- settings
# I/O
out_dir = 'out'                 # checkpoint ckpt.pt and log.jsonl go here
data_dir = 'data/tinystories'   # train.bin, val.bin, meta.json, tokenizer from data/prepare.py
init_from = 'scratch'           # 'scratch' or 'resume' (from out_dir/ckpt.pt, with its saved settings)
overwrite = False               # a 'scratch' run may replace an out_dir that holds ckpt.pt / log.jsonl
variant = 'flat'                # a name in mixer.VARIANTS
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
threads = None                  # CPU: torch's threads, None: chosen by measuring as the load moves (machine.ThreadChoice)
ddp_timeout = 300               # seconds a DDP rank waits for the others in a collective before the run stops
# model: every field of mixer.ModelConfig (n_ctx, d_model, n_layer, n_head, kind, token_mixing, task, ...) is a
# setting of its name and default; vocab_size is the data's; fft_threshold and chunk_size (speed only) are the
# device's unless set (machine.DEVICE_TUNING)
DEFAULTS = configurator.collect_defaults(globals())


# ----------------------------------------------------------------------------- data

def draw_windows(gen, n_tokens, n_ctx, batch_size, grad_accum, world):
    """Start positions of one optimiser step's windows for every rank and micro-step: long [world,
    grad_accum, batch_size], uniform over the n_tokens - n_ctx - 1 starts. Every rank holds the same
    generator and takes its own row, so the windows of a step depend on the global batch alone: 2 ranks x
    batch 4 draw exactly what one process with batch 8, or batch 4 and grad_accum 2, draws."""
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
    """Mean loss (nats/token), bits per byte and token accuracy on eval_windows fixed, evenly spaced
    windows of data -> {split_loss, split_bpb, split_acc}. Bits per byte = nats / ln 2 / UTF-8 bytes."""
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


# ----------------------------------------------------------------------------- the model and its optimisers

def build_run(cfg, ckpt, env, meta):
    """The model, its optimisers and the window generator of the settings (a resumed run: with their
    saved states) -> SimpleNamespace(model_cfg, raw_model: the model, evaluated and saved; model: what the
    loop steps, raw_model under DDP and torch.compile; optimizers [(checkpoint key, optimizer)];
    batch_gen; flops: training FLOPs a token; step; best_val: nats/token). A model config the settings
    make invalid, a model too large for the device's memory (counted on the meta device) or a tokenizer
    other than the checkpoint's: one line, exit 2; a saved optimiser state that does not fit:
    checkpoint.CheckpointError."""
    device_tuning = machine.DEVICE_TUNING[env.dev.split(':')[0]]
    try:
        model_cfg = mixer.ModelConfig(vocab_size=meta['vocab_size'], task=cfg['task'], **{
            k: device_tuning[k] if cfg[k] is None and k in configurator.TUNING_KEYS else cfg[k]
            for k in configurator.MODEL_KEYS})
    except (ValueError, TypeError) as e:
        fail(str(e))
    machine.check_memory(model_cfg, env)
    checkpoint.check_tokenizer(ckpt, meta, cfg['data_dir'])
    torch.manual_seed(cfg['seed'] + env.rank)
    raw_model = mixer.build_model(model_cfg).to(env.dev)
    optimizers = optim.build_optimizers(raw_model, cfg, env.cuda)
    batch_gen = torch.Generator().manual_seed(cfg['seed'])      # the same on every rank: see draw_windows
    step, best_val = 0, float('inf')
    if ckpt is not None:
        step, best_val = checkpoint.restore(ckpt, raw_model, optimizers, batch_gen, env)
        if env.master:
            print(f'resumed from {os.path.join(cfg["out_dir"], "ckpt.pt")} at step {step}')
    return SimpleNamespace(model_cfg=model_cfg, raw_model=raw_model, model=wrap_model(raw_model, cfg, env),
                           optimizers=optimizers, batch_gen=batch_gen, step=step, best_val=best_val,
                           flops=machine.flops_per_token(raw_model, cfg['n_ctx']))


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


# ----------------------------------------------------------------------------- one step

def train_step(model, optimizers, data, starts, lr, cfg, env):
    """One optimiser step over the windows at starts long [grad_accum, batch_size] -> mean training loss,
    a 0-d tensor (not synchronised: no .item() per step). Under DDP, gradients are all-reduced on the last
    micro-step only (no_sync): the others would send gradients that the last one sends again."""
    for _, opt in optimizers:
        for group in opt.param_groups:
            group['lr'] = lr * group['lr_mult']                # the token mixings' own rate: optim.param_groups
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


# ----------------------------------------------------------------------------- the loop

def train(run, train_data, val_data, record, clock):
    """The loop: evaluate (and save) every eval_interval steps and at max_iters, log every log_interval
    steps; run.step advances to max_iters. A resumed run does not evaluate its saved step again."""
    cfg, env, max_iters = record.cfg, record.env, record.cfg['max_iters']
    skip_eval = record.saved_step is not None and run.step < max_iters
    pending, interval_steps = [], 0                                      # losses not yet checked
    while True:
        if (run.step % cfg['eval_interval'] == 0 or run.step == max_iters) and not skip_eval:
            clock.lap()
            check_finite(env, pending)
            ev = evaluate_splits(run.raw_model, train_data, val_data, cfg, env.dev, env.autocast,
                                 record.meta['val']['bytes_per_token']) if env.master else None
            record.evaluated(ev, clock)                        # printed, logged, saved
            clock.skip()                                       # evaluation time is not training time
        skip_eval = False
        if run.step >= max_iters:
            return
        lr = optim.lr_at(run.step, cfg)
        starts = draw_windows(run.batch_gen, len(train_data), cfg['n_ctx'], cfg['batch_size'],
                              cfg['grad_accum'], env.world)[env.rank]
        started = time.perf_counter()
        loss = train_step(run.model, run.optimizers, train_data, starts, lr, cfg, env)
        run.step += 1
        if change := env.threads.stepped(time.perf_counter() - started):   # the CPU's threads, as measured
            record.threads(change)
        interval_steps += 1
        pending.append((run.step, loss))
        if not env.cuda:
            check_finite(env, pending)                         # cheap on the CPU: every step
        if run.step % cfg['log_interval'] == 0:
            clock.lap()
            check_finite(env, pending)
            record.train(loss, lr, interval_steps, clock)
            clock.interval, interval_steps = 0.0, 0


def main(argv):
    """Train with the settings of `argv` (config files and --key=value). Writes out_dir/ckpt.pt
    (harness/checkpoint.py's format) and log.jsonl (events config, schedule, train, eval, summary), under a
    lock on out_dir. Exits 2 on bad settings, data, checkpoint or folder (one line); 1 when the run
    stops early (a non-finite loss on any rank, a failed write, a stalled rank), 130 on Ctrl-C, each
    with one line saying what the checkpoint holds."""
    t_wall = time.perf_counter()
    cfg, ckpt = configurator.settings(argv, DEFAULTS, __doc__, sys.modules[__name__])
    if ckpt is not None and ckpt['step'] >= cfg['max_iters']:      # a finished run: no second eval, summary
        if int(os.environ.get('RANK', 0)) == 0:
            print(f'train.py: nothing to do: {os.path.join(cfg["out_dir"], "ckpt.pt")} holds step '
                  f'{ckpt["step"]}, max_iters is {cfg["max_iters"]} (a larger --max_iters trains on)')
        return
    try:
        lock = checkpoint.claim_run_folder(cfg, ckpt, int(os.environ.get('RANK', 0)))   # rank 0 locks out_dir
        env = machine.setup_device(cfg)
        meta, train_data, val_data = read_prepared(cfg['data_dir'], cfg['n_ctx'])
        run = build_run(cfg, ckpt, env, meta)
        trackers = open_trackers(cfg, ckpt and ckpt['step'], run.raw_model.num_params(), env.world) \
            if env.master else None                     # before the folder is prepared: it reads the log's last step
        record = Record(cfg, env, run, meta, *checkpoint.prepare_run_folder(cfg, ckpt, env.rank), trackers)
    except (checkpoint.CheckpointError, ValueError) as e:
        fail(str(e))
    clock, code = machine.Clock(env.cuda), 0
    try:
        record.start(ckpt)
        train(run, train_data, val_data, record, clock)
        if env.master:
            record.summary(clock, t_wall, len(train_data))
    except Stop as e:
        code = record.stopped(f'error: {e}; stopping', 1)
    except KeyboardInterrupt:
        code = record.stopped('interrupted (Ctrl-C)', 130)
    except RuntimeError as e:
        what = machine.collective_failure(e, cfg, env) if env.ddp else None
        if what is None:
            raise
        code = record.stopped(f'error: {what}; stopping', 1)
    finally:
        record.close()                 # log.jsonl and the trackers
        if lock:                       # out_dir free for the next run (a pool process trains several)
            lock.close()
    if env.ddp:
        del run, record                # DDP sits in reference cycles: freed before its process group ends
        machine.end_ddp(clean=code == 0)
    if code:
        sys.exit(code)


if __name__ == '__main__':
    sys.exit(run_command('train.py', main, sys.argv[1:]))
