"""The paper's masked mixers in, safetensors out: convert between this project's checkpoints and other formats.

    python -m experiments.convert --reference RUN/checkpoint-4000 --tokenizer tokenizer.json --out out/imported/ckpt.pt
    python -m experiments.convert --ckpt out/tinystories_cpu/ckpt.pt --out exported/      # then --ckpt exported/

Import (--reference): a LanguageMixer trained with the paper's own code (Badger 2024, "Masked Mixers for
Language Generation and Retrieval", arXiv 2409.01482; blbadger/maskedmixers, mixer_lm/
mixer_trainer_tinystories.py), as the Hugging Face Trainer saves it: model.safetensors, pytorch_model.bin
(read with torch.load(weights_only=True)) or a folder holding one. Its state dict, V tokens, width d,
context n_ctx, N blocks:

    wte.weight [V, d]                                   -> wte.weight (rows renumbered, see below)
    mixerblocks.N.seq_layernorm.{weight,bias} [d]       -> blocks.N.norm1 (the norm before the mixing)
    mixerblocks.N.conv.weight [n_ctx, n_ctx, 1]         -> blocks.N.mixing.W [1, n_ctx, n_ctx]
    mixerblocks.N.conv.bias [n_ctx]                     -> blocks.N.mixing.c [1, n_ctx, 1]
    mixerblocks.N.patch_layernorm.{weight,bias} [d]     -> blocks.N.norm2 (the norm before the MLP)
    mixerblocks.N.patch_ff.0.{weight,bias} [4d, d]      -> blocks.N.ff.fc
    mixerblocks.N.patch_ff.2.{weight,bias} [d, 4d]      -> blocks.N.ff.proj_out
    lm_head.weight [V, d]                               -> lm_head.weight (the same rows renumbered)

is this project's flat kind with n_head=1, final_norm=False (the paper's model has no final norm and no
positions) and tie_embeddings as the file says (wte and lm_head one tensor, or equal). The paper's
Conv1d(n_ctx, n_ctx, 1) mixes positions with the lower triangle of its weight (its forward applies tril on
every call, so a saved upper triangle may be nonzero); mixer.FlatMixing masks the same way, so the
weight is taken as saved and the logits are the paper model's. That model reads exactly n_ctx tokens (its
channels are positions); this one any T <= n_ctx, whose logits are the first T of a padded input's. The
expanded layout (expand_conv=True), any other unknown or missing key and a wrong shape are refused.

The tokenizer.json (Hugging Face `tokenizers`) must be a byte-level BPE that splits text as GPT-2 does (the
ByteLevel pre-tokenizer without a prefix space, no normalizer) with <|endoftext|> its one special token (its
post-processor and decoder are not read: the paper's code encodes with add_special_tokens=False).
Its merges become tiktoken ranks: this project's ids are the 256 bytes (id = byte value), the merges in
order, then <|endoftext|> (data/tokenizer.py); its ids, another numbering of the same tokens, renumber the
model's wte and lm_head rows, so both tokenizers split every text into the same tokens and the model sees
the same inputs. One that cannot be converted is refused, saying why, and the conversion is checked by
encoding texts with both (spaces, newlines, digits, unicode; without the tokenizers package, a one-line
error: no conversion goes unchecked). A field of the wrong JSON type (merges that are not a list, a
normalizer that is a string) is refused naming it. The checkpoint holds no optimiser state:
train.py --init_from=resume continues it with a fresh AdamW from step 0 (on data prepared with its tokenizer),
at the paper's peak learning rate 5e-4.

Export (--ckpt): any checkpoint (every kind) -> DIR/config.json (model_config, the run's settings, step,
the tokenizer's SHA-256), DIR/model.safetensors (the state dict; tied weights stored once, their other name
in the file's metadata, as safetensors.torch.save_model writes shared tensors) and DIR/tokenizer.tiktoken.
Every command that takes --ckpt reads such a folder (loading.read_exported), unpickling nothing.

Outputs are written whole or not at all (cli.written: a temporary name, then a rename; an old --out folder
is kept until the new one is in place, and is there again whatever stops the command), with the modes the
umask gives, as every output of the project; what a killed run left beside --out is cleared first, with a
note. An existing --out is replaced only with --overwrite (a folder only if it holds nothing but an export's
files). Weights that are not finite, not floating point, or tied yet different are refused, naming the key.
Bad input: one line, exit 2; a failed write (a full disk): one line, exit 1; Ctrl-C: one line, exit 130.
"""

