"""The checkpoint format and what train.py writes with it: save_checkpoint, the run's JSON-lines log
(append_log), the lock that keeps one run to a folder, and a resumed run's states (restore). Every
reader (load_checkpoint, read_checkpoint, read_log, an exported folder) is harness/loading.py's, which a
fresh run does not import.

train.py saves; sample.py, retrieval.py, claims.py and train.py's --init_from=resume load. A checkpoint
is a torch.save'd dict:

    'model'           state dict of the model (mixer.LanguageModel or mixer.Autoencoder),
                      float32 tensors under their module names (no '_orig_mod.' or
                      'module.' prefix; one written with either still loads)
    'model_config'    dict of mixer.ModelConfig fields: the architecture, vocab_size included
    'config'          dict of train.py's settings for the run (resume restores them)
    'optimizer'       AdamW state dict ('optimizer_muon': Muon's, with optimizer='muon')
    'step'            int, optimiser steps done
    'tokens_seen'     int, tokens trained on over every process, across resumes with another batch
                      (absent before issue 90: tokens_seen() counts step x the saved tokens per step)
    'best_val_loss'   float, nats/token
    'rng'             list, one dict per rank: 'torch' and 'batch' (the window generator, the same
                      on every rank) byte tensors, 'cuda' (or None)
    'tokenizer'       dict: 'text' (the tiktoken rank file, "base64(token) rank" lines),
                      'sha256' (of that text), 'file' (where it was read from): the
                      checkpoint alone is enough to sample from it

Writes are atomic (cli.written: a temporary file, then os.replace): a crash never leaves half a
checkpoint, and a failed write (a full disk) removes its temporary file and keeps the
previous checkpoint. log.jsonl gets one complete line per record (one write, or none);
a line torn by a crash is dropped, with a warning, wherever a log is read or resumed.
Every reader also takes a folder exported by experiments/convert.py (loading.read_exported), unpickling
nothing: its config.json holds the entries above but 'model', the optimiser's and 'rng', and is checked as
a checkpoint is (loading.check_format: the same required entries, the same messages). A checkpoint
imported by convert.py has no 'optimizer': resume starts a fresh one.
"""

import errno
import json
import os
import shutil

import torch
import torch.distributed as dist

from harness.cli import fail, hold_lock, one_line, written


class CheckpointError(ValueError):
    """A checkpoint or its tokenizer cannot be used (the message is one line)."""


def save_checkpoint(path, model, model_config, config, step, best_val_loss, rng, tokenizer_path,
                    tokenizer_sha, optimizers=(), tokens_seen=None):
    """Write a checkpoint (the format above) to `path`, atomically. model: the unwrapped model;
    model_config: a dict of its mixer.ModelConfig; config: train.py's settings; rng: a list of RNG dicts, one
    per rank; optimizers: pairs (key, torch.optim.Optimizer), e.g. [('optimizer', adamw)]; tokenizer_path /
    tokenizer_sha: the rank file the data was encoded with; tokens_seen: the tokens trained on so far (None:
    not recorded). A failed write: CheckpointError."""
    with open(tokenizer_path, encoding='ascii', newline='') as f:
        text = f.read()
    state = {'model': model.state_dict(), **{k: o.state_dict() for k, o in optimizers},
             'model_config': model_config, 'config': config, 'step': step, 'best_val_loss': best_val_loss,
             'rng': rng, 'tokenizer': {'file': os.path.abspath(tokenizer_path), 'sha256': tokenizer_sha,
                                       'text': text}}
    if tokens_seen is not None:
        state['tokens_seen'] = tokens_seen
    try:                                    # a failed write, or Ctrl-C during it: no half-written file
        with written(path) as tmp:
            torch.save(state, tmp)
    except (OSError, RuntimeError) as e:    # torch reports a full disk as 'unexpected pos ...'
        raise CheckpointError(f'could not write {path} ({write_error(e, path)}); the previous checkpoint, '
                              'if any, is kept') from None


