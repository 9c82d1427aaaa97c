"""Generate text from a checkpoint written by train.py.

    python sample.py --ckpt out/ckpt.pt --start "Once upon a time" --num_samples 2
    python sample.py --ckpt out/ckpt.pt --start FILE:prompt.txt --temperature 0.8 --top_k 40

Generation is incremental (decode.generate): the prompt is read once,
then each new token costs one step through the cache (dense and Toeplitz mixers,
transformer) or the constant-size state (recurrent mixer, linear attention).
--compile decodes through decode.py's static-shape step under torch.compile: one
graph for every position, compiled on the first tokens (seconds to a minute).
"""

import argparse
import math
import os
import sys

import torch

import decode
from checkpoint import CheckpointError, load_checkpoint
from cli import device_error, failing

fail = failing('sample.py')            # 'PROG: error: msg' on stderr, exit 2


def main(argv=None):
    """Command line entry point: prints the samples. Bad input: one line, exit 2; Ctrl-C:
    one line, exit 130."""
    try:
        generate(argv)
        sys.stdout.flush()
    except KeyboardInterrupt:
        print('sample.py: interrupted (Ctrl-C)', file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:                 # the reader of stdout went away (| head): nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit
        sys.exit(1)


def generate(argv):
    """Parse `argv`, load the checkpoint and print --num_samples samples."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--ckpt', default='out/ckpt.pt', help='checkpoint from train.py')
    p.add_argument('--start', default='<|endoftext|>', help='prompt text, or FILE:path to read it from a file')
    p.add_argument('--num_samples', type=int, default=2)
    p.add_argument('--max_new_tokens', type=int, default=200)
    p.add_argument('--temperature', type=float, default=0.8, help='0 means greedy')
    p.add_argument('--top_k', type=int, default=40, help='0 means no top-k filter')
    p.add_argument('--seed', type=int, default=1337)
    p.add_argument('--device', default='cpu')
    p.add_argument('--compile', action='store_true', help='torch.compile a static-shape decode step (decode.py)')
    args = p.parse_args(argv)
    if args.num_samples < 1 or args.max_new_tokens < 0 or not 0 <= args.temperature < math.inf or args.top_k < 0:
        fail('num_samples must be >= 1, max_new_tokens and top_k >= 0 and temperature a finite number >= 0')
    if device_error(args.device):
        fail(device_error(args.device))

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
    if args.compile:
        out = decode.generate_static(model, idx, args.max_new_tokens, args.temperature, args.top_k or None,
                                     compile=True)
    else:
        out = decode.generate(model, idx, args.max_new_tokens, args.temperature, args.top_k or None)
    for i, row in enumerate(out.tolist()):
        print(f'--- sample {i + 1} ({ckpt["config"]["variant"]}, step {ckpt["step"]}, '
              f'{len(row) - len(ids)} new tokens)')
        print(enc.decode(row).replace('<|endoftext|>', '\n<|endoftext|>\n').strip())


if __name__ == '__main__':
    main()
