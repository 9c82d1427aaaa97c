"""A run folder: the checkpoint format (one save_checkpoint, one load_checkpoint, for every
script), the run's JSON-lines log, and the lock that keeps one run to a folder.

train.py saves; sample.py, retrieval.py, claims.py and train.py's
--init_from=resume load. A checkpoint is a torch.save'd dict:

    'model'           state dict of the model (mixer.LanguageModel or mixer.Autoencoder),
                      float32 tensors under their module names (no '_orig_mod.' or
                      'module.' prefix; one written with either still loads)
    'model_config'    dict of mixer.ModelConfig fields: the architecture, vocab_size included
    'config'          dict of train.py's settings for the run (resume restores them)
    'optimizer'       AdamW state dict ('optimizer_muon': Muon's, with optimizer='muon')
    'step'            int, optimiser steps done
    'tokens_seen'     int, tokens trained on over every process, across resumes with another batch
                      (absent before issue 90: tokens_seen() counts step x the saved tokens a step)
    'best_val_loss'   float, nats/token
    'rng'             list, one dict per rank: 'torch' and 'batch' (the window generator, the same
                      on every rank) byte tensors, 'cuda' (or None)
    'tokenizer'       dict: 'text' (the tiktoken rank file, "base64(token) rank" lines),
                      'sha256' (of that text), 'file' (where it was read from): the
                      checkpoint alone is enough to sample from it

Writes are atomic (cli.written: a temporary file, then os.replace): a crash never leaves half a
checkpoint, and a failed write (a full disk) removes its temporary file and keeps the
previous checkpoint. log.jsonl gets one complete line a record (one write, or none);
a line torn by a crash is dropped, with a warning, wherever a log is read or resumed.
Every reader also takes a folder exported by experiments/convert.py (read_exported), unpickling nothing:
its config.json holds the entries above but 'model', the optimiser's and 'rng', and is checked as a
checkpoint is (check_format: the same required entries, the same messages). A checkpoint imported by
convert.py has no 'optimizer': resume starts a fresh one.
"""

import errno
import hashlib
import json
import os
import shutil
import sys

import torch
import torch.distributed as dist

import mixer
from harness.cli import fail, hold_lock, one_line, remove_stale_temps, write_atomic, written

PREFIXES = ('_orig_mod.', 'module.')     # torch.compile's and DDP's wrappers
EXPORT_FILES = ('config.json', 'model.safetensors', 'tokenizer.tiktoken')    # a folder convert.py exported
# The format's entries: the type each must have, in words (check_format)
FORMAT = {'model': (dict, 'a dict of tensors'), 'model_config': (dict, 'a dict'), 'config': (dict, 'a dict'),
          'step': (int, 'an int >= 0'), 'best_val_loss': ((int, float), 'a number'), 'rng': (list, 'a list'),
          'tokenizer': (dict, 'a dict')}


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


def read_log(path, warn=True):
    """The records of a JSON-lines log (list of dicts; [] if there is no file). A last line cut short
    by a crash is dropped, with a warning on stderr (unless not `warn`: a second reader); a damaged line
    before it, or a line anywhere that is JSON but not a record (a number, a list, a string: no crash writes
    one), raises CheckpointError naming the file and line."""
    if not os.path.isfile(path):
        return []
    with open(path, 'rb') as f:
        lines = f.read().split(b'\n')
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            if i < len(lines) - 1 and any(l.strip() for l in lines[i + 1:]):
                raise CheckpointError(f'{path}, line {i + 1}: not a JSON record (a damaged log)') from None
            if warn:
                print(f'warning: {path}: its last line was cut short (a crash); dropped', file=sys.stderr)
            continue
        if not isinstance(rec, dict):
            from data.tokenizer import json_type      # here: a run that reads its log whole needs no tokenizer
            raise CheckpointError(f'{path}, line {i + 1}: a JSON {json_type(rec)}, not a record (an object): '
                                  'a damaged log')
        records.append(rec)
    return records


