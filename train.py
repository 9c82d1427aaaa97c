"""Train any model kind of mixer.py on prepared token files (a nanoGPT-style loop).

    python train.py config/tinystories_cpu.py --variant=toeplitz --max_iters=500
    torchrun --standalone --nproc_per_node=2 train.py config/tinystories_cpu.py
    python train.py config/tinystories_cpu.py --init_from=resume     # continue out_dir/ckpt.pt

Settings are the module-level defaults below; a config file (plain Python
assignments) and then --key=value arguments override them (configurator.py).
`--variant=NAME` applies mixer.VARIANTS[NAME] on top of the defaults, below anything
set explicitly. Unknown keys, wrong types and values out of range are an error.
`python train.py --help` lists every setting.
"""

import gc
import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, fields

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import checkpoint
import configurator
import machine
import mixer
from configurator import fail

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
# system
device = 'auto'                 # 'auto', 'cpu', 'cuda', 'cuda:1', ...
dtype = 'auto'                  # 'auto' (bf16 on CUDA, fp32 on CPU), 'float32', 'bfloat16'
compile = False                 # torch.compile the model
# model: every field of mixer.ModelConfig (vocab_size comes from meta.json)
globals().update({f.name: f.default for f in fields(mixer.ModelConfig) if f.name not in ('vocab_size', 'task')})
# -----------------------------------------------------------------------------
MODEL_KEYS = [f.name for f in fields(mixer.ModelConfig) if f.name not in ('vocab_size', 'task')]
DEFAULTS = configurator.collect_defaults(globals(), skip=('MODEL_KEYS',))


# ----------------------------------------------------------------------------- optimisation

def muon_params(model):
    """The parameters that optimizer='muon' gives to torch.optim.Muon: the 2-D weights of
    the nn.Linear layers inside the blocks (mixer.Block: attention, MLP and head
    projections); never embeddings, the (tied) LM head, norms, biases or the
    token-mixing matrices of a mixer.HeadMixing. Returns a set of parameter ids."""
    return {id(m.weight) for b in model.modules() if isinstance(b, mixer.Block)
            for m in b.modules() if isinstance(m, torch.nn.Linear) and m.weight.dim() == 2}


def param_groups(model, cfg, only=None):
    """AdamW groups: weight decay only on matrices (not biases, norms or the mixing bias
    c; the mixing matrices at mixing_weight_decay when set), and the token-mixing
    parameters (those of a mixer.HeadMixing, projections excluded) at `mixing_lr_mult`
    times the learning rate. Each group carries 'lr_mult'.
    `only`: a set of parameter ids to group (default: every parameter)."""
    mixing = {id(p) for m in model.modules() if isinstance(m, mixer.HeadMixing)
              for n, p in m.named_parameters() if not n.startswith('proj_')}
    groups = {}
    for n, p in model.named_parameters():
        if only is not None and id(p) not in only:
            continue
        decay = p.dim() >= 2 and not n.endswith(('.c', '.c1', '.c2'))
        wd = cfg['weight_decay'] if decay else 0.0
        if id(p) in mixing and decay and cfg['mixing_weight_decay'] is not None:
            wd = cfg['mixing_weight_decay']
        mult = cfg['mixing_lr_mult'] if id(p) in mixing else 1.0
        groups.setdefault((decay, wd, mult), []).append(p)
    return [{'params': ps, 'weight_decay': wd, 'lr_mult': mult} for (_, wd, mult), ps in groups.items()]


def build_optimizers(model, cfg, cuda):
    """AdamW over every parameter, or with optimizer='muon' Muon over muon_params and
    AdamW over the rest -> list of (checkpoint key, optimizer)."""
    muon_ids = muon_params(model) if cfg['optimizer'] == 'muon' else set()
    adamw_ids = {id(p) for p in model.parameters()} - muon_ids
    out = [('optimizer', torch.optim.AdamW(param_groups(model, cfg, adamw_ids), lr=cfg['learning_rate'],
                                           betas=(cfg['beta1'], cfg['beta2']), fused=cuda))]
    if muon_ids:
        out.append(('optimizer_muon', torch.optim.Muon(param_groups(model, cfg, muon_ids), lr=cfg['learning_rate'],
                                                       weight_decay=cfg['weight_decay'],
                                                       adjust_lr_fn='match_rms_adamw')))
    return out