import argparse
import hashlib
import json
import math
import os
import re
import sys
from dataclasses import asdict

if __name__ == '__main__':       # run as a file too (python experiments/convert.py): the repository root on
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the path, as -m puts it
    from harness import cli                   # and from here Ctrl-C is one line, torch's import included
    cli.begin('convert.py', keep=True)

import torch

from harness import checkpoint, configurator, loading
import mixer
from harness.cli import failing, one_line, remove_stale_temps, run_command, written
from harness.flags import ArgumentParser, check_folder_writable, check_writable
from data.tokenizer import ConvertError, read_tokenizer_json

fail = failing('convert.py')
EXPORT_FILES = loading.EXPORT_FILES      # an exported folder: config.json, model.safetensors, tokenizer.tiktoken
REFERENCE_FILES = ('model.safetensors', 'pytorch_model.bin')                 # the Trainer's, in its order
PAPER_LR = 5e-4                 # mixer_trainer_tinystories.py's learning_rate, for a resumed import
# The paper's block keys, mixerblocks.N.KEY -> (ours, blocks.N.NAME; its shape there: d = d_model, n = n_ctx,
# h = the feed-forward's width)
PAPER_BLOCK = {
    'seq_layernorm.weight': ('norm1.weight', 'd'), 'seq_layernorm.bias': ('norm1.bias', 'd'),
    'conv.weight': ('mixing.W', 'n n 1'), 'conv.bias': ('mixing.c', 'n'),
    'patch_layernorm.weight': ('norm2.weight', 'd'), 'patch_layernorm.bias': ('norm2.bias', 'd'),
    'patch_ff.0.weight': ('ff.fc.weight', 'h d'), 'patch_ff.0.bias': ('ff.fc.bias', 'h'),
    'patch_ff.2.weight': ('ff.proj_out.weight', 'd h'), 'patch_ff.2.bias': ('ff.proj_out.bias', 'd'),
}
class WriteFailed(Exception):
    """An output that could not be written (a full disk): the message is the cause, one line."""


# ----------------------------------------------------------------------------- the tokenizer

def read_tokenizer(path):
    """A tokenizer.json file -> (tiktoken.Encoding, its rank file's text, hf_ids long [V]: the tokenizer.json id
    of each of this project's ids), converted and checked by data/tokenizer.read_tokenizer_json. Raises
    ConvertError (one line) for what it refuses."""
    enc, text, hf_ids = read_tokenizer_json(path)
    return enc, text, torch.tensor(hf_ids)


# ----------------------------------------------------------------------------- the weights

def read_reference(path):
    """The state dict of a paper's model at `path` (model.safetensors, pytorch_model.bin, or a folder
    holding one) -> ({key: tensor}, {key: key of the tensor it shares, from a safetensors file's
    metadata}). Raises ConvertError (one line) on a missing, truncated or unreadable file."""
    if os.path.isdir(path):
        found = [f for f in REFERENCE_FILES if os.path.isfile(os.path.join(path, f))]
        if not found:
            raise ConvertError(f'--reference {path} is a folder without {" or ".join(REFERENCE_FILES)} (a sharded '
                               'or other model is not read)')
        path = os.path.join(path, found[0])
    elif not os.path.isfile(path):
        raise ConvertError(f'--reference {path} not found')
    try:
        if path.endswith('.safetensors'):
            from safetensors import safe_open   # here: the rest of the project runs without it
            with safe_open(path, 'pt', device='cpu') as f:
                return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}
        state = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:                      # safetensors and torch raise many types for a damaged file
        raise ConvertError(f'--reference {path} is damaged or not a model file ({one_line(e)})') from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConvertError(f'--reference {path} holds no state dict (a dict of tensors)')
    return loading.migrate_state(state), {}


