"""The frontier's report: tables, frontier-summary.json and frontier.png (``diloco.studies.frontier_report``).

.venv/bin/python studies/frontier/report.py            # table; frontier-summary.json and frontier.png
.venv/bin/python studies/frontier/report.py --planner cpu-1m   # also: the planner charges that size's rows
.venv/bin/python studies/frontier/report.py --planner cpu-1m --batch 64   # ... at that global batch (default 16)
.venv/bin/python studies/frontier/report.py --planner cpu-1m --batch 128 --device cuda   # ... of the GPU runs
"""

import sys

from diloco.studies.frontier_report import main

if __name__ == "__main__":
    sys.exit(main())