def tokens_per_step(cfg, world):
    """Tokens of one optimiser step over all processes: batch_size x n_ctx x grad_accum x world."""
    return cfg['batch_size'] * cfg['n_ctx'] * cfg['grad_accum'] * world


def tokens_seen(ckpt, settings=None):
    """Tokens a checkpoint dict's run has trained on, over every process (int; 0 for None, a fresh run): its
    'tokens_seen', or, for one saved before it was kept, step x the saved settings' batch_size x n_ctx x
    grad_accum (`settings`, train.py's, where they lack one) x the ranks that saved it (its 'rng' list; one
    for an import's empty list)."""
    if ckpt is None:
        return 0
    if isinstance(ckpt.get('tokens_seen'), int):
        return ckpt['tokens_seen']
    cfg = {**(settings or {}), **ckpt.get('model_config', {}), **ckpt.get('config', {})}
    world = max(1, len(ckpt.get('rng') or []))
    return ckpt['step'] * tokens_per_step({'grad_accum': 1, **cfg}, world)


def write_error(e, path, need=1 << 20):
    """The cause of a failed write to `path`, one line: the exception's, or 'no space left on device'
    when the disk has less than `need` bytes free (torch.save does not say so itself)."""
    try:
        full = getattr(e, 'errno', None) == errno.ENOSPC or \
            shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free < need
    except OSError:
        full = False
    return 'no space left on device' if full else one_line(e)


# ----------------------------------------------------------------------------- the log and the lock

def append_log(f, rec):
    """Append the JSON record `rec` to the log file f (opened in binary append mode) as one complete
    line, in one write: a failed or short write is cut back off, so the log never holds half a line.
    Raises OSError (the disk full, say) with the log as it was."""
    data = (json.dumps(rec) + '\n').encode('utf-8')
    end = f.seek(0, os.SEEK_END)
    try:
        if os.write(f.fileno(), data) != len(data):
            raise OSError(errno.ENOSPC, 'short write')
    except OSError:
        os.ftruncate(f.fileno(), end)
        raise


def lock_run(out_dir):
    """Hold an exclusive lock on the run folder for this process's life -> the open lock file (keep it). The
    OS releases the lock when the process dies, however it dies, so a killed run never blocks the next.
    Raises CheckpointError naming the run (its pid) that holds it, or when the folder cannot be written or
    locked."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        f = open(os.path.join(out_dir, '.lock'), 'a+')
    except OSError as e:
        raise CheckpointError(f'cannot write to the run folder {out_dir!r} ({one_line(e)})') from None
    try:
        taken = hold_lock(f.fileno())
    except OSError as e:                    # a file system that cannot lock
        f.close()
        raise CheckpointError(f'cannot lock the run folder {out_dir!r} ({one_line(e)})') from None
    if not taken:
        f.seek(0)
        pid = f.read().strip() or '?'
        f.close()
        raise CheckpointError(f'{out_dir} is in use by another run (pid {pid}); wait for it, or choose '
                              'another --out_dir') from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def reshape_optimizer_state(opt):
    """Give an optimiser's loaded state the shapes of its parameters where only the shape differs (the
    same number of values): a state saved before the masked mixings' W lost its [H, 1, ...] axis."""
    for p, st in opt.state.items():
        for k, v in st.items():
            if torch.is_tensor(v) and v.shape != p.shape and v.numel() == p.numel():
                st[k] = v.reshape(p.shape)


# ----------------------------------------------------------------------------- a run and its folder