def check_keys(state):
    """Raise ConvertError (one line, naming the key) unless `state` holds exactly the paper's keys for
    blocks 0..N-1 (N: the highest block index + 1) -> N."""
    blocks = {0}
    for key in state:
        m = re.fullmatch(r'mixerblocks\.(\d+)\.(.+)', key)
        if key in ('wte.weight', 'lm_head.weight') or m and m.group(2) in PAPER_BLOCK:
            blocks |= {int(m.group(1))} if m else set()
            continue
        expanded = m and m.group(2).startswith('conv.')
        raise ConvertError(f'unknown key {key}' + (' (the expanded layout, expand_conv=True, which this project '
                           "imports not: its flat kind's mixing is one matrix)" if expanded else
                           " (not the paper's flat LanguageMixer)"))
    n_layer = max(blocks) + 1
    for key in ['wte.weight', 'lm_head.weight'] + [f'mixerblocks.{i}.{k}' for i in range(n_layer) for k in PAPER_BLOCK]:
        if key not in state:
            raise ConvertError(f'missing key {key}')
    return n_layer


def paper_config(state):
    """mixer.ModelConfig of the state dict `state` of Badger 2024's LanguageMixer (its keys checked:
    check_keys), every shape checked against the sizes read from wte.weight [V, d], mixerblocks.0.conv.bias
    [n_ctx] and mixerblocks.0.patch_ff.0.weight [h, d] (each size >= 1); tied when wte and lm_head are one
    tensor or equal. Raises ConvertError (one line, naming the key), also for a tensor that is not floating
    point or holds a value that is not finite (NaN, inf)."""
    n_layer = check_keys(state)
    first = [('wte.weight', 2), ('mixerblocks.0.conv.bias', 1), ('mixerblocks.0.patch_ff.0.weight', 2)]
    for key, dim in first:
        if state[key].dim() != dim or 0 in state[key].shape:
            raise ConvertError(f'{key} has shape {list(state[key].shape)}: a {dim}-D tensor of sizes >= 1 expected '
                               '(its sizes are the model\'s: vocab and d_model, n_ctx, feed-forward and d_model)')
    (V, d), n, h = state['wte.weight'].shape, state[first[1][0]].shape[0], state[first[2][0]].shape[0]
    sizes = dict(d=d, n=n, h=h)
    want = {'wte.weight': (V, d), 'lm_head.weight': (V, d)}
    want.update({f'mixerblocks.{i}.{k}': tuple(sizes[c] if c in sizes else int(c) for c in shape.split())
                 for i in range(n_layer) for k, (_, shape) in PAPER_BLOCK.items()})
    for key, shape in want.items():
        if tuple(state[key].shape) != shape or not state[key].is_floating_point():
            raise ConvertError(f'{key} is {state[key].dtype} {list(state[key].shape)}; expected a float tensor of '
                               f'shape {list(shape)} (vocab {V}, d_model {d}, n_ctx {n}, feed-forward {h})')
    if h % d:
        raise ConvertError(f'mixerblocks.0.patch_ff.0.weight: the feed-forward width {h} is no multiple of d_model {d}')
    for key in (k for k in want if not state[k].isfinite().all()):
        raise ConvertError(f'{key} holds values that are not finite (NaN or inf): the model would compute no numbers')
    wte, head = state['wte.weight'], state['lm_head.weight']
    tied = wte is head or torch.equal(wte, head)
    try:
        return mixer.ModelConfig(vocab_size=V, n_ctx=n, d_model=d, n_layer=n_layer, n_head=1, ff_mult=h // d,
                                 final_norm=False, tie_embeddings=tied)
    except ValueError as e:                     # mixer's own limits on a configuration
        raise ConvertError(f'the model in the file is no configuration this project builds ({e})') from None


