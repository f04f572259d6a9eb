"""spark-submit entry point: the data-quality audit of one interval (see ``tidewater audit run --help``).

    spark-submit spark_jobs/audit.py --pipeline rsvps --start ISO --end ISO [--checks ...] [--trigger ...]
                                     [--dag-id D --run-id R --task-id T] [--namespace NS]

The last line of a run is ``tidewater: result {json}``; a failed suite then fails the job in one line.
"""

import sys

from tidewater.cli import main

if __name__ == "__main__":
    sys.exit(main(["audit", "run", *sys.argv[1:]]))
