"""The commands' flags: the project's ArgumentParser (a bad flag or value is one line, exit 2; a flag given
twice is refused), its argparse types (number, random_seed, listing, assignments) and the checks of what
the flags name (distinct_files, device_error, check_folder_writable, check_writable), and train.py's --help
(print_settings; the settings themselves are harness/configurator.py's). What every command shares beside
these (fail, Ctrl-C, whole writes) is cli.py's.

    p = ArgumentParser('sample.py', __doc__); p.add_argument('--temperature', type=number(float, 0))
    p.add_argument('--lrs', type=listing(number(float, 0, above=True)))     # '1e-3,3e-3' -> [0.001, 0.003]
    p.add_argument('--fields', type=assignments)                             # 'n_head=4,kind=mixer' -> dict
"""

import argparse
import ast
import inspect
import math
import os
import re
import tempfile

from harness.cli import fail


class ArgumentParser(argparse.ArgumentParser):
    """The project's command lines (the experiments, their tools): argparse with the description the
    first line of `doc`, each flag's default in --help (unless formatter_class says otherwise), and a
    bad flag or value one line 'PROG: error: msg' and exit 2 (fail: no usage block above it), a flag of
    one value given twice included (argparse keeps the last, the first dropped without a word)."""

    def __init__(self, prog, doc, **kw):
        kw.setdefault('formatter_class', argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(prog=prog, description=doc.split('\n')[0], **kw)
        for name in (None, 'store'):                        # a flag's default action, and by its name
            self.register('action', name, _StoreOnce)

    def parse_known_args(self, args=None, namespace=None):
        self.given = set()
        return super().parse_known_args(args, namespace)

    def error(self, message):
        fail(message, self.prog)

    def check(self, fn, *args, prefix=''):
        """fn(*args) -> its value; its ValueError is the command's one-line error (`prefix` first), exit 2."""
        try:
            return fn(*args)
        except ValueError as e:
            self.error(f'{prefix}{e}')


class DocHelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """--help as a command's docstring, written (its line breaks kept), then each flag with its default."""


class _StoreOnce(argparse._StoreAction):
    """argparse's 'store' action, which refuses its flag a second time (ArgumentParser)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string and self.dest in parser.given:
            parser.error(f'argument {"/".join(self.option_strings)}: given twice; give it once')
        parser.given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


def number(cast=int, low=1, above=False, high=None):
    """An argparse type: a finite number of type `cast` (int or float) >= low (> low when `above`;
    'positive' when that is 0) and, when given, <= high -> the number; anything else
    argparse.ArgumentTypeError (one line)."""
    def parse(text):
        try:
            x = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f'expected {"an integer" if cast is int else "a number"}, '
                                             f'got {text!r}') from None
        if not math.isfinite(x) or x < low or above and x == low:
            bound = 'positive' if above and low == 0 else f'> {low}' if above else f'>= {low}'
            raise argparse.ArgumentTypeError(f'must be {bound}, got {text}')
        if high is not None and x > high:
            raise argparse.ArgumentTypeError(f'must be <= {high}, got {text}')
        return x
    parse.__name__ = cast.__name__                  # argparse's name for the type in its own messages
    return parse


# An argparse type for a --seed: an integer in [0, 2**32 - 1], which every generator takes (torch's, numpy's)
random_seed = number(int, 0, high=2 ** 32 - 1)


def distinct_files(paths, flag):
    """Raise ValueError (one line) when the file paths `paths` (str, given by a repeatable `flag`, e.g.
    '--ckpt') name one file twice, also through two spellings (os.path.realpath: 'a/x' and './a/../a/x', a
    link and its target): the project refuses a duplicate rather than computing it twice."""
    seen = {}
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            same = f'{seen[real]!r} and {path!r} are one file' if seen[real] != path else f'names {path!r} twice'
            raise ValueError(f'{flag}: {same}; give each once')
        seen[real] = path


def device_error(dev):
    """Why the torch device named `dev` cannot be used on this machine (one line: an unknown name, CUDA
    absent, a CUDA index beyond the GPUs, a type other than cpu / cuda / an available mps), or None."""
    import torch                        # here, not above: data/prepare.py runs without importing torch
    try:
        d = torch.device(dev)
    except (RuntimeError, ValueError):
        return f"unknown device {dev!r}: use 'cpu', 'cuda' or 'cuda:N'"
    if d.type == 'cpu' or d.type == 'mps' and torch.backends.mps.is_available():
        return None
    if d.type != 'cuda':
        return f"device {dev!r} is not available here: use 'cpu', 'cuda' or 'cuda:N'"
    if not torch.cuda.is_available():
        return f'device {dev!r}: CUDA is not available on this machine; use --device cpu'
    if d.index is not None and d.index >= torch.cuda.device_count():
        return f'device {dev!r}: this machine has {torch.cuda.device_count()} CUDA device(s)'
    return None


def check_folder_writable(folder, what="output folder"):
    """Raise ValueError (one line) unless files can be made in `folder` now: it, or its nearest existing
    ancestor (the folders are made when written), is a folder that takes a new file. Makes nothing; call
    it before the work, so that a long run never ends unable to save its results."""
    folder = os.path.abspath(folder)
    probe = folder
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ValueError(f"cannot write the {what} {folder}: {probe} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        raise ValueError(f"cannot write the {what} {folder} ({e.strerror or e})") from None


def check_writable(path, overwrite=True, what="output file"):
    """Raise ValueError (one line) unless the file `path` can be written now (check_folder_writable on its
    folder); an empty path is refused, an existing file unless `overwrite`, and a folder always."""
    if not path:
        raise ValueError(f"the {what} is an empty path; give a file's path")
    if os.path.isdir(path):
        raise ValueError(f"the {what} {path} is a folder")
    if os.path.lexists(path) and not overwrite:
        raise ValueError(f"{path} exists; remove it, choose another path, or pass --overwrite")
    check_folder_writable(os.path.dirname(os.path.abspath(path)), f"folder of the {what}")


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


def comments(*objects):
    """The comment after each setting in the source of `objects` (a module, a class): lines 'name = value  #
    comment' and 'name: type = value  # comment' -> {name: comment}: --help's text."""
    found = {}
    for obj in objects:
        for m in re.finditer(r'^\s*(\w+)(?:: [\w|. ]+)? = .*?  # (.*)$', inspect.getsource(obj), re.M):
            found.setdefault(m.group(1), m.group(2).strip())
    return found


def print_settings(usage, defaults, objects):
    """train.py's --help: `usage`, then each setting of `defaults` ({name: default}) with its default and the
    comment after it in the source of `objects` (train.py's module, mixer.ModelConfig: comments)."""
    print(usage)
    helps = comments(*objects)
    for k, v in defaults.items():
        print((f'  --{k}={v!r}'.ljust(32) + helps.get(k, '')).rstrip())


if __name__ == '__main__':
    fail("the commands' flags, not a command: python train.py --help, python sample.py --help", 'harness/flags.py')
