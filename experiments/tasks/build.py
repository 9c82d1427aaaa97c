"""Build the held-out stories the three TinyStories tasks read (experiments/tasks/tinystories_heldout.jsonl).

    python -m experiments.tasks.build --valid ../shared/data/tinystories/valid.txt
    python -m experiments.tasks.build --valid ../shared/data/tinystories/valid.txt --out /tmp/h.jsonl   # cmp it

From TinyStories' validation text (Eldan & Li 2023, CDLA-Sharing-1.0; stories separated by <|endoftext|>, as
data/prepare.py reads them), which no checkpoint of this project trains on: its first story is dropped (the
published split begins mid-story); a story is kept when it ends in a word (tinystories.last_word) and in a
last sentence of 4 to 40 words after at least one other (tinystories.last_sentence); --n of those are drawn
with random.Random(--seed), kept in the text's order. Each gets 3 distractor endings for the multiple-choice
task: last sentences of other kept-or-not eligible stories, drawn at random among the --near stories whose
last sentence is nearest in characters to its own (so length alone tells little), none equal to the true
ending or to each other (case aside); and a label, the true ending's place among the 4 (random). Same text,
same flags: the same file, byte for byte. The file is written whole (a temporary name, then a rename); an
existing --out is replaced only with --overwrite. Bad input: one line, exit 2; Ctrl-C: one line, exit 130.
"""

import argparse
import json
import os
import random
import sys

if __name__ == '__main__':       # run as a file too: the repository root on the path, as -m puts it
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from harness import cli
    cli.begin('build.py', keep=True)

from experiments.tasks import tinystories
from harness.cli import failing, run_command, write_atomic
from harness.flags import ArgumentParser, check_writable, number, random_seed

fail = failing('build.py')
EOT = '<|endoftext|>'


def eligible(stories):
    """The stories (list of str) both tasks can use -> list of (index, text, ending), the first story left out."""
    out = []
    for i, text in enumerate(stories[1:], 1):
        cut = tinystories.last_sentence(text)
        if cut is not None and tinystories.last_word(text) is not None:
            out.append((i, text, cut[2]))
    return out


def distractors(rng, pool, k, near=20, count=3):
    """`count` endings for pool[k] (pool: eligible's list) drawn by rng among the `near` other stories whose
    ending is nearest its own in characters (ties: the earlier story), each different from the true ending
    and the others (case aside) -> list of str. ValueError when fewer than `count` such endings exist."""
    true = pool[k][2]
    others = sorted((abs(len(e) - len(true)), j) for j, (_, _, e) in enumerate(pool) if j != k)
    picked, seen = [], {true.lower()}
    candidates = [pool[j][2] for _, j in others]
    while len(picked) < count:
        fresh = [e for e in candidates if e.lower() not in seen][:near]
        if not fresh:
            raise ValueError(f'story {pool[k][0]}: fewer than {count} distinct endings to draw from')
        e = rng.choice(fresh)
        picked.append(e)
        seen.add(e.lower())
    return picked


def build(text, n=500, seed=0, near=20):
    """TinyStories text (str, stories separated by <|endoftext|>) -> the held-out file's lines (list of dicts:
    id, text, distractors, label). ValueError when fewer than n stories are eligible."""
    stories = [s.strip() for s in text.split(EOT)]
    stories = [s for s in stories if s]
    pool = eligible(stories)
    if len(pool) < n:
        raise ValueError(f'{len(pool)} eligible stories, fewer than --n {n}')
    rng = random.Random(seed)
    chosen = sorted(rng.sample(range(len(pool)), n))
    out = []
    for k in chosen:
        wrong = distractors(rng, pool, k, near)
        out.append({'id': pool[k][0], 'text': pool[k][1], 'distractors': wrong, 'label': rng.randrange(4)})
    return out


def main(argv=None):
    """Command line entry point: exits 0 (the file written), 2 (bad input, one line), 130 (Ctrl-C)."""
    sys.exit(run_command('build.py', run, argv))


def run(argv):
    """main's work: parse argv, read --valid, write --out."""
    p = ArgumentParser('build.py', __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.description = __doc__
    p.add_argument('--valid', required=True, help="TinyStories' validation text (valid.txt)")
    p.add_argument('--out', default=tinystories.DATA, help='the held-out stories (JSON lines)')
    p.add_argument('--n', type=number(int, 1), default=500, help='stories drawn')
    p.add_argument('--seed', type=random_seed, default=0)
    p.add_argument('--near', type=number(int, 1), default=20, help='distractors drawn among this many nearest')
    p.add_argument('--overwrite', action='store_true', help='replace an existing --out')
    args = p.parse_args(argv)
    try:
        check_writable(args.out, overwrite=args.overwrite, what='held-out stories file')
        with open(args.valid, encoding='utf-8') as f:
            text = f.read()
        lines = build(text, args.n, args.seed, args.near)
    except (OSError, UnicodeDecodeError) as e:
        fail(f'cannot read --valid {args.valid!r} ({getattr(e, "strerror", None) or e})')
    except ValueError as e:
        fail(str(e))
    try:
        write_atomic(args.out, ''.join(json.dumps(line, ensure_ascii=False) + '\n' for line in lines))
    except OSError as e:
        fail(f'could not write {args.out} ({e.strerror or e})', code=1)
    print(f'build.py: {len(lines)} stories of {args.valid} -> {args.out} '
          f'({os.path.getsize(args.out) / 1e3:.0f} kB; seed {args.seed})')


if __name__ == '__main__':
    main()
