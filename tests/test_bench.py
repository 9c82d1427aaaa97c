"""Smoke test of bench.py: `python test_mixer.py test_bench`. Speed is never asserted here."""

import contextlib
import io
import os
import re
import subprocess
import sys
import unittest
from unittest import mock

import torch

import mixer
import sample
from harness import machine
from harness.flags import ArgumentParser
from experiments import bench, bench_decode, bench_load
from experiments.runner import fmt_bytes

from tests.common import ROOT, prepared_data, run_in_process


def table_rows(out, heading):
    """Cells of the data rows of the markdown table under `## heading` -> list of lists of str."""
    return table(out, heading)[1]


def table(out, heading):
    """The markdown table under `## heading` -> (its header cells, its data rows' cells): lists of str."""
    section = out.split(f'## {heading}\n', 1)[1].split('\n## ', 1)[0]
    lines = [[c.strip() for c in l.strip('|').split('|')] for l in section.splitlines() if l.startswith('|')]
    return lines[0], lines[2:]


def table_dicts(out, heading):
    """The data rows of the table under `## heading`, each {header cell: cell} -> list of dicts: a column is
    found by its name (a CUDA run adds columns: the nominal MFU, the peak memory)."""
    header, rows = table(out, heading)
    return [dict(zip(header, row)) for row in rows]


def printed(cell):
    """The interval a number printed with k decimals stands for -> (low, high): '0.410' is 0.4095 to 0.4105,
    '2,436' 2435.5 to 2436.5, '43.9%' and '1.02x' likewise. A test recomputing a column from others compares
    these intervals, never the rounded numbers: the rounding's share of a number depends on how large the
    machine's speed makes it (a 0.410 ms step's rounding is 0.12% of its tokens/s)."""
    text = cell.replace(',', '').rstrip('%x')
    half = 0.5 * 10 ** -len(text.partition('.')[2])
    return float(text) - half, float(text) + half


def quotient(num, den, scale=1.0):
    """The interval of scale x num / den for printed intervals num and den -> (low, high) (high inf where den
    may be 0 or less)."""
    return scale * num[0] / den[1], (scale * num[1] / den[0] if den[0] > 0 else float('inf'))


def product(a, b, scale=1.0):
    """The interval of scale x a x b for printed intervals of non-negative numbers a and b -> (low, high)."""
    return scale * max(a[0], 0) * max(b[0], 0), scale * a[1] * b[1]


def overlap(test, a, b, msg=None):
    """Assert that intervals a and b (low, high) share a number: the two printed numbers can be one value."""
    test.assertTrue(a[0] <= b[1] and b[0] <= a[1], f'{a} and {b} do not overlap: {msg}')


# python -m experiments.bench --quick, as two processes side by side (--quick runs one thread each):
# the memory table (a fresh process a variant), serving and SDPA; and the others
SPLIT = ('memory,serving,sdpa', 'train,generation,paths,decode')


def quiet(fn, *args):
    """fn(*args) with its stdout captured (and stderr's progress dropped) -> the stdout (str)."""
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
        fn(*args)
    return out.getvalue()