def paper_to_model(state, aliases, hf_ids):
    """The state dict of Badger 2024's LanguageMixer (read_reference's pair: tensors, aliases) ->
    mixer.LanguageModel (float32, eval mode) computing its logits, with the token rows of wte and lm_head
    renumbered: our row r is the paper's row hf_ids[r] (long [V]). Raises ConvertError (one line) as
    paper_config does, when the model's V rows are not the tokenizer's V tokens, or when the file's metadata
    ties two names it holds as different tensors (loading.with_aliases)."""
    try:
        state = loading.with_aliases(state, aliases, 'the --reference file')
    except checkpoint.CheckpointError as e:
        raise ConvertError(str(e)) from None
    cfg = paper_config(state)
    if cfg.vocab_size != len(hf_ids):
        raise ConvertError(f'the model has {cfg.vocab_size} token rows (wte.weight) and the tokenizer {len(hf_ids)} '
                           'tokens: they are not one vocabulary')
    model = mixer.build_model(cfg).eval()
    ours = {'wte.weight': state['wte.weight'][hf_ids], 'lm_head.weight': state['lm_head.weight'][hf_ids]}
    for i in range(cfg.n_layer):
        for key, (name, _) in PAPER_BLOCK.items():
            ours[f'blocks.{i}.{name}'] = state[f'mixerblocks.{i}.{key}']
    target = model.state_dict()
    model.load_state_dict({k: v.float().reshape(target[k].shape) for k, v in ours.items()})
    return model


# ----------------------------------------------------------------------------- the two directions

def import_reference(args):
    """--reference, --tokenizer -> --out: a checkpoint in harness/checkpoint.py's format (no optimiser state, step
    0, train.py's settings with the imported architecture and the paper's learning rate), written whole.
    Raises ConvertError (one line) for bad input; WriteFailed for a failed write."""
    enc, text, hf_ids = read_tokenizer(args.tokenizer)
    model = paper_to_model(*read_reference(args.reference), hf_ids)
    import train                                # its settings: what a resume of the import starts from
    arch = {k: v for k, v in asdict(model.cfg).items() if k in train.DEFAULTS and k not in configurator.TUNING_KEYS}
    config = {**train.DEFAULTS, **arch, 'variant': 'flat', 'learning_rate': PAPER_LR, 'min_lr': PAPER_LR / 10,
              'imported_from': os.path.abspath(args.reference)}
    state = {'model': model.state_dict(), 'model_config': asdict(model.cfg), 'config': config, 'step': 0,
             'best_val_loss': float('inf'), 'rng': [],
             'tokenizer': {'file': os.path.abspath(args.tokenizer), 'text': text,
                           'sha256': hashlib.sha256(text.encode('ascii')).hexdigest()}}
    write_out(args.out, lambda tmp: torch.save(state, tmp), RuntimeError)    # torch.save: 'unexpected pos'
    cfg = model.cfg
    print(f'convert.py: {args.out}: the paper\'s flat masked mixer, {cfg.n_layer} layers, d_model {cfg.d_model}, '
          f'n_ctx {cfg.n_ctx}, {enc.n_vocab} tokens, {"tied" if cfg.tie_embeddings else "untied"} embeddings, '
          f'{model.num_params() / 1e6:.2f}M parameters')
    print('to train it further: place it as OUT_DIR/ckpt.pt, prepare data with its tokenizer (this command\'s '
          '--ckpt writes it to a folder) and run train.py --init_from=resume --out_dir=OUT_DIR --data_dir=DATA '
          '(a fresh optimiser, from step 0)')


def export_checkpoint(args):
    """--ckpt -> --out DIR: config.json, model.safetensors, tokenizer.tiktoken (the module's docstring),
    written into a temporary folder that replaces DIR (write_out). Raises ConvertError for an unreadable
    checkpoint; WriteFailed for a failed write."""
    from safetensors import SafetensorError     # here: the rest of the project runs without safetensors
    from safetensors.torch import save_model
    try:
        model, _, ckpt = loading.load_checkpoint(args.ckpt)
        tok = ckpt['tokenizer']
        if 'text' not in tok:                   # an older checkpoint: its tokenizer file, checked by the load
            with open(tok['file'], encoding='ascii', newline='') as f:
                tok = {**tok, 'text': f.read()}
    except (checkpoint.CheckpointError, OSError) as e:
        raise ConvertError(str(e)) from None
    best = ckpt.get('best_val_loss')
    config = json.dumps({'model_config': asdict(model.cfg), 'config': ckpt['config'], 'step': ckpt['step'],
                         'best_val_loss': best if isinstance(best, float) and math.isfinite(best) else None,
                         'tokenizer': {'sha256': tok['sha256']}}, indent=2)

    def write(folder):
        os.makedirs(folder)
        with open(os.path.join(folder, 'config.json'), 'w', encoding='utf-8') as f:
            f.write(config)
        save_model(model.cpu(), os.path.join(folder, 'model.safetensors'))
        with open(os.path.join(folder, 'tokenizer.tiktoken'), 'w', encoding='ascii', newline='') as f:
            f.write(tok['text'])
    write_out(args.out, write, SafetensorError)
    print(f'convert.py: {args.out}: {", ".join(EXPORT_FILES)} ({ckpt["config"].get("variant", model.cfg.kind)}'
          f', step {ckpt["step"]}); load it with --ckpt {args.out}')


