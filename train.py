"""Train any model kind of mixer.py on prepared token files (DESIGN section 3).

    python train.py config/tinystories_cpu.py --variant=toeplitz --max_iters=500
    torchrun --standalone --nproc_per_node=2 train.py config/tinystories_cpu.py
    python train.py config/tinystories_cpu.py --init_from=resume     # continue out_dir/ckpt.pt

Settings are the module-level defaults below; a config file (plain Python
assignments) and then --key=value arguments override them. `--variant=NAME`
applies mixer.VARIANTS[NAME] on top of the defaults, below anything set
explicitly. Unknown keys and wrong types are an error. `python train.py --help`
lists every setting.
"""

import ast
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

import mixer

# ----------------------------------------------------------------------------- defaults
# I/O
out_dir = 'out'                 # checkpoint ckpt.pt and log.jsonl go here
data_dir = 'data/tinystories'   # train.bin, val.bin, meta.json, tokenizer from data/prepare.py
init_from = 'scratch'           # 'scratch' or 'resume' (from out_dir/ckpt.pt)
variant = 'flat'                # a name in mixer.VARIANTS
task = 'lm'                     # 'lm' (next token) or 'autoencode'
seed = 1337
# optimisation
batch_size = 16                 # windows per micro-step per process
grad_accum = 1                  # micro-steps per optimiser step
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
# evaluation and logging
eval_interval = 250
eval_windows = 64               # fixed, evenly spaced validation windows
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
DEFAULTS = {k: v for k, v in globals().items()
            if not k.startswith('_') and isinstance(v, (int, float, bool, str, type(None)))
            and k not in ('MODEL_KEYS',)}


def fail(msg):
    """Print a one-line error and exit with code 2."""
    print(f'train.py: error: {msg}', file=sys.stderr)
    sys.exit(2)


def coerce(key, value):
    """Check `value` against the type of DEFAULTS[key]; ints are accepted for floats."""
    default = DEFAULTS[key]
    if default is None or value is None or isinstance(value, type(default)) and not (
            isinstance(value, bool) and not isinstance(default, bool)):
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    fail(f'{key} must be {type(default).__name__}, got {value!r}')


def parse_overrides(argv):
    """Config files and --key=value arguments -> dict of explicitly set keys."""
    out = {}
    for arg in argv:
        if arg in ('-h', '--help'):
            print(__doc__)
            for k, v in DEFAULTS.items():
                print(f'  --{k}={v!r}')
            sys.exit(0)
        if not arg.startswith('--'):
            if not os.path.isfile(arg):
                fail(f'config file {arg!r} not found')
            ns = {}
            exec(open(arg).read(), {}, ns)
            items = [(k, v) for k, v in ns.items() if not k.startswith('_')]
        else:
            key, eq, text = arg[2:].partition('=')
            if not eq:
                fail(f'expected --key=value, got {arg!r}')
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                value = text                       # a bare string such as --variant=toeplitz
            items = [(key, value)]
        for key, value in items:
            if key not in DEFAULTS:
                fail(f'unknown setting {key!r} (see --help)')
            out[key] = coerce(key, value)
    return out


def param_groups(model, cfg):
    """AdamW groups: weight decay only on matrices (not biases, norms or the mixing bias
    c), and the token-mixing parameters (those of a mixer.HeadMixing, projections
    excluded) at `mixing_lr_mult` times the learning rate. Each group carries 'lr_mult'."""
    mixing = {id(p) for m in model.modules() if isinstance(m, mixer.HeadMixing)
              for n, p in m.named_parameters() if not n.startswith('proj_')}
    groups = {}
    for n, p in model.named_parameters():
        decay = p.dim() >= 2 and not n.endswith(('.c', '.c1', '.c2'))
        mult = cfg['mixing_lr_mult'] if id(p) in mixing else 1.0
        groups.setdefault((decay, mult), []).append(p)
    return [{'params': ps, 'weight_decay': cfg['weight_decay'] if decay else 0.0, 'lr_mult': mult}
            for (decay, mult), ps in groups.items()]


