"""The checkpoint format: one save_checkpoint, one load_checkpoint, for every script.

train.py saves; sample.py, retrieval.py, claims.py and train.py's
--init_from=resume load. A checkpoint is a torch.save'd dict:

    'model'           state dict of the model (mixer.LanguageModel or mixer.Autoencoder),
                      float32 tensors under their module names (no '_orig_mod.' or
                      'module.' prefix; one written with either still loads)
    'model_config'    dict of mixer.ModelConfig fields: the architecture, vocab_size included
    'config'          dict of train.py's settings for the run (resume restores them)
    'optimizer'       AdamW state dict ('optimizer_muon': Muon's, with optimizer='muon')
    'step'            int, optimiser steps done
    'best_val_loss'   float, nats/token
    'rng'             list, one dict a rank: 'torch' and 'batch' (the window generator)
                      byte tensors, 'cuda' (or None)
    'tokenizer'       dict: 'text' (the tiktoken rank file, "base64(token) rank" lines),
                      'sha256' (of that text), 'file' (where it was read from): the
                      checkpoint alone is enough to sample from it

Writes are atomic (a temporary file, then os.replace): a crash never leaves half a
checkpoint.
"""

import hashlib
import os

import torch

import mixer
from data.prepare import load_tokenizer, tokenizer_from_text, tokenizer_sha256

PREFIXES = ('_orig_mod.', 'module.')     # torch.compile's and DDP's wrappers


class CheckpointError(ValueError):
    """A checkpoint or its tokenizer cannot be used (the message is one line)."""


def save_checkpoint(path, model, model_config, config, step, best_val_loss, rng, tokenizer_path,
                    tokenizer_sha, optimizers=()):
    """Write a checkpoint (the format above) to `path`, atomically.

    model: the unwrapped model; model_config: a dict of its mixer.ModelConfig;
    config: train.py's settings; rng: a list of per-rank RNG dicts; optimizers:
    pairs (key, torch.optim.Optimizer), e.g. [('optimizer', adamw)].
    tokenizer_path / tokenizer_sha: the rank file the data was encoded with."""
    with open(tokenizer_path, encoding='ascii', newline='') as f:
        text = f.read()
    state = {'model': model.state_dict(), **{k: o.state_dict() for k, o in optimizers},
             'model_config': model_config, 'config': config, 'step': step, 'best_val_loss': best_val_loss,
             'rng': rng, 'tokenizer': {'file': os.path.abspath(tokenizer_path), 'sha256': tokenizer_sha,
                                       'text': text}}
    tmp = path + '.tmp'
    torch.save(state, tmp)
    os.replace(tmp, path)


def read_checkpoint(path, device='cpu'):
    """The raw checkpoint dict at `path`, tensors on `device`, with its model state dict
    stripped of wrapper prefixes. Raises CheckpointError (one line) on a missing or
    unreadable file or one without the format's model keys."""
    if not os.path.isfile(path):
        raise CheckpointError(f'checkpoint {path!r} not found')
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
        ckpt['model'] = strip_prefixes(ckpt['model'])
        ckpt['model_config']
    except Exception as e:  # torch raises many types for a damaged file
        raise CheckpointError(f'checkpoint {path!r} is corrupt or not from train.py ({_reason(e)})') from None
    return ckpt


def _reason(e):
    """An exception as one short line: 'TypeName: first line of its message'."""
    return f'{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ""}'


def strip_prefixes(state):
    """A state dict with torch.compile's '_orig_mod.' and DDP's 'module.' prefixes removed."""
    out = {}
    for k, v in state.items():
        while k.startswith(PREFIXES):
            k = k.split('.', 1)[1]
        out[k] = v
    return out


def load_checkpoint(path, device='cpu'):
    """Load a checkpoint -> (model in eval mode on `device`, tiktoken.Encoding, checkpoint dict).

    The tokenizer is the rank-file text embedded in the checkpoint, checked against
    its SHA-256; a checkpoint written before tokenizers were embedded (only 'file'
    and 'sha256') loads the file it records instead. Raises CheckpointError on a
    missing or corrupt checkpoint, or a missing, corrupt or different tokenizer."""
    ckpt = read_checkpoint(path, device)
    try:
        model = mixer.build_model(mixer.ModelConfig(**ckpt['model_config']))
        model.load_state_dict(ckpt['model'])
    except Exception as e:
        raise CheckpointError(f'checkpoint {path!r} does not fit its own model_config ({_reason(e)})') from None
    return model.to(device).eval(), checkpoint_tokenizer(ckpt, path), ckpt


def checkpoint_tokenizer(ckpt, path='checkpoint'):
    """The tiktoken.Encoding of a checkpoint dict: its embedded rank file text
    (ckpt['tokenizer']['text']) or, for an older checkpoint without one, the file
    at ckpt['tokenizer']['file']; either must match ckpt['tokenizer']['sha256'].
    `path` names the checkpoint in errors. Raises CheckpointError otherwise."""
    tok = ckpt.get('tokenizer')
    if not isinstance(tok, dict) or 'sha256' not in tok or not ('text' in tok or 'file' in tok):
        raise CheckpointError(f'checkpoint {path!r} records no tokenizer (not from train.py)')
    if 'text' in tok:
        if not isinstance(tok['text'], str) or \
                hashlib.sha256(tok['text'].encode('utf-8')).hexdigest() != tok['sha256']:
            raise CheckpointError(f'the tokenizer embedded in checkpoint {path!r} does not match its '
                                  'SHA-256 (a damaged file, or the data dir\'s tokenizer changed after '
                                  'data/prepare.py wrote it)')
        try:
            return tokenizer_from_text(tok['text'], f'tokenizer embedded in {path!r}')
        except ValueError as e:
            raise CheckpointError(str(e)) from None
    if not os.path.isfile(tok['file']):
        raise CheckpointError(f"tokenizer {tok['file']!r} recorded in the checkpoint not found "
                              '(an older checkpoint without its tokenizer: run data/prepare.py)')
    if tokenizer_sha256(tok['file']) != tok['sha256']:
        raise CheckpointError(f"tokenizer {tok['file']!r} differs from the one the model was trained with")
    try:
        return load_tokenizer(tok['file'])
    except ValueError as e:
        raise CheckpointError(str(e)) from None