class TestBench(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        procs = [subprocess.Popen([sys.executable, '-m', 'experiments.bench', '--quick', '--tables', tables], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for tables in SPLIT]
        cls.procs = []
        for p in procs:                     # (their stderr, progress lines, stays far below a pipe's 64 kB)
            out, err = p.communicate(timeout=1200)
            cls.procs.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        cls.out = '\n'.join(p.stdout for p in cls.procs)

    def test_exit_status(self):
        for p in self.procs:
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])

    def test_all_tables_present(self):
        """Each table under its heading (each of the two runs prints the machine; the peak is measured,
        and printed, only by the run with the training table, whose MFU it is), and the tables --quick
        prints by default are every table but the loaded, load and precision ones (asked for only: their
        processes spin, or they time a config's own steps)."""
        default = [t for t in bench.TABLES if t not in ('loaded', 'load', 'precision')]
        self.assertEqual(bench.parse_args(['--quick']).tables, default)
        self.assertEqual(sorted(t for tables in SPLIT for t in tables.split(',')), sorted(default))
        for heading in ('Peak of the machine', 'Training throughput', 'Memory vs context length', 'Generation',
                        'Token-mixing paths', 'Decode step', 'Serving', 'SDPA backends'):
            self.assertIn(f'\n## {heading}\n', self.out)
        for tables, p in zip(SPLIT, self.procs):
            self.assertIn('machine:', p.stdout)
            self.assertEqual('\n## Peak of the machine\n' in p.stdout, 'train' in tables.split(','), tables)

    def test_training_table(self):
        """A row a variant; tokens/s = batch x n_ctx x 1000 / ms/step, "vs transformer" the ratio of two rows'
        tokens/s, MFU = machine.flops_per_token x tokens/s / the measured peak, each as printed (intervals: see
        printed; a row's MFU may read 0.0% on a machine whose peak is far above a tiny model's rate)."""
        args = bench.parse_args(['--quick'])
        rows = {r['variant']: r for r in table_dicts(self.out, 'Training throughput')}
        self.assertEqual(set(rows), set(mixer.VARIANTS))
        (peak,) = [printed(r['GFLOP/s']) for r in table_dicts(self.out, 'Peak of the machine')
                   if r['peak'].startswith('measured')]
        ref = printed(rows['transformer']['tokens/s'])
        tokens_per_step = args.batch_size * args.n_ctx
        for name, row in rows.items():
            tok_s = printed(row['tokens/s'])
            self.assertGreater(tok_s[1], 0.5, name)
            overlap(self, tok_s, quotient((tokens_per_step,) * 2, printed(row['ms/step']), 1000), name)
            overlap(self, printed(row['vs transformer']), quotient(tok_s, ref), name)
            model = bench_decode.build(name, args, 'meta', d_model=args.d_model, n_layer=args.n_layer, n_ctx=args.n_ctx)
            flops = machine.flops_per_token(model, args.n_ctx)
            mfu = quotient(product(tok_s, (flops, flops)), peak, 100 / 1e9)            # %, the peak in GFLOP/s
            if row['MFU'].startswith('n/a'):
                self.assertGreater(mfu[1], 100, name)                                   # only above the peak
            else:
                overlap(self, printed(row['MFU']), mfu, name)

    def test_memory_table(self):
        rows = table_rows(self.out, 'Memory vs context length')
        self.assertEqual([r[0] for r in rows], bench.QUICK['mem_variants'])
        for row in rows:
            for cell in row[1:]:
                self.assertRegex(cell, r'^[\d.]+ \+ [\d.]+$', row[0])

    def test_generation_table(self):
        rows = table_rows(self.out, 'Generation')
        methods = {r[0] for r in rows}
        self.assertEqual(len(methods), 5)
        self.assertIn('flat, window recompute', methods)
        for row in table_dicts(self.out, 'Generation'):                    # tokens/s = 1000 / ms/token, as printed
            overlap(self, printed(row['tokens/s']), quotient((1000, 1000), printed(row['ms/token'])), row)
            self.assertTrue(re.fullmatch(r'[\d.]+x', row['vs recompute']), row)

    def test_toeplitz_table(self):
        """Both Toeplitz paths timed at each length (a time in ms, 2 decimals: a fast machine may print 0.00)."""
        rows = table_rows(self.out, 'Token-mixing paths')
        self.assertEqual([r[0] for r in rows], ['32', '64'])
        for row in rows:
            self.assertRegex(row[1], r'^\d+\.\d\d$')
            self.assertRegex(row[2], r'^\d+\.\d\d$')

    def test_decode_table(self):
        """The compiled decode row: one compilation for every token, and 'compiled / limit' is the two columns
        divided, as printed (so the limit column is what it says; a limit that prints 0.000, a GPU's, bounds
        nothing)."""
        (row,) = table_dicts(self.out, 'Decode step')
        self.assertEqual((row['variant'], row['d_model x n_layer']), ('flat', '64 x 2'))
        divided = quotient(printed(row['compiled ms']), printed(row['read limit ms']))
        overlap(self, printed(row['compiled / limit']), divided)
        self.assertEqual(row['compiles'], '1')

    def test_serving_table(self):
        """--quick: a row for every kind, context and batch; tokens/s = batch x 1000 / ms (as printed: at 0.410 ms
        the rounding of ms alone is 0.12% of tokens/s, and the test failed on a fast machine); the bytes a
        sequence holds (the decoder's real buffers) are the meta-device count, the same at every context
        for the state kinds and in proportion to the context for the cache kinds; the largest batch is
        (memory - model) / (per sequence + step activations)."""
        args = bench.parse_args(['--quick'])
        rows = table_rows(self.out, 'Serving')
        self.assertEqual([(r[0], int(r[1]), int(r[2])) for r in rows],
                         [(f'{name} ({kind})', C, B) for name, kind in bench_decode.SERVE_KINDS.items()
                          for C in args.serve_contexts for B in args.serve_batches])
        per_seq = {}
        for row, cells in zip(rows, table_dicts(self.out, 'Serving')):
            name, C, B = row[0].split(' (')[0], int(row[1]), int(row[2])
            model_bytes, per_seq[name, C] = bench_decode.serve_bytes(name, C, args)
            self.assertEqual(row[3:6], [fmt_bytes(model_bytes), fmt_bytes(per_seq[name, C]),
                                        f'{bench_decode.largest_batch(model_bytes, per_seq[name, C], args):,}'], row)
            overlap(self, printed(cells['tokens/s']), quotient((B * 1000,) * 2, printed(cells['ms/token'])), row)
        small, large = args.serve_contexts
        for name, kind in bench_decode.SERVE_KINDS.items():
            with self.subTest(kind=name):
                ratio = per_seq[name, large] / per_seq[name, small]
                self.assertEqual(ratio, 1 if kind == 'state' else large / small)

    def test_serving_cells_over_the_budget_are_not_run(self):
        """With the memory between the cells' estimates, exactly the cells estimated above it read 'over
        budget' and are not run; with a tiny memory, none runs and the largest batch is 0."""
        args = bench.parse_args(['--quick', '--serve_variants', 'flat', '--device', 'cpu'])
        need = {(C, B): bench_decode.serve_estimate('flat', C, B, *bench_decode.serve_bytes('flat', C, args), args)
                for C in args.serve_contexts for B in args.serve_batches}
        low, high = sorted(need.values())[1:3]
        for gib in ((low + high) / 2 / 2 ** 30, 1e-6):
            args.serve_memory_gb = gib
            with mock.patch.object(bench_decode, 'serve_cell', wraps=bench_decode.serve_cell) as cell:
                rows = table_rows(quiet(bench_decode.bench_serving, args), 'Serving')
            ran = {(c.args[2], c.args[1]) for c in cell.call_args_list}          # serve_cell(model, batch, n_ctx, args)
            over = {(int(r[1]), int(r[2])) for r in rows if r[8] == 'over budget'}
            with self.subTest(gib=gib):
                self.assertEqual(ran, {k for k, v in need.items() if v <= gib * 2 ** 30})
                self.assertEqual(over, set(need) - ran)
                self.assertTrue(over)
        self.assertEqual({r[5] for r in rows}, {'0'})

    def test_bad_flag_exits_2(self):
        """(In this process: test_faults runs bench's bad flags as processes too.)"""
        proc = run_in_process('-m', 'experiments.bench', '--variants', 'nope', timeout=600)
        self.assertEqual(proc.returncode, 2)
        self.assertIn('nope', proc.stderr)