def resume_log(path, step):
    """Prepare a log for a run resumed from a checkpoint of `step`: drop a torn last line and the
    records of steps after `step` (written after the checkpoint by a run that was then killed, they
    would appear twice), rewriting the file atomically, with a warning naming what was dropped."""
    records = read_log(path)
    keep = kept_on_resume(records, step)
    if len(keep) < len(records):
        print(f'warning: {path}: dropped {len(records) - len(keep)} records after step {step}, the checkpoint\'s '
              '(the run that wrote them stopped before its next checkpoint)', file=sys.stderr)
    write_atomic(path, ''.join(json.dumps(r) + '\n' for r in keep))


def kept_on_resume(records, step):
    """The log records (list of dicts) a run resumed from a checkpoint of `step` keeps: all but those of later
    steps."""
    return [r for r in records if not isinstance(r.get('step'), int) or r['step'] <= step]


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


def read_checkpoint(path, device='cpu', keys=('config', 'step')):
    """The raw checkpoint dict at `path`, tensors on `device` ('cpu:0' too), with its model state dict
    stripped of wrapper prefixes. Raises CheckpointError (one line) on a missing or unreadable file, one
    that check_format refuses (the format's model entries, then `keys`: the first missing or of another
    type, named); for a folder, one saying so (and naming FOLDER/ckpt.pt when the folder holds one: a run
    folder given for its checkpoint), unless it is an exported folder (read_exported; one that lacks a
    file is told which)."""
    if os.path.isdir(path) and any(os.path.isfile(os.path.join(path, f)) for f in EXPORT_FILES[:2]):
        return read_exported(path, 'cpu' if torch.device(device).type == 'cpu' else device, keys)
    if os.path.isdir(path):
        inside = os.path.join(path, 'ckpt.pt')
        raise CheckpointError(f'checkpoint {path!r} is a folder, not a checkpoint file; '
                              + (f'did you mean {inside!r}?' if os.path.isfile(inside) else
                                 'train.py writes OUT_DIR/ckpt.pt'))
    if not os.path.isfile(path):
        raise CheckpointError(f'checkpoint {path!r} not found')
    where = 'cpu' if torch.device(device).type == 'cpu' else device      # torch.load knows no 'cpu:0'
    try:
        ckpt = torch.load(path, map_location=where, weights_only=True)
        ckpt['model_config']
    except Exception as e:  # torch raises many types for a damaged file
        raise CheckpointError(f'checkpoint {path!r} is corrupt or not from train.py ({one_line(e)})') from None
    check_format(ckpt, f'checkpoint {path!r}', keys, 'not a checkpoint of train.py (checkpoint.py)')
    return migrate(ckpt)


def check_format(ckpt, where, keys=('config', 'step'), whose='not a checkpoint of train.py'):
    """Raise CheckpointError (one line: `where`, e.g. "checkpoint 'out/ckpt.pt'", then the entry) unless the
    checkpoint dict `ckpt` holds 'model' (a dict of floating-point tensors), 'model_config' and each of
    `keys`, each of the type FORMAT gives it ('config' a dict, 'step' an int >= 0, ...): a missing entry is
    named with `whose` (what the input then is not), one of another type with what it is."""
    for key in ('model', 'model_config', *keys):
        if key not in ckpt:
            raise CheckpointError(f'{where} has no {key!r}: {whose}')
        kind, words = FORMAT[key]
        value = ckpt[key]
        if not isinstance(value, kind) or isinstance(value, bool) or key == 'step' and value < 0:
            raise CheckpointError(f'{where}: {key!r} is {_what(value)}, not {words}')
    for key, value in ckpt['model'].items():
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise CheckpointError(f"{where} holds {key} as {_what(value)}: a model's weights are floating-point "
                                  'tensors')


def _what(value):
    """What `value` is, in a few words: a number or None itself, a tensor's dtype, else its type's name."""
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return str(value.dtype) if isinstance(value, torch.Tensor) else f'a {type(value).__name__}'