def write_out(path, write, failure):
    """write(tmp) makes --out's file or folder at a temporary path, which then replaces `path` (cli.written:
    an old folder is back in place whatever stops the command). Raises WriteFailed (the cause, one line) for
    an OSError or a `failure`, the exception type the writer reports a failed write with (torch.save's
    RuntimeError, safetensors' SafetensorError: a full disk)."""
    try:
        with written(path) as tmp:
            write(tmp)
    except (OSError, failure) as e:
        raise WriteFailed(checkpoint.write_error(e, path)) from None


def check_out(args):
    """Raise ValueError (one line) unless --out can be written: not an existing path without --overwrite;
    for an export, an existing --out only a folder of an export's files; its folder writable. What a killed
    run left beside it is cleared first (cli.remove_stale_temps: its temporaries removed, an old --out it
    had moved aside renamed back), with a note."""
    out = args.out
    if out:
        remove_stale_temps(os.path.dirname(os.path.abspath(out)), 'convert.py', os.path.basename(os.path.abspath(out)))
    if args.reference is not None:
        return check_writable(out, args.overwrite, '--out checkpoint')
    if not out:
        raise ValueError("--out is an empty path; give the export's folder")
    if os.path.lexists(out) and not args.overwrite:
        raise ValueError(f'{out} exists; remove it, choose another path, or pass --overwrite')
    if os.path.lexists(out) and (not os.path.isdir(out) or set(os.listdir(out)) - set(EXPORT_FILES)):
        raise ValueError(f'--out {out} is not a folder this command exported (it holds other files): '
                         '--overwrite replaces only such a folder; choose another --out')
    check_folder_writable(os.path.dirname(os.path.abspath(out)), "export's parent folder")


def convert(argv):
    """main's work: parse and check the flags, then import or export."""
    p = ArgumentParser('convert.py', __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.description = __doc__                                 # --help: the whole docstring, as written
    p.add_argument('--reference', help="import: the paper's model.safetensors, pytorch_model.bin or a folder with one")
    p.add_argument('--tokenizer', help='import: its tokenizer.json (a byte-level BPE of the tokenizers library)')
    p.add_argument('--ckpt', help='export: a checkpoint of this project (or an exported folder)')
    p.add_argument('--out', required=True, help='import: the checkpoint file to write; export: the folder to write')
    p.add_argument('--overwrite', action='store_true', help='replace an existing --out')
    args = p.parse_args(argv)
    if (args.reference is None) == (args.ckpt is None):
        p.error('give --reference (import, with --tokenizer) or --ckpt (export), one of them')
    if (args.tokenizer is None) != (args.reference is None):
        p.error('--tokenizer goes with --reference: the tokenizer.json of the imported model')
    p.check(check_out, args)
    try:
        (import_reference if args.reference is not None else export_checkpoint)(args)
    except ConvertError as e:
        fail(str(e))
    except WriteFailed as e:
        print(f'convert.py: error: could not write {args.out} ({e}); nothing was written', file=sys.stderr)
        return 1
    except OSError as e:                        # the reads above name their own; this is a last net
        print(f'convert.py: error: {checkpoint.write_error(e, args.out)}', file=sys.stderr)
        return 1


def main(argv=None):
    """Command line entry point (argv: list of str; None: sys.argv): exits 0, --out written; 2, bad input (one
    line); 1, a failed write (one line, nothing written); 130, Ctrl-C (one line, nothing written)."""
    sys.exit(run_command('convert.py', convert, argv))


if __name__ == '__main__':
    main()
