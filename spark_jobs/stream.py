"""spark-submit entry point: run one pipeline's streaming queries.

    spark-submit spark_jobs/stream.py rsvps [--available-now] [--namespace NS] [--launched-at UNIX_TIME]

Configuration comes from TIDEWATER_* variables (see tidewater.config.Settings). The job stops cleanly
(exit 0) on SIGTERM or on a stop request newer than --launched-at (see tidewater.streaming.stop_request).
"""

import sys

from tidewater.cli import main

if __name__ == "__main__":
    sys.exit(main(["stream", *sys.argv[1:]]))