def read_exported(path, device='cpu', keys=('config', 'step')):
    """The checkpoint dict of a folder experiments/convert.py exported, read without unpickling anything:
    config.json (the checkpoint's entries but its tensors and optimiser state), model.safetensors (the state
    dict; a tied tensor stored once, its other names in the file's metadata, as safetensors.torch.save_model
    writes them: with_aliases) and tokenizer.tiktoken. Raises CheckpointError (one line) naming a missing
    file, for a damaged one, and as read_checkpoint does for what config.json lacks (check_format, `keys`)."""
    where = f'exported folder {path!r}'
    missing = [f for f in EXPORT_FILES if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise CheckpointError(f'{where} lacks {" and ".join(missing)} (experiments/convert.py --ckpt writes '
                              f'{", ".join(EXPORT_FILES)})')
    try:
        from safetensors import safe_open  # here: the rest of the project runs without it
        with open(os.path.join(path, 'config.json'), encoding='utf-8') as f:
            ckpt = json.load(f)
        if not isinstance(ckpt, dict):
            raise ValueError(f'its config.json holds a JSON {type(ckpt).__name__}, not an object')
        with safe_open(os.path.join(path, 'model.safetensors'), 'pt', device=str(device)) as f:
            state, aliases = {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}
        with open(os.path.join(path, 'tokenizer.tiktoken'), encoding='ascii', newline='') as f:
            text = f.read()
    except Exception as e:  # safetensors missing; json, safetensors and the OS raise many types for a damaged folder
        raise CheckpointError(f'{where} cannot be read ({one_line(e)})') from None
    ckpt['model'] = with_aliases(state, aliases, where)
    check_format(ckpt, where, (*keys, 'tokenizer'), 'its config.json is not one experiments/convert.py wrote')
    ckpt['tokenizer'] = {**ckpt['tokenizer'], 'file': os.path.abspath(os.path.join(path, 'tokenizer.tiktoken')),
                         'text': text}
    return migrate(ckpt)


def with_aliases(state, aliases, where):
    """A safetensors state dict with its shared tensors under each name: `aliases` is the file's metadata,
    {name: the stored name it shares} (safetensors.torch.save_model's; other metadata, e.g. 'format', is
    passed over). Raises CheckpointError (one line, `where` naming the file) when the file also holds a
    name its metadata ties to another tensor, with other values (two different matrices said to be one)."""
    for name, stored in aliases.items():
        if name in state and stored in state and not torch.equal(state[name], state[stored]):
            raise CheckpointError(f'{where} ties {name} to {stored} (its metadata) but holds two different '
                                  'tensors under those names')
    return {**{k: state[v] for k, v in aliases.items() if v in state}, **state}


def migrate_state(state, model_config=None):
    """A model state dict in today's names: torch.compile's '_orig_mod.' and DDP's 'module.' prefixes
    removed; an older checkpoint's masked-mixing W1 [H, k, x n_ctx, n_ctx] and c1 named W and c (W1's
    k = 1 axis dropped); the recurrent mixing's decay_logit named a_logit; the hybrid's mixing 'mix' named
    'token_mixing'. With its (migrated) model_config: an autoencoder with posenc saved before its encoder
    had positions gets wpe = 0, which adds none (the model it was)."""
    out = {}
    for k, v in state.items():
        while k.startswith(PREFIXES):
            k = k.split('.', 1)[1]
        if k.endswith(('.W1', '.c1')):
            k, v = k[:-1], v[:, 0] if v.dim() == 4 and v.shape[1] == 1 else v
        k = k.replace('.mixing.mix.', '.mixing.token_mixing.')
        out[k.removesuffix('decay_logit') + 'a_logit' if k.endswith('decay_logit') else k] = v
    cfg = model_config if isinstance(model_config, dict) else {}
    if cfg.get('task') == 'autoencode' and cfg.get('posenc') and 'wpe' not in out and 'wte.weight' in out:
        out['wpe'] = out['wte.weight'].new_zeros(cfg['n_ctx'], out['wte.weight'].shape[1])
    return out


# an older checkpoint's settings -> today's: the names, then (name, value) -> the value
RENAMED = {'mixing': 'token_mixing', 'embed_linear': 'embed_proj', 'kernel': 'feature_kernel',
           'hybrid': 'hybrid_form'}
RENAMED_VALUES = {('token_mixing', 'dense'): 'flat', ('mixing_init', 'decay'): 'average',
                  ('variant', 'linear'): 'linear_mixer'}


def migrate_config(config):
    """A model_config or train.py settings dict in today's names and values (RENAMED, RENAMED_VALUES) -> a
    new dict; a non-dict is returned as it is (the callers' checks name it)."""
    if not isinstance(config, dict):
        return config
    out = {RENAMED.get(k, k): v for k, v in config.items()}
    return {k: RENAMED_VALUES.get((k, v), v) if isinstance(v, str) else v for k, v in out.items()}


def migrate(ckpt):
    """A checkpoint dict read from any version in today's names (migrate_state, migrate_config) -> ckpt."""
    for key in ('model_config', 'config'):
        if key in ckpt:
            ckpt[key] = migrate_config(ckpt[key])
    ckpt['model'] = migrate_state(ckpt['model'], ckpt.get('model_config'))
    return ckpt


def reshape_optimizer_state(opt):
    """Give an optimiser's loaded state the shapes of its parameters where only the shape differs (the
    same number of values): a state saved before the masked mixings' W lost its [H, 1, ...] axis."""
    for p, st in opt.state.items():
        for k, v in st.items():
            if torch.is_tensor(v) and v.shape != p.shape and v.numel() == p.numel():
                st[k] = v.reshape(p.shape)


def load_checkpoint(path, device='cpu'):
    """Load a checkpoint -> (model in eval mode on `device`, tiktoken.Encoding (checkpoint_tokenizer),
    checkpoint dict). Raises CheckpointError on a missing or corrupt checkpoint (read_checkpoint: integer
    weights among them), a missing, corrupt or different tokenizer, weights that are not all finite (NaN or
    inf: nothing the model computes would be a number; checked once, here) or tied weights (one tensor
    under two names in the model, e.g. wte and lm_head) held as two different tensors."""
    ckpt = read_checkpoint(path, device)
    where = f'exported folder {path!r}' if os.path.isdir(path) else f'checkpoint {path!r}'
    try:
        model = mixer.build_model(mixer.ModelConfig(**ckpt['model_config']))
        model.load_state_dict(ckpt['model'])
    except Exception as e:
        raise CheckpointError(f'{where} does not fit its own model_config ({one_line(e)})') from None
    for name in (k for k, p in model.named_parameters() if not p.isfinite().all()):
        raise CheckpointError(f'{where} holds weights that are not finite (NaN or inf in {name})')
    shared = {}                             # a tensor the model uses under two names: tied embeddings
    for name, p in model.named_parameters(remove_duplicate=False):
        shared.setdefault(p, []).append(name)
    for names in (n for n in shared.values() if len(n) > 1):
        held = [k for k in names if k in ckpt['model']]
        if any(not torch.equal(ckpt['model'][k], ckpt['model'][held[0]]) for k in held[1:]):
            raise CheckpointError(f'{where} holds two different tensors as {" and ".join(held)}, which '
                                  'its model_config ties (one tensor): a damaged file, or not this model\'s')
    return model.to(device).eval(), checkpoint_tokenizer(ckpt, path), ckpt


def checkpoint_tokenizer(ckpt, path='checkpoint'):
    """The tiktoken.Encoding of a checkpoint dict: its embedded rank file text (ckpt['tokenizer']['text'])
    or, for an older checkpoint without one, the file at ckpt['tokenizer']['file']; either must match
    ckpt['tokenizer']['sha256']. `path` names the checkpoint in errors. Raises CheckpointError otherwise."""
    from data.tokenizer import load_tokenizer, tokenizer_from_text, tokenizer_sha256   # here: train.py needs none
    tok = ckpt.get('tokenizer')
    if not isinstance(tok, dict) or 'sha256' not in tok or not ('text' in tok or 'file' in tok):
        raise CheckpointError(f'checkpoint {path!r} records no tokenizer (not from train.py)')
    if 'text' in tok:
        if not isinstance(tok['text'], str) or \
                hashlib.sha256(tok['text'].encode('utf-8')).hexdigest() != tok['sha256']:
            raise CheckpointError(f'the tokenizer embedded in checkpoint {path!r} does not match its '
                                  'SHA-256 (a damaged file, or the data dir\'s tokenizer changed after '
                                  'data/prepare.py wrote it)')
    elif not os.path.isfile(tok['file']):
        raise CheckpointError(f"tokenizer {tok['file']!r} recorded in the checkpoint not found "
                              '(an older checkpoint without its tokenizer: run data/prepare.py)')
    elif tokenizer_sha256(tok['file']) != tok['sha256']:
        raise CheckpointError(f"tokenizer {tok['file']!r} differs from the one the model was trained with")
    try:
        if 'text' in tok:
            return tokenizer_from_text(tok['text'], f'tokenizer embedded in {path!r}')
        return load_tokenizer(tok['file'])
    except ValueError as e:
        raise CheckpointError(str(e)) from None


# ----------------------------------------------------------------------------- a run and its folder

def claim_run_folder(cfg, ckpt, rank=0):
    """Lock out_dir on rank 0 and refuse a fresh run on an old one unless overwrite; changes no file
    of the folder -> lock (None on other ranks). Raises CheckpointError (one line)."""
    if rank != 0:
        return None
    lock = lock_run(cfg['out_dir'])
    old = [f for f in ('ckpt.pt', 'log.jsonl') if os.path.exists(os.path.join(cfg['out_dir'], f))]
    if ckpt is None and old == ['log.jsonl'] and not cfg['overwrite']:
        raise CheckpointError(f'{cfg["out_dir"]} holds the log.jsonl of a run that saved no checkpoint (nothing to '
                              'resume): pass --overwrite=True to replace it, or choose another --out_dir')
    if ckpt is None and old and not cfg['overwrite']:
        raise CheckpointError(f'{cfg["out_dir"]} already holds a run (ckpt.pt / log.jsonl): '
                              f'pass --init_from=resume to continue it or --overwrite=True to replace it')
    return lock


def prepare_run_folder(cfg, ckpt, rank=0):
    """After every check passed: remove an old run's files (overwrite) or drop the log records after the
    checkpoint's step (resume) -> log.jsonl open for appending (None on other ranks)."""
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
            resume_log(log_path, ckpt['step'])
        return open(log_path, 'ab')
    except OSError as e:
        raise CheckpointError(f'cannot prepare {cfg["out_dir"]} ({one_line(e)})') from None


def check_tokenizer(ckpt, meta, data_dir):
    """Raise CheckpointError (one line) when the data (its meta.json, `meta`, of data_dir) was encoded with
    another tokenizer than the checkpoint dict `ckpt` (None: a fresh run, nothing to check)."""
    if ckpt is not None and ckpt.get('tokenizer', {}).get('sha256') != meta['tokenizer_sha256']:
        raise CheckpointError(
            f'the data in {data_dir} was encoded with another tokenizer (sha256 {meta["tokenizer_sha256"][:12]}...) '
            f'than the checkpoint\'s ({ckpt.get("tokenizer", {}).get("sha256", "?")[:12]}...): its token ids mean '
            'other text; prepare the data with the checkpoint\'s tokenizer')


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
            raise CheckpointError(f"the checkpoint's optimizer state does not fit these settings: {e}") from None
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
    fail("the checkpoint format's module, not a command: train.py writes checkpoints, sample.py reads them", 'harness/checkpoint.py')
