"""A stand-in experiment for the Ctrl-C tests of the experiments' pool (tests/test_faults_ctrl_c.py):
experiments/runner.py's Runner run through runner.command as claims.py, icl.py and mqar.py run it, its jobs
short sleeps, in the phases an experiment has, each announced on stderr before it starts:

    calibration    Runner.map of 4 jobs (the workers start here)
    runs           Runner.chains of 2 chains of 3 jobs
    (pool closed)  Runner.close
    report         0.5 s with no pool, then 'done'

    python -m tests.pool_command OUT      # the jobs' folders under OUT
"""

import sys
import time

from experiments import runner as R

NAP_S = 0.3             # seconds a job sleeps


def nap(spec, run_dir):
    """A Runner job (run in a pool process): sleep spec['s'] seconds -> {'rc': 0, 'line'}."""
    time.sleep(spec['s'])
    return {'rc': 0, 'line': f'slept {spec["s"]} s'}


def main():
    """The phases above, on a Runner of 2 processes under sys.argv[1] -> None."""
    out = sys.argv[1]
    runner = R.Runner(out, 2, 1)
    R.say('calibration: starting')
    runner.map(nap, [R.job(f'{out}/calibration', f'c{i}', {'s': NAP_S, 'i': i}, NAP_S, 'v1') for i in range(4)],
               'calibration')
    R.say('runs: starting')
    runner.chains(nap, [[R.job(f'{out}/runs', f'r{c}', {'s': NAP_S, 'c': c, 'k': k}, NAP_S, 'v1') for k in range(3)]
                        for c in range(2)], 'runs')
    runner.close()
    R.say('report: writing')
    time.sleep(0.5)
    R.say('done')


if __name__ == '__main__':
    sys.exit(R.command(main, 'pool_command.py'))