def refused(argv):
    """bench.parse_args(argv) exits 2 with one line on stderr -> that line (AssertionError otherwise)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            bench.parse_args(argv)
    except SystemExit as e:
        lines = err.getvalue().strip().splitlines()
        assert e.code == 2 and len(lines) == 1, (e.code, err.getvalue())
        return lines[0]
    raise AssertionError(f'bench.parse_args({argv}) accepted')


class TestBenchSettings(unittest.TestCase):
    """bench's settings, checked before any table runs (in this process: no --quick run of its own)."""

    def test_decode_table_has_every_kind(self):
        """The decode table's default kinds are the five of the serving table, and each gets its row at the
        most tokens its n_ctx takes (the prompt a quarter of it, then --decode_tokens: 8 + 24 = 32, what
        check_decode lets through, so the Decoder agrees with it); the step not compiled here, for time (the
        --quick run's flat row is inductor's, and test_compile compiles every kind's step)."""
        kinds = bench.parse_args([]).decode_variants
        self.assertEqual(sorted(kinds), sorted(bench_decode.SERVE_KINDS))
        args = bench.parse_args(['--quick', '--decode_tokens', '24', '--decode_n_ctx', '32',
                                 '--decode_variants', ','.join(kinds)])
        self.assertEqual(args.decode_variants, kinds)   # given at its default value: not --quick's ['flat']
        uncompiled = lambda model, compile=False, real=sample.Decoder: real(model)      # noqa: E731
        with mock.patch.object(sample, 'Decoder', uncompiled):
            rows = table_rows(quiet(bench_decode.bench_decode, args), 'Decode step')
        self.assertEqual([r[0] for r in rows], kinds)
        for row in rows:
            self.assertGreater(min(float(row[5]), float(row[6]), float(row[7])), 0, row)   # eager, late, "compiled"

    def test_loaded_table(self):
        """--tables loaded (asked for only, never by default): quiet and beside --busy spinning processes, a
        row on all threads and one on the decoder's (one thread at --quick's small step), --tries medians a
        row between their least and largest, at --loaded_batches; every spinner is gone after the table, and the table is the
        CPU's (another device: one line, exit 2)."""
        self.assertNotIn('loaded', bench.parse_args([]).tables)
        args = bench.parse_args(['--quick', '--tables', 'loaded', '--busy', '1'])
        spinners, popen = [], subprocess.Popen
        with mock.patch.object(bench_decode.subprocess, 'Popen', lambda *a, **k: spinners.append(popen(*a, **k))
                               or spinners[-1]):
            rows = table_rows(quiet(bench_decode.bench_loaded, args), 'Decoding on a loaded CPU')
        self.assertEqual([r[:3] for r in rows], [['nothing', '1', 'all threads'], ['nothing', '1', "the decoder's: 1 thread"],
                                                 ['1 busy processes', '1', 'all threads'],
                                                 ['1 busy processes', '1', "the decoder's: 1 thread"]])
        for row in rows:
            tries = [float(t) for t in row[3].split()]
            self.assertEqual(len(tries), args.tries)
            self.assertEqual((min(tries), max(tries)), (float(row[4]), float(row[5])))
        self.assertEqual(len(spinners), 1)
        self.assertTrue(all(p.poll() is not None for p in spinners))
        args.device = torch.device('cuda')
        with self.assertRaises(SystemExit) as e, contextlib.redirect_stderr(io.StringIO()) as err:
            bench.check_decode(ArgumentParser('bench.py', ''), args)
        self.assertEqual((e.exception.code, err.getvalue().count('\n')), (2, 1))
        self.assertIn('--device cpu', err.getvalue())

    def test_load_table(self):
        """--tables load (asked for only): train.py's steady tokens/s a row, torch's default count first and "of
        quiet" each row's over its quiet row (at the printed precision), then the run through which a busy
        process comes and goes, each part's ratio to the chosen run of its load; every spinner gone after it."""
        self.assertNotIn('load', bench.parse_args([]).tables)
        args = bench.parse_args(['--quick', '--tables', 'load', '--load_busy', '0', '--load_data_dir', prepared_data()])
        spinners, real_popen = [], subprocess.Popen

        def popen(cmd, **kw):                                       # the spinners counted, train.py's runs not
            p = real_popen(cmd, **kw)
            if '-c' in cmd:
                spinners.append(p)
            return p
        with mock.patch.object(bench_load.subprocess, 'Popen', popen):
            out = quiet(bench_load.bench_load, args)
        rows = [r for r in table_rows(out, 'Training beside busy processes') if r[0] == 'nothing']
        cores = len(os.sched_getaffinity(0))
        self.assertEqual([r[:2] for r in rows[:-1]], [['nothing', str(n)] for n in dict.fromkeys([cores, 1])])
        self.assertTrue(rows[-1][1].startswith(f'chosen: {cores}'))
        quiet_rate = float(rows[0][2].replace(',', ''))
        for row in rows:        # the rates are printed whole: their ratio is known within a rounding of each
            rate = float(row[2].replace(',', ''))
            rounding = (rate + 0.5) / (quiet_rate - 0.5) - rate / quiet_rate
            self.assertAlmostEqual(float(row[3]), rate / quiet_rate, delta=0.005 + rounding + 1e-9)
        parts = [r.split(' | ') for r in out.split('| steps |')[1].strip().split('\n')[2:]]
        self.assertEqual([p[0].strip('| ') for p in parts], ['0..10', '10..20', '20..30'])
        self.assertLessEqual(len(spinners), 1)     # the run's busy part (missed if its steps pass between two looks)
        self.assertTrue(all(p.poll() is not None for p in spinners))

    def test_quick_sets_only_the_flags_not_given(self):
        """--quick's sizes replace the defaults of the flags not given, never a flag given, even one given at
        its default value (the default list of the decode table is five kinds, not --quick's one)."""
        default = ['flat', 'toeplitz', 'recurrent', 'transformer', 'linear_attention']
        self.assertEqual(bench.parse_args([]).decode_variants, default)
        quick = bench.parse_args(['--quick', '--tables', 'decode'])
        self.assertEqual((quick.decode_variants, quick.d_model, quick.decode_tokens), (['flat'], 64, 16))
        given = bench.parse_args(['--tables', 'decode', '--quick', '--decode_variants', ','.join(default),
                                  '--d_model', '256'])
        self.assertEqual((given.decode_variants, given.d_model, given.decode_tokens), (default, 256, 16))
        self.assertEqual(bench.given_flags(bench.argparse.ArgumentParser(), []), set())

    def test_the_generation_warm_up_fits_any_prompts_and_tokens(self):
        """The generation table's n_ctx is the longest prompt plus --new_tokens, and its warm-up fits it
        (an 8-token warm-up prompt would pass an n_ctx of 6)."""
        args = bench.parse_args(['--quick', '--tables', 'generation', '--prompts', '4', '--new_tokens', '2',
                                 '--recompute_tokens', '2'])
        rows = table_rows(quiet(bench_decode.bench_generation, args), 'Generation')
        self.assertEqual(len(rows), len(bench_decode.GEN_METHODS))

    def test_decode_tokens_that_do_not_fit_n_ctx_are_refused_before_any_model(self):
        """The decode and SDPA rows step a prompt of n_ctx / 4 tokens, then --decode_tokens: past n_ctx the
        Decoder of every position-indexed kind refuses (the recurrent one too), so parse_args refuses it in
        one line, exit 2, before any table runs (no decoder made but on the meta device: check_memory's, which
        hold no memory); linear attention without positions has no limit, and a run without those tables has
        nothing to check."""
        real = bench_decode.sample.Decoder

        def meta_only(model, *args, **kw):
            if not next(model.parameters()).is_meta:
                raise AssertionError('a decoder was built')
            return real(model, *args, **kw)
        with mock.patch.object(bench_decode.sample, 'Decoder', side_effect=meta_only):
            for kind in ('recurrent', 'flat', 'toeplitz', 'transformer'):
                with self.subTest(kind=kind):
                    line = refused(['--tables', 'decode', '--decode_variants', kind, '--decode_n_ctx', '32',
                                    '--decode_tokens', '25'])
                    self.assertTrue(line.startswith('bench.py: error: --decode_tokens 25'), line)
                    self.assertIn(kind, line)
                    self.assertIn('<= 24', line)
            line = refused(['--tables', 'sdpa', '--decode_n_ctx', '32', '--decode_tokens', '25'])
            self.assertIn('transformer', line)
            self.assertIn('--decode_n_ctx', refused(['--tables', 'decode', '--decode_n_ctx', '7']))
            bench.parse_args(['--tables', 'decode', '--decode_n_ctx', '32', '--decode_tokens', '24'])
            bench.parse_args(['--tables', 'decode', '--decode_variants', 'linear_attention', '--decode_n_ctx', '32',
                              '--decode_tokens', '1000'])
            bench.parse_args(['--tables', 'train', '--decode_n_ctx', '32', '--decode_tokens', '1000'])


if __name__ == '__main__':
    unittest.main()
