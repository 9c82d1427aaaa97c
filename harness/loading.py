"""Reading what train.py wrote, for every script that reads it: a checkpoint of any version, migrated to
today's names (read_checkpoint, load_checkpoint, checkpoint_tokenizer), a folder experiments/convert.py
exported (read_exported: unpickling nothing) and a run's JSON-lines log (read_log; resume_log for a
resumed run). The format is harness/checkpoint.py's; a fresh training run imports none of this.

    model, enc, ckpt = load_checkpoint('out/tinystories_cpu/ckpt.pt')      # eval mode; tiktoken.Encoding
    records = read_log('out/tinystories_cpu/log.jsonl')                   # list of dicts
"""

import hashlib
import json
import os
import sys

import torch

import mixer
from harness.checkpoint import CheckpointError
from harness.cli import fail, one_line, write_atomic

PREFIXES = ('_orig_mod.', 'module.')     # torch.compile's and DDP's wrappers


EXPORT_FILES = ('config.json', 'model.safetensors', 'tokenizer.tiktoken')    # a folder convert.py exported


# The format's entries: the type each must have, in words (check_format)
FORMAT = {'model': (dict, 'a dict of tensors'), 'model_config': (dict, 'a dict'), 'config': (dict, 'a dict'),
          'step': (int, 'an int >= 0'), 'best_val_loss': ((int, float), 'a number'), 'rng': (list, 'a list'),
          'tokenizer': (dict, 'a dict')}


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
            from data.tokenizer import json_type      # here: a log read whole needs no tokenizer
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
        print(f'warning: {path}: dropped {len(records) - len(keep)} records after step {step}, the '
              'checkpoint\'s (the run that wrote them stopped before its next checkpoint)', file=sys.stderr)
    write_atomic(path, ''.join(json.dumps(r) + '\n' for r in keep))


def kept_on_resume(records, step):
    """The log records (list of dicts) a run resumed from a checkpoint of `step` keeps: all but those of later
    steps."""
    return [r for r in records if not isinstance(r.get('step'), int) or r['step'] <= step]


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
        raise CheckpointError(f'checkpoint {path!r} is corrupt or not from train.py ({one_line(e)})') \
            from None
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
            raise CheckpointError(f"{where} holds {key} as {_what(value)}: a model's weights are "
                                  'floating-point '
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
    except Exception as e:  # safetensors missing, or a damaged folder (json, safetensors, the OS: many types)
        raise CheckpointError(f'{where} cannot be read ({one_line(e)})') from None
    ckpt['model'] = with_aliases(state, aliases, where)
    check_format(ckpt, where, (*keys, 'tokenizer'), 'its config.json is not one experiments/convert.py wrote')
    ckpt['tokenizer'] = {**ckpt['tokenizer'],
                         'file': os.path.abspath(os.path.join(path, 'tokenizer.tiktoken')),
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
    from data.tokenizer import load_tokenizer, tokenizer_from_text, tokenizer_sha256   # here: train: none
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


if __name__ == '__main__':
    fail("the checkpoint and log readers, not a command: sample.py reads checkpoints, python -m "
         "experiments.compare reads logs", 'harness/loading.py')