def lr_at(it, cfg):
    """Linear warm-up to learning_rate, then cosine decay to min_lr at lr_decay_iters."""
    decay_iters = cfg['lr_decay_iters'] or cfg['max_iters']
    if it < cfg['warmup_iters']:
        return cfg['learning_rate'] * (it + 1) / cfg['warmup_iters']
    if it >= decay_iters:
        return cfg['min_lr']
    ratio = (it - cfg['warmup_iters']) / max(1, decay_iters - cfg['warmup_iters'])
    return cfg['min_lr'] + 0.5 * (1 + math.cos(math.pi * ratio)) * (cfg['learning_rate'] - cfg['min_lr'])


# ----------------------------------------------------------------------------- data and evaluation

def load_tokens(path):
    """uint16 token ids of one split, memory-mapped (numpy [N])."""
    if not os.path.isfile(path):
        fail(f'{path} not found: run data/prepare.py first (or set --data_dir)')
    return np.memmap(path, dtype=np.uint16, mode='r')


def load_data(cfg):
    """meta.json and the two token files of cfg['data_dir'] -> (meta dict, train uint16
    [N], val uint16 [M]); a missing file or too short a split: one line, exit 2."""
    meta_path = os.path.join(cfg['data_dir'], 'meta.json')
    if not os.path.isfile(meta_path):
        fail(f'{meta_path} not found: run data/prepare.py first (or set --data_dir)')
    with open(meta_path) as f:
        meta = json.load(f)
    train_data = load_tokens(os.path.join(cfg['data_dir'], 'train.bin'))
    val_data = load_tokens(os.path.join(cfg['data_dir'], 'val.bin'))
    if min(len(train_data), len(val_data)) < cfg['n_ctx'] + 2:
        fail(f'token files are shorter than n_ctx + 2 = {cfg["n_ctx"] + 2} tokens')
    return meta, train_data, val_data


def draw_windows(gen, n_tokens, n_ctx, batch_size, grad_accum, world):
    """Start positions of one optimiser step's windows for every rank and micro-step:
    long [world, grad_accum, batch_size], uniform over the n_tokens - n_ctx - 1 starts.
    Every rank holds the same generator and takes its own row, so the windows of a
    step depend on the global batch alone: 2 ranks x batch 4 draw exactly what one
    process with batch 8, or batch 4 and grad_accum 2, draws (test_train checks the
    parameters agree)."""
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


# ----------------------------------------------------------------------------- one step, and stopping

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
        with (nullcontext() if sync else model.no_sync()), env.autocast:
            _, loss = model(x, y)
            (loss / len(starts)).backward()
        loss_sum = loss_sum + loss.detach()
    if cfg['grad_clip'] > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg['grad_clip'])
    for _, opt in optimizers:
        opt.step()
    for _, opt in optimizers:
        opt.zero_grad(set_to_none=True)
    return loss_sum / len(starts)


def stop_if_not_finite(pending, ckpt_path):
    """Check the pending (step, loss tensor) pairs with one device sync, then clear them.
    A non-finite loss: one line naming the step, exit 1; the last checkpoint (all
    finite) stays."""
    if not pending:
        return
    losses = torch.stack([l for _, l in pending]).float().cpu()
    bad = (~torch.isfinite(losses)).nonzero()
    if len(bad):
        stop(f'non-finite train loss {losses[bad[0, 0]].item()} at step {pending[bad[0, 0]][0]}', ckpt_path)
    pending.clear()


def stop(msg, ckpt_path):
    """A non-finite loss: print one line, exit 1 (ckpt_path keeps the last good state)."""
    print(f'train.py: error: {msg}; stopping, {ckpt_path} keeps the last good state', file=sys.stderr)
    sys.exit(1)


# ----------------------------------------------------------------------------- the run's state

def restore(ckpt, model, optimizers, batch_gen, env):
    """Load a checkpoint's model, optimiser and RNG states in place -> (step, best val loss).
    Betas and weight decay stay those of the current settings, not the saved state's."""
    model.load_state_dict(ckpt['model'])
    for key, opt in optimizers:
        fresh = [{k: v for k, v in g.items() if k != 'params'} for g in opt.param_groups]
        try:
            opt.load_state_dict(ckpt[key])
        except (ValueError, KeyError) as e:   # e.g. another mixing_lr_mult: other parameter groups
            fail(f"the checkpoint's optimizer state does not fit these settings: {e}")
        for g, f in zip(opt.param_groups, fresh):
            g.update(f)
    if env.rank < len(ckpt['rng']):
        rng = ckpt['rng'][env.rank]
        torch.set_rng_state(rng['torch'])
        batch_gen.set_state(rng['batch'])
        if env.cuda and rng.get('cuda') is not None:
            torch.cuda.set_rng_state(rng['cuda'], env.dev)
    return ckpt['step'], ckpt['best_val_loss']


