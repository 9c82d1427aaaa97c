"""The experiments' list flags, argparse types beside harness/cli.py's (the core's commands take no lists):

    p.add_argument('--lrs', type=listing(number(float, 0, above=True)))     # '1e-3,3e-3' -> [0.001, 0.003]
    p.add_argument('--fields', type=assignments)                             # 'n_head=4,kind=mixer' -> dict
"""

import sys

if __name__ == '__main__':       # not a command, run as a file or with -m: said before any import
    print("flags.py: error: the experiments' flag types, not a command: python -m experiments.mqar --help",
          file=sys.stderr)
    sys.exit(2)

import argparse
import ast


def listing(cast=str, choices=None, empty=False, items='values', what='name'):
    """The one list parser of the command lines, an argparse type: 'a,b,c' -> [cast(a), ...], each item once
    and among `choices` when given. argparse.ArgumentTypeError (one line) on an item named twice, (unless
    `empty`) no item at all, an item not among the choices ('unknown WHAT x; choose from ...'), or a bad
    item: cast's own ArgumentTypeError says why (e.g. number()'s), its ValueError names what the items
    must be (`items`; int, float and str name their own)."""
    items = {int: 'integers', float: 'numbers', str: 'names'}.get(cast, items)

    def parse(text):
        parts = [x.strip() for x in text.split(',') if x.strip()]
        try:
            values = [cast(x) for x in parts]
        except ValueError:
            raise argparse.ArgumentTypeError(f'must be {items} separated by commas, got {text!r}') from None
        twice = [x for i, x in enumerate(parts) if x in parts[:i] or values[i] in values[:i]]
        if twice:
            raise argparse.ArgumentTypeError(f'names {twice[0]} twice (got {text!r}); give each once')
        if not values and not empty:
            raise argparse.ArgumentTypeError('is empty; give at least one value')
        bad = [x for x, v in zip(parts, values) if choices is not None and v not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f'unknown {what} {",".join(bad)}; choose from '
                                             f'{",".join(map(str, choices))}')
        return values
    return parse


def assignments(text):
    """An argparse type: 'key=value,...' (e.g. ModelConfig fields; values Python literals or bare names)
    -> dict; argparse.ArgumentTypeError (one line) on a malformed item or a key given twice. What the
    keys may be is the caller's to check."""
    out = {}
    for item in listing(empty=True)(text):
        key, eq, value = item.partition('=')
        if not eq or not key.isidentifier():
            raise argparse.ArgumentTypeError(f'expected key=value, got {item!r}')
        if key in out:
            raise argparse.ArgumentTypeError(f'names {key} twice (got {text!r}); give each once')
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out
