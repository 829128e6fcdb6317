"""The outer-steps study's grids, one stage at a time (``diloco.studies.outer_steps_grids`` says what each holds).

.venv/bin/python studies/outer-steps/grids.py 1          # the first stage: writes grids/*.json, prints their paths
.venv/bin/python studies/outer-steps/grids.py 2 RESULTS  # the second, read off the first stage's records
.venv/bin/python studies/outer-steps/grids.py 3 RESULTS  # the third: seeds at an outer lr that beat 0.7
.venv/bin/python studies/outer-steps/grids.py 4          # the fourth, written from the first two's results
"""

import sys

from diloco.studies.outer_steps_grids import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