def gather_rng(batch_gen, env):
    """Every rank's RNG states (torch, window generator, CUDA) -> list, one dict a rank."""
    mine = {'torch': torch.get_rng_state(), 'batch': batch_gen.get_state(),
            'cuda': torch.cuda.get_rng_state(env.dev) if env.cuda else None}
    if not env.ddp:
        return [mine]
    everyone = [None] * env.world
    dist.all_gather_object(everyone, mine)
    return everyone


def build_run(cfg, ckpt, env, meta):
    """The model (on env.dev, compiled and DDP-wrapped as asked), its optimisers, the
    window generator, and the step and best validation loss to start from (a resumed
    run's saved states) -> (model, raw model, model_cfg, optimizers, batch_gen, step,
    best_val). A model config the settings make invalid: one line, exit 2."""
    try:
        model_cfg = mixer.ModelConfig(vocab_size=meta['vocab_size'], task=cfg['task'],
                                      **{k: cfg[k] for k in MODEL_KEYS})
    except (ValueError, TypeError) as e:
        fail(str(e))
    torch.manual_seed(cfg['seed'] + env.rank)
    raw_model = mixer.build_model(model_cfg).to(env.dev)
    optimizers = build_optimizers(raw_model, cfg, env.cuda)
    batch_gen = torch.Generator().manual_seed(cfg['seed'])      # the same on every rank: see draw_windows
    step, best_val = 0, float('inf')
    if ckpt is not None:
        step, best_val = restore(ckpt, raw_model, optimizers, batch_gen, env)
        if env.master:
            print(f'resumed from {os.path.join(cfg["out_dir"], "ckpt.pt")} at step {step}')
    model = torch.compile(raw_model) if cfg['compile'] else raw_model
    if env.ddp:
        model = DDP(model, device_ids=[env.local] if env.cuda else None)
    return model, raw_model, model_cfg, optimizers, batch_gen, step, best_val


# ----------------------------------------------------------------------------- the log

def write_log(log, rec):
    """Append one JSON record to the open log (None on ranks > 0: nothing)."""
    if log:
        log.write(json.dumps(rec) + '\n')
        log.flush()


def log_start(log, cfg, ckpt, env, raw_model, model_cfg, step):
    """The run's header: the 'config' and 'schedule' events, and the console lines
    naming the model, the processes, the MFU peak and the schedule -> (FLOPs per token,
    measured peak FLOP/s, nominal peak FLOP/s or None)."""
    say = print if env.master else (lambda *a, **k: None)
    flops = machine.flops_per_token(raw_model, cfg['n_ctx'])
    peak = machine.measure_matmul_flops(env.dev, getattr(torch, env.dtype))
    nominal = machine.nominal_peak(env.dev)
    n_params = raw_model.num_params()
    write_log(log, {'event': 'config', 'config': cfg, 'model_config': asdict(model_cfg), 'world_size': env.world,
                    'device': env.dev, 'dtype': env.dtype, 'params': n_params, 'flops_per_token': flops,
                    'peak_flops_measured': peak, 'peak_flops_nominal': nominal})
    say(f'{cfg["variant"]} ({model_cfg.kind}, mixing={model_cfg.mixing}, task={cfg["task"]}): '
        f'{n_params / 1e6:.2f}M params, {flops / 1e6:.1f} MFLOP/token (fwd+bwd), '
        f'{env.world} process(es) on {env.dev}, {env.dtype}, {tokens_per_step(cfg, env)} tokens/step')
    say(f'MFU is reported against the measured {env.dtype} matmul peak {peak / 1e9:.0f} GFLOP/s per process'
        + (f', nominal {nominal / 1e12:.0f} TFLOP/s' if nominal else ''))
    decay_iters = cfg['lr_decay_iters'] or cfg['max_iters']
    schedule = {'event': 'schedule', 'from_step': step, 'max_iters': cfg['max_iters'],
                'warmup_iters': cfg['warmup_iters'], 'learning_rate': cfg['learning_rate'], 'min_lr': cfg['min_lr'],
                'lr_decay_iters': decay_iters, 'lr_now': lr_at(step, cfg)}
    if ckpt is not None:
        schedule['lr_saved_schedule'] = lr_at(step, {**cfg, **{k: ckpt['config'].get(k, cfg[k]) for k in (
            'learning_rate', 'min_lr', 'warmup_iters', 'lr_decay_iters', 'max_iters')}})
    write_log(log, schedule)
    say(f'schedule: steps {step} -> {cfg["max_iters"]}; lr warm-up {cfg["warmup_iters"]} steps to '
        f'{cfg["learning_rate"]:.2e}, cosine to {cfg["min_lr"]:.2e} at step {decay_iters}; lr now '
        f'{schedule["lr_now"]:.2e}' + (f' (the saved run\'s schedule: {schedule["lr_saved_schedule"]:.2e})'
                                       if ckpt is not None else ''))
    return flops, peak, nominal


