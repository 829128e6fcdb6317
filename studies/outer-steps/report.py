"""The outer-steps study's tables, summary and plot (``diloco.studies.outer_steps_report``).

.venv/bin/python studies/outer-steps/report.py            # prints the tables, writes outer-steps-summary.json
                                                          # and outer-steps.png beside this file
"""

import sys

from diloco.studies.outer_steps_report import main

if __name__ == "__main__":
    sys.exit(main())