def lr_at(it, cfg):
    """Linear warm-up to learning_rate, then cosine decay to min_lr at lr_decay_iters."""
    decay_iters = cfg['lr_decay_iters'] or cfg['max_iters']
    if it < cfg['warmup_iters']:
        return cfg['learning_rate'] * (it + 1) / cfg['warmup_iters']
    if it >= decay_iters:
        return cfg['min_lr']
    ratio = (it - cfg['warmup_iters']) / max(1, decay_iters - cfg['warmup_iters'])
    return cfg['min_lr'] + 0.5 * (1 + math.cos(math.pi * ratio)) * (cfg['learning_rate'] - cfg['min_lr'])


def load_tokens(path):
    """uint16 token ids of one split, memory-mapped (numpy [N])."""
    if not os.path.isfile(path):
        fail(f'{path} not found: run data/prepare.py first (or set --data_dir)')
    return np.memmap(path, dtype=np.uint16, mode='r')


def get_batch(data, starts, n_ctx, task, dev):
    """Windows of n_ctx + 1 tokens at `starts` -> (x, y) long [B, n_ctx]; y is x shifted
    by one for 'lm' and x itself for 'autoencode'."""
    w = torch.from_numpy(np.stack([data[s:s + n_ctx + 1].astype(np.int64) for s in starts.tolist()]))
    x, y = w[:, :-1], (w[:, 1:] if task == 'lm' else w[:, :-1])
    return x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)


@torch.no_grad()
def evaluate(model, val, cfg, dev, autocast, bytes_per_token):
    """Mean loss (nats/token), bits per byte and token accuracy on fixed validation windows."""
    model.eval()
    n_ctx, B = cfg['n_ctx'], cfg['batch_size']
    starts = torch.linspace(0, len(val) - n_ctx - 2, cfg['eval_windows']).long()
    nats, correct, count = 0.0, 0, 0
    for i in range(0, len(starts), B):
        x, y = get_batch(val, starts[i:i + B], n_ctx, cfg['task'], dev)
        with autocast:
            logits, loss = model(x, y)
        nats += loss.item() * y.numel()
        correct += (logits.argmax(-1) == y).sum().item()
        count += y.numel()
    model.train()
    loss = nats / count
    return {'val_loss': loss, 'val_bpb': loss / math.log(2) / bytes_per_token, 'val_acc': correct / count}