def tokens_per_step(cfg, env):
    """Tokens of one optimiser step over all processes."""
    return cfg['batch_size'] * cfg['n_ctx'] * cfg['grad_accum'] * env.world


def log_eval(log, cfg, ev, step, clock, start_step):
    """One evaluation: the console line (loss in nats/token, bits per byte, accuracy, ETA)
    and the 'eval' event."""
    print(f'step {step:5d}/{cfg["max_iters"]} | val loss {ev["val_loss"]:.4f} nats/token | '
          f'{ev["val_bpb"]:.4f} bits/byte | acc {ev["val_acc"]:.3f} | '
          + (f'train windows {ev["train_windows_loss"]:.4f} | ' if cfg['eval_train'] else '') +
          f'ETA {clock.eta(step - start_step, cfg["max_iters"] - step)}', flush=True)
    write_log(log, {'event': 'eval', 'step': step, **ev})


def log_train(log, cfg, env, loss, lr, step, steps, clock, start_step, flops, peak, nominal):
    """Every log_interval steps: the loss (the mean over ranks under DDP), ms/step,
    tokens/s and MFU since the last line -> the console line and a 'train' event."""
    if env.ddp:                                        # the mean over ranks, not rank 0's alone
        loss = loss.reshape(1).float()
        dist.all_reduce(loss)
        loss = loss / env.world
    ms = 1000 * clock.interval / steps
    tok_s = tokens_per_step(cfg, env) / (ms / 1000)
    rec = {'event': 'train', 'step': step, 'loss': loss.item(), 'lr': lr, 'ms_per_step': ms,
           'tokens_per_s': tok_s, 'mfu': flops * tok_s / env.world / peak}
    if nominal:
        rec['mfu_nominal'] = flops * tok_s / env.world / nominal
    if env.master:
        print(f'step {step:5d}/{cfg["max_iters"]} | loss {rec["loss"]:.4f} | lr {lr:.2e} | {ms:.1f} ms/step | '
              f'{tok_s:,.0f} tok/s | MFU {100 * rec["mfu"]:.1f}%'
              + (f' ({100 * rec["mfu_nominal"]:.1f}% of nominal)' if nominal else '')
              + f' | ETA {clock.eta(step - start_step, cfg["max_iters"] - step)}', flush=True)
    write_log(log, rec)


def log_summary(log, cfg, env, last_ev, best_val, step, start_step, clock, t_wall, n_train, flops, peak, ckpt_path):
    """The 'summary' event and line: final and best validation loss (nats/token, bits per
    byte), steps, tokens and epochs, wall and training time, tokens/s, MFU."""
    tokens_seen = step * tokens_per_step(cfg, env)
    tok_s = (step - start_step) * tokens_per_step(cfg, env) / clock.total if clock.total > 0 else 0.0
    summary = {'event': 'summary', 'final_val_loss': last_ev['val_loss'], 'final_val_bpb': last_ev['val_bpb'],
               'final_val_acc': last_ev['val_acc'], 'best_val_loss': best_val, 'step': step,
               'tokens_seen': tokens_seen, 'epochs': tokens_seen / n_train,
               'train_seconds': clock.total, 'wall_seconds': time.perf_counter() - t_wall,
               'tokens_per_s': tok_s, 'mfu': flops * tok_s / env.world / peak,
               **({'final_train_windows_loss': last_ev['train_windows_loss']} if cfg['eval_train'] else {})}
    write_log(log, summary)
    print(f'summary: final val loss {summary["final_val_loss"]:.4f} nats/token '
          f'({summary["final_val_bpb"]:.4f} bits/byte, acc {summary["final_val_acc"]:.3f}), '
          f'best {best_val:.4f} | {step} steps, {tokens_seen:,} tokens = {summary["epochs"]:.2f} epochs | '
          f'wall {machine.hms(summary["wall_seconds"])}, training {machine.hms(clock.total)}, {tok_s:,.0f} tok/s, '
          f'MFU {100 * summary["mfu"]:.1f}% | checkpoint '
          f'{ckpt_path if cfg["save_checkpoint"] and os.path.isfile(ckpt_path) else "none"}', flush=True)


# ----------------------------------------------------------------------------- main

