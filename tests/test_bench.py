"""Smoke test of bench.py: `python test_mixer.py test_bench`. Speed is never asserted here."""

import re
import subprocess
import sys
import unittest

from experiments import bench
import mixer

from tests.common import ROOT, run_in_process


def table_rows(out, heading):
    """Cells of the data rows of the markdown table under `## heading` -> list of lists of str."""
    section = out.split(f'## {heading}\n', 1)[1].split('\n## ', 1)[0]
    lines = [l for l in section.splitlines() if l.startswith('|')]
    return [[c.strip() for c in l.strip('|').split('|')] for l in lines[2:]]


# python -m experiments.bench --quick, as two processes side by side (--quick runs one thread each):
# the memory table, whose nine fresh processes (one a variant) take most of the time, and the others
SPLIT = ('memory', 'train,generation,paths,decode')


class TestBench(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        procs = [subprocess.Popen([sys.executable, '-m', 'experiments.bench', '--quick', '--tables', tables], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for tables in SPLIT]
        cls.procs = []
        for p in procs:                     # (their stderr, progress lines, stays far below a pipe's 64 kB)
            out, err = p.communicate(timeout=300)
            cls.procs.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
        cls.out = '\n'.join(p.stdout for p in cls.procs)

    def test_exit_status(self):
        for p in self.procs:
            self.assertEqual(p.returncode, 0, p.stderr[-3000:])

    def test_all_tables_present(self):
        """Each table under its heading (each of the two runs prints the machine; the peak is measured,
        and printed, only by the run with the training table, whose MFU it is), and the tables --quick
        prints by default are every table."""
        self.assertEqual(bench.parse_args(['--quick']).tables, list(bench.TABLES))
        self.assertEqual(sorted(t for tables in SPLIT for t in tables.split(',')), sorted(bench.TABLES))
        for heading in ('Peak of the machine', 'Training throughput', 'Memory vs context length', 'Generation',
                        'Token-mixing paths', 'Decode step'):
            self.assertIn(f'\n## {heading}\n', self.out)
        for tables, p in zip(SPLIT, self.procs):
            self.assertIn('machine:', p.stdout)
            self.assertEqual('\n## Peak of the machine\n' in p.stdout, 'train' in tables.split(','), tables)

    def test_training_table(self):
        rows = {r[0]: r for r in table_rows(self.out, 'Training throughput')}
        self.assertEqual(set(rows), set(mixer.VARIANTS))
        for name, row in rows.items():
            self.assertGreater(float(row[3]), 0, name)                       # tokens/s
            self.assertGreater(float(row[4].rstrip('%')), 0, name)           # MFU
        ref = float(rows['transformer'][3])
        tokens_per_step = 2 * 64                                              # --quick: batch 2 x n_ctx 64
        for name, row in rows.items():
            ms, tok_s, ratio = float(row[2]), float(row[3]), float(row[5].rstrip('x'))
            self.assertAlmostEqual(ratio, tok_s / ref, delta=0.006, msg=name)   # the ratio of the two columns
            self.assertAlmostEqual(tok_s * ms / 1000, tokens_per_step, delta=0.01 * tokens_per_step, msg=name)

    def test_memory_table(self):
        rows = table_rows(self.out, 'Memory vs context length')
        self.assertEqual([r[0] for r in rows], list(bench.MEM_VARIANTS))
        for row in rows:
            for cell in row[1:]:
                self.assertRegex(cell, r'^[\d.]+ \+ [\d.]+$', row[0])

    def test_generation_table(self):
        rows = table_rows(self.out, 'Generation')
        methods = {r[0] for r in rows}
        self.assertEqual(len(methods), 5)
        self.assertIn('flat, window recompute', methods)
        for row in rows:
            self.assertGreater(float(row[5]), 0, row)                         # tokens/s
            self.assertTrue(re.fullmatch(r'[\d.]+x', row[6]), row)            # vs recompute

    def test_toeplitz_table(self):
        rows = table_rows(self.out, 'Token-mixing paths')
        self.assertEqual([r[0] for r in rows], ['32', '64'])
        for row in rows:
            self.assertGreater(float(row[1]), 0)
            self.assertGreater(float(row[2]), 0)

    def test_decode_table(self):
        """The compiled decode row: one compilation for every token, and 'compiled /
        limit' is the two columns divided (so the limit column is what it says)."""
        (row,) = table_rows(self.out, 'Decode step')
        self.assertEqual(row[:2], ['flat', '64 x 2'])
        limit, compiled = float(row[4]), float(row[7])
        self.assertGreater(limit, 0)
        self.assertAlmostEqual(float(row[8].rstrip('x')), compiled / limit, delta=0.06 + 0.01 * compiled / limit)
        self.assertEqual(row[10], '1')

    def test_bad_flag_exits_2(self):
        """(In this process: test_faults runs bench's bad flags as processes too.)"""
        proc = run_in_process('-m', 'experiments.bench', '--variants', 'nope', timeout=120)
        self.assertEqual(proc.returncode, 2)
        self.assertIn('nope', proc.stderr)


if __name__ == '__main__':
    unittest.main()