def main(argv):
    overrides = parse_overrides(argv)
    cfg = dict(DEFAULTS)
    var = overrides.get('variant', cfg['variant'])
    if var not in mixer.VARIANTS:
        fail(f'unknown variant {var!r}; choose from {", ".join(mixer.VARIANTS)}')
    cfg.update(mixer.VARIANTS[var])
    cfg.update(overrides)

    # distributed setup: torchrun sets RANK / WORLD_SIZE / LOCAL_RANK
    ddp = int(os.environ.get('RANK', -1)) != -1
    dev = cfg['device']
    if dev == 'auto':
        dev = 'cuda' if torch.cuda.is_available() else 'cpu'
    if dev == 'cpu':                   # before any thread starts (gloo's included)
        mixer.keep_freed_memory()      # large per-step tensors: no page faults each step
    rank, world, local = 0, 1, 0
    if ddp:
        rank, world, local = (int(os.environ[k]) for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK'))
        if dev.startswith('cuda'):
            dev = f'cuda:{local}'
            torch.cuda.set_device(dev)
        dist.init_process_group(backend='nccl' if dev.startswith('cuda') else 'gloo')
    master = rank == 0
    say = print if master else (lambda *a, **k: None)
    if dev.startswith('cuda') and not torch.cuda.is_available():
        fail('device cuda requested but CUDA is not available')
    dt_name = cfg['dtype'] if cfg['dtype'] != 'auto' else ('bfloat16' if dev.startswith('cuda') else 'float32')
    if dt_name not in ('float32', 'bfloat16'):
        fail(f"dtype must be 'auto', 'float32' or 'bfloat16', got {dt_name!r}")
    autocast = (torch.autocast(device_type=dev.split(':')[0], dtype=torch.bfloat16)
                if dt_name == 'bfloat16' else nullcontext())
    if dev.startswith('cuda'):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # data
    meta_path = os.path.join(cfg['data_dir'], 'meta.json')
    if not os.path.isfile(meta_path):
        fail(f'{meta_path} not found: run data/prepare.py first (or set --data_dir)')
    meta = json.load(open(meta_path))
    train_data = load_tokens(os.path.join(cfg['data_dir'], 'train.bin'))
    val_data = load_tokens(os.path.join(cfg['data_dir'], 'val.bin'))
    if min(len(train_data), len(val_data)) < cfg['n_ctx'] + 2:
        fail(f'token files are shorter than n_ctx + 2 = {cfg["n_ctx"] + 2} tokens')

    # model, optimiser, checkpoint
    os.makedirs(cfg['out_dir'], exist_ok=True)
    ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
    ckpt = None
    if cfg['init_from'] == 'resume':
        if not os.path.isfile(ckpt_path):
            fail(f'--init_from=resume but {ckpt_path} does not exist')
        ckpt = torch.load(ckpt_path, map_location='cpu', weights_only=True)
        for k in MODEL_KEYS:                      # the architecture comes from the checkpoint
            cfg[k] = ckpt['model_config'][k]
        cfg['task'] = ckpt['model_config']['task']
    elif cfg['init_from'] != 'scratch':
        fail(f"init_from must be 'scratch' or 'resume', got {cfg['init_from']!r}")
    try:
        model_cfg = mixer.ModelConfig(vocab_size=meta['vocab_size'], task=cfg['task'],
                                      **{k: cfg[k] for k in MODEL_KEYS})
    except (ValueError, TypeError) as e:
        fail(str(e))
    torch.manual_seed(cfg['seed'] + rank)
    model = mixer.build_model(model_cfg).to(dev)
    optimizer = torch.optim.AdamW(param_groups(model, cfg), lr=cfg['learning_rate'],
                                  betas=(cfg['beta1'], cfg['beta2']), fused=dev.startswith('cuda'))
    batch_gen = torch.Generator().manual_seed(cfg['seed'] + 1000 * rank)   # each rank draws its own windows
    step, best_val = 0, float('inf')
    if ckpt is not None:
        model.load_state_dict(ckpt['model'])
        try:
            optimizer.load_state_dict(ckpt['optimizer'])
        except ValueError as e:        # e.g. another mixing_lr_mult: other parameter groups
            fail(f"the checkpoint's optimizer state does not fit these settings: {e}")
        step, best_val = ckpt['step'], ckpt['best_val_loss']
        if rank < len(ckpt['rng']):
            torch.set_rng_state(ckpt['rng'][rank]['torch'])
            batch_gen.set_state(ckpt['rng'][rank]['batch'])
        say(f'resumed from {ckpt_path} at step {step}')
    raw_model = model
    if cfg['compile']:
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[local] if dev.startswith('cuda') else None)

    tokens_per_step = cfg['batch_size'] * cfg['n_ctx'] * cfg['grad_accum'] * world
    flops_per_token = raw_model.flops_per_token(cfg['n_ctx'])
    peak_measured = mixer.measure_matmul_flops(dev, torch.bfloat16 if dt_name == 'bfloat16' else torch.float32)
    peak_nominal = mixer.nominal_peak(dev)
    log_path = os.path.join(cfg['out_dir'], 'log.jsonl')
    log = open(log_path, 'a') if master else None

    def write_log(rec):
        if log:
            log.write(json.dumps(rec) + '\n')
            log.flush()

    write_log({'event': 'config', 'config': cfg, 'model_config': asdict(model_cfg), 'world_size': world,
               'device': dev, 'dtype': dt_name, 'params': raw_model.num_params(),
               'flops_per_token': flops_per_token, 'peak_flops_measured': peak_measured,
               'peak_flops_nominal': peak_nominal})
    say(f'{var} ({model_cfg.kind}, mixing={model_cfg.mixing}, task={cfg["task"]}): '
        f'{raw_model.num_params() / 1e6:.2f}M params, {flops_per_token / 1e6:.1f} MFLOP/token (fwd+bwd), '
        f'{world} process(es) on {dev}, {dt_name}, {tokens_per_step} tokens/step')
    peak_text = f'measured {dt_name} matmul peak {peak_measured / 1e9:.0f} GFLOP/s per process'
    if peak_nominal:
        peak_text += f', nominal {peak_nominal / 1e12:.0f} TFLOP/s'
    say(f'MFU is reported against the {peak_text}')

    def save():
        state = {'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(),
                 'model_config': asdict(model_cfg), 'config': cfg, 'step': step,
                 'best_val_loss': best_val, 'rng': rng_states,
                 'tokenizer': {'file': os.path.abspath(os.path.join(cfg['data_dir'], meta['tokenizer'])),
                               'sha256': meta['tokenizer_sha256']}}
        tmp = ckpt_path + '.tmp'
        torch.save(state, tmp)
        os.replace(tmp, ckpt_path)                 # atomic: a crash never leaves half a checkpoint

    def gather_rng():
        mine = {'torch': torch.get_rng_state(), 'batch': batch_gen.get_state()}
        if not ddp:
            return [mine]
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        return everyone

    bytes_per_token = meta['val']['bytes_per_token']
    n_ctx = cfg['n_ctx']
    t_last, stats = time.perf_counter(), []
    while True:
        if step % cfg['eval_interval'] == 0 or step == cfg['max_iters']:
            rng_states = gather_rng()
            if master:
                ev = evaluate(raw_model, val_data, cfg, dev, autocast, bytes_per_token)
                best_val = min(best_val, ev['val_loss'])
                print(f'step {step:5d} | val loss {ev["val_loss"]:.4f} nats/token | '
                      f'{ev["val_bpb"]:.4f} bits/byte | acc {ev["val_acc"]:.3f}', flush=True)
                write_log({'event': 'eval', 'step': step, **ev})
                if cfg['save_checkpoint'] and step > 0:
                    save()
            t_last = time.perf_counter()           # evaluation time is not training time
        if step >= cfg['max_iters']:
            break
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group['lr'] = lr * group.get('lr_mult', 1.0)   # checkpoints from before lr_mult: 1
        loss_sum = 0.0
        for micro in range(cfg['grad_accum']):
            starts = torch.randint(len(train_data) - n_ctx - 1, (cfg['batch_size'],), generator=batch_gen)
            x, y = get_batch(train_data, starts, n_ctx, cfg['task'], dev)
            # DDP all-reduces gradients on every backward; only the last micro-step needs it.
            sync = not ddp or micro == cfg['grad_accum'] - 1
            with (nullcontext() if sync else model.no_sync()), autocast:
                _, loss = model(x, y)
                (loss / cfg['grad_accum']).backward()
            loss_sum += loss.item()
        if cfg['grad_clip'] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg['grad_clip'])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if dev.startswith('cuda'):
            torch.cuda.synchronize()
        now = time.perf_counter()
        stats.append(now - t_last)
        t_last = now
        if step % cfg['log_interval'] == 0 and master:
            ms = 1000 * float(np.median(stats))
            tok_s = tokens_per_step / (ms / 1000)
            mfu = flops_per_token * tok_s / world / peak_measured
            rec = {'event': 'train', 'step': step, 'loss': loss_sum / cfg['grad_accum'], 'lr': lr,
                   'ms_per_step': ms, 'tokens_per_s': tok_s, 'mfu': mfu}
            extra = ''
            if peak_nominal:
                rec['mfu_nominal'] = flops_per_token * tok_s / world / peak_nominal
                extra = f' ({100 * rec["mfu_nominal"]:.1f}% of nominal)'
            print(f'step {step:5d} | loss {rec["loss"]:.4f} | lr {lr:.2e} | {ms:.1f} ms/step | '
                  f'{tok_s:,.0f} tok/s | MFU {100 * mfu:.1f}%{extra}', flush=True)
            write_log(rec)
            stats = []
    if ddp:
        dist.barrier()                 # rank 0 may still be evaluating and saving
        dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1:])
