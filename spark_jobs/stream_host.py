"""spark-submit entry point: the stream host, one streaming job for every supervised pipeline.

    spark-submit spark_jobs/stream_host.py [--namespace NS]

Launched by the supervisors when TIDEWATER_STREAM_HOST=true (see tidewater.streaming.host); it starts
and stops each pipeline's queries on their requests, and leaves once it hosts none.
"""

import sys

from tidewater.cli import main

if __name__ == "__main__":
    sys.exit(main(["stream-host", *sys.argv[1:]]))