def main(argv):
    """Train with the settings of `argv` (config files and --key=value). Writes out_dir/
    ckpt.pt (checkpoint.py's format) and log.jsonl (events config, schedule, train,
    eval, summary). Exits 2 on bad settings, data or checkpoint (one line), 1 on a
    non-finite loss (the last checkpoint kept)."""
    t_wall = time.perf_counter()
    cfg, ckpt = configurator.resolve_settings(configurator.parse_overrides(argv, DEFAULTS, __doc__),
                                              DEFAULTS, MODEL_KEYS)
    configurator.check_settings(cfg)
    ckpt_path, log_path = (os.path.join(cfg['out_dir'], f) for f in ('ckpt.pt', 'log.jsonl'))
    if ckpt is None and not cfg['overwrite'] and any(map(os.path.exists, (ckpt_path, log_path))):
        fail(f'{cfg["out_dir"]} already holds a run (ckpt.pt / log.jsonl): '
             f'pass --init_from=resume to continue it or --overwrite=True to replace it')
    env = machine.setup_device(cfg)
    meta, train_data, val_data = load_data(cfg)
    bytes_per_token = meta['val']['bytes_per_token']
    os.makedirs(cfg['out_dir'], exist_ok=True)
    model, raw_model, model_cfg, optimizers, batch_gen, step, best_val = build_run(cfg, ckpt, env, meta)
    log = open(log_path, 'a' if ckpt is not None else 'w') if env.master else None   # scratch: a new log
    flops, peak, nominal = log_start(log, cfg, ckpt, env, raw_model, model_cfg, step)

    # the loop: evaluate (and save) every eval_interval steps and at the end, log every log_interval
    max_iters, start_step, last_ev = cfg['max_iters'], step, None
    skip_eval = ckpt is not None and step < max_iters          # the saved step was evaluated
    pending, interval_steps = [], 0                            # losses not yet checked for finiteness
    clock = machine.Clock(env.cuda)
    while True:
        if (step % cfg['eval_interval'] == 0 or step == max_iters) and not skip_eval:
            clock.lap()
            stop_if_not_finite(pending, ckpt_path)
            rng = gather_rng(batch_gen, env)
            if env.master:
                ev = evaluate_splits(raw_model, train_data, val_data, cfg, env.dev, env.autocast, bytes_per_token)
                if not math.isfinite(ev['val_loss']):
                    stop(f'non-finite val loss {ev["val_loss"]} at step {step}', ckpt_path)
                best_val, last_ev = min(best_val, ev['val_loss']), {'step': step, **ev}
                log_eval(log, cfg, ev, step, clock, start_step)
                if cfg['save_checkpoint'] and step > 0:
                    checkpoint.save_checkpoint(
                        ckpt_path, raw_model, asdict(model_cfg), cfg, step, best_val, rng,
                        os.path.join(cfg['data_dir'], meta['tokenizer']), meta['tokenizer_sha256'], optimizers)
            clock.skip()                                       # evaluation time is not training time
        skip_eval = False
        if step >= max_iters:
            break
        lr = lr_at(step, cfg)
        starts = draw_windows(batch_gen, len(train_data), cfg['n_ctx'], cfg['batch_size'], cfg['grad_accum'],
                              env.world)[env.rank]
        loss = train_step(model, optimizers, train_data, starts, lr, cfg, env)
        step += 1
        interval_steps += 1
        pending.append((step, loss))
        if not env.cuda:
            stop_if_not_finite(pending, ckpt_path)             # cheap on the CPU: every step
        if step % cfg['log_interval'] == 0:
            clock.lap()
            stop_if_not_finite(pending, ckpt_path)
            log_train(log, cfg, env, loss, lr, step, interval_steps, clock, start_step, flops, peak, nominal)
            clock.interval, interval_steps = 0.0, 0

    if env.master:
        if last_ev is None or last_ev['step'] != step:       # e.g. resumed past its max_iters
            last_ev = {'step': step, **evaluate_splits(raw_model, train_data, val_data, cfg, env.dev, env.autocast,
                                                       bytes_per_token)}
            best_val = min(best_val, last_ev['val_loss'])
        log_summary(log, cfg, env, last_ev, best_val, step, start_step, clock, t_wall, len(train_data), flops, peak,
                    ckpt_path)
        log.close()
    if env.ddp:
        dist.barrier()                 # rank 0 may still be evaluating and saving
        del model                      # DDP sits in reference cycles: freed at interpreter exit, after
        gc.collect()                   # gloo's threads, it aborted about one run in 20 (SIGABRT)
        dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1:])
