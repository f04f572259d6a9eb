"""spark-submit entry point: run one pipeline's streaming queries.

    spark-submit spark_jobs/stream.py rsvps [--available-now] [--namespace NS]

Configuration comes from TIDEWATER_* variables (see tidewater.config.Settings).
"""

import sys

from tidewater.cli import main

if __name__ == "__main__":
    sys.exit(main(["stream", *sys.argv[1:]]))