def claim_run_folder(cfg, ckpt, rank=0):
    """Lock out_dir on rank 0 and refuse a fresh run on an old one unless overwrite; changes no file
    of the folder -> lock (None on other ranks). Raises CheckpointError (one line)."""
    if rank != 0:
        return None
    lock = lock_run(cfg['out_dir'])
    old = [f for f in ('ckpt.pt', 'log.jsonl') if os.path.exists(os.path.join(cfg['out_dir'], f))]
    if ckpt is None and old == ['log.jsonl'] and not cfg['overwrite']:
        raise CheckpointError(f'{cfg["out_dir"]} holds the log.jsonl of a run that saved no checkpoint '
                              '(nothing to resume): pass --overwrite=True to replace it, or choose another '
                              '--out_dir')
    if ckpt is None and old and not cfg['overwrite']:
        raise CheckpointError(f'{cfg["out_dir"]} already holds a run (ckpt.pt / log.jsonl): '
                              f'pass --init_from=resume to continue it or --overwrite=True to replace it')
    return lock


def check_tokenizer(ckpt, meta, data_dir):
    """Raise CheckpointError (one line) when the data (its meta.json, `meta`, of data_dir) was encoded with
    another tokenizer than the checkpoint dict `ckpt` (None: a fresh run, nothing to check)."""
    if ckpt is not None and ckpt.get('tokenizer', {}).get('sha256') != meta['tokenizer_sha256']:
        raise CheckpointError(
            f'the data in {data_dir} was encoded with another tokenizer (sha256 '
            f'{meta["tokenizer_sha256"][:12]}...) than the checkpoint\'s '
            f'({ckpt.get("tokenizer", {}).get("sha256", "?")[:12]}...): its token ids mean other text; '
            'prepare the data with the checkpoint\'s tokenizer')


def restore(ckpt, model, optimizers, batch_gen, env):
    """Load a checkpoint's model, optimiser and RNG states in place -> (step, tokens seen, best val loss).
    Every rank restores rank 0's window generator (draw_windows' rule: one generator, the same on every rank;
    a run resumed on more processes than it was saved from too) and its own torch RNG state where the
    checkpoint holds one (a new rank keeps its fresh seed). Tokens seen: the checkpoint's count, or for an
    older checkpoint the steps times the saved run's tokens per step. Betas and weight decay stay those of
    the current settings, not the saved state's. Raises CheckpointError when the optimiser state does not fit
    (other parameter groups)."""
    model.load_state_dict(ckpt['model'])
    for key, opt in optimizers:
        if key not in ckpt:                   # imported by experiments/convert.py: no optimiser state
            if env.master:
                print(f'note: the checkpoint holds no {key} state (an imported model): a fresh one starts')
            continue
        fresh = [{k: v for k, v in g.items() if k != 'params'} for g in opt.param_groups]
        try:
            opt.load_state_dict(ckpt[key])
            reshape_optimizer_state(opt)
        except (ValueError, KeyError) as e:   # e.g. another mixing_lr_mult: other parameter groups
            raise CheckpointError(f"the checkpoint's optimizer state does not fit these settings: {e}") \
                from None
        for g, f in zip(opt.param_groups, fresh):
            g.update(f)
    if ckpt['rng']:                           # (an imported checkpoint has none: a fresh generator)
        batch_gen.set_state(ckpt['rng'][0]['batch'])
    if env.rank < len(ckpt['rng']):
        rng = ckpt['rng'][env.rank]
        torch.set_rng_state(rng['torch'])
        if env.cuda and rng.get('cuda') is not None:
            torch.cuda.set_rng_state(rng['cuda'], env.dev)
    return ckpt['step'], tokens_seen(ckpt), ckpt['best_val_loss']


def gather_rng(batch_gen, env):
    """Every rank's RNG states (torch, window generator, CUDA) -> list, one dict a rank."""
    mine = {'torch': torch.get_rng_state(), 'batch': batch_gen.get_state(),
            'cuda': torch.cuda.get_rng_state(env.dev) if env.cuda else None}
    if not env.ddp:
        return [mine]
    everyone = [None] * env.world
    dist.all_gather_object(everyone, mine)
    return everyone


if __name__ == '__main__':
    fail("the checkpoint format's module, not a command: train.py writes checkpoints, sample.py reads them",
         'harness/checkpoint.py')
