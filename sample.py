"""Generate text from a checkpoint written by train.py.

    python sample.py --ckpt out/ckpt.pt --start "Once upon a time" --num_samples 2
    python sample.py --ckpt out/ckpt.pt --start FILE:prompt.txt --temperature 0.8 --top_k 40

Generation is incremental (mixer.LanguageModel.generate): the prompt is read once,
then each new token costs one step through the cache (dense and Toeplitz mixers,
transformer) or the constant-size state (recurrent mixer, linear attention).
"""

import argparse
import hashlib
import os
import sys

import torch

import mixer
from data.prepare import load_tokenizer, tokenizer_from_text, tokenizer_sha256


def fail(msg):
    """Print a one-line error and exit with code 2."""
    print(f'sample.py: error: {msg}', file=sys.stderr)
    sys.exit(2)


class CheckpointError(ValueError):
    """A checkpoint or its tokenizer cannot be used (message is one line)."""


def load_checkpoint(path, device='cpu'):
    """Load a train.py checkpoint -> (model in eval mode, tiktoken.Encoding, checkpoint dict).

    The tokenizer is the rank file text embedded in the checkpoint (train.py's
    save), checked against its SHA-256, so the checkpoint file alone suffices.
    A checkpoint written before tokenizers were embedded (only 'file' and
    'sha256') loads the file it records instead. Raises CheckpointError on a
    missing or corrupt checkpoint, or a missing, corrupt or different tokenizer."""
    if not os.path.isfile(path):
        raise CheckpointError(f'checkpoint {path!r} not found')
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
        cfg = mixer.ModelConfig(**ckpt['model_config'])
        model = mixer.build_model(cfg)
        model.load_state_dict(ckpt['model'])
    except Exception as e:  # torch raises many types for a damaged file
        raise CheckpointError(f'checkpoint {path!r} is corrupt or not from train.py '
                              f'({type(e).__name__}: {str(e)[:120]})') from None
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--ckpt', default='out/ckpt.pt', help='checkpoint from train.py')
    p.add_argument('--start', default='<|endoftext|>', help='prompt text, or FILE:path to read it from a file')
    p.add_argument('--num_samples', type=int, default=2)
    p.add_argument('--max_new_tokens', type=int, default=200)
    p.add_argument('--temperature', type=float, default=0.8, help='0 means greedy')
    p.add_argument('--top_k', type=int, default=40, help='0 means no top-k filter')
    p.add_argument('--seed', type=int, default=1337)
    p.add_argument('--device', default='cpu')
    args = p.parse_args(argv)
    if args.num_samples < 1 or args.max_new_tokens < 0 or args.temperature < 0 or args.top_k < 0:
        fail('num_samples must be >= 1 and max_new_tokens, temperature, top_k >= 0')

    try:
        model, enc, ckpt = load_checkpoint(args.ckpt, args.device)
    except CheckpointError as e:
        fail(str(e))
    if model.cfg.task != 'lm':
        fail('this checkpoint is an autoencoder; sample.py needs a language model')
    text = args.start
    if text.startswith('FILE:'):
        try:
            text = open(text[5:], encoding='utf-8').read()
        except (OSError, UnicodeDecodeError) as e:
            fail(f'cannot read prompt file {text[5:]!r}: {e}')
    ids = enc.encode(text, allowed_special={'<|endoftext|>'})
    if not ids:
        fail('the prompt is empty; pass --start "<|endoftext|>" to start a fresh story')
    if len(ids) > model.cfg.n_ctx:
        print(f'sample.py: warning: the prompt is {len(ids)} tokens, longer than the model context '
              f'n_ctx={model.cfg.n_ctx}: keeping its last {model.cfg.n_ctx} tokens', file=sys.stderr)
        ids = ids[-model.cfg.n_ctx:]

    torch.manual_seed(args.seed)
    idx = torch.tensor([ids] * args.num_samples, device=args.device)
    out = model.generate(idx, args.max_new_tokens, args.temperature, args.top_k or None)
    for i, row in enumerate(out.tolist()):
        print(f'--- sample {i + 1} ({ckpt["config"]["variant"]}, step {ckpt["step"]})')
        print(enc.decode(row).replace('<|endoftext|>', '\n<|endoftext|>\n').strip())


if __name__ == '__main__':
    main()
