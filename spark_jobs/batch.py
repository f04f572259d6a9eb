"""spark-submit entry point: bounded recomputes (the scheduled batch, replays, late-data corrections).

    spark-submit spark_jobs/batch.py recompute --pipeline rsvps --start ISO --end ISO --run-id ID [--namespace NS]
    spark-submit spark_jobs/batch.py replay    --pipeline rsvps --start ISO --end ISO --run-id ID
                                               [--source bronze|kafka] [--target live|sandbox]
                                               [--sandbox-namespace NAME] [--entity V ...]
    spark-submit spark_jobs/batch.py correct   --pipeline rsvps --start ISO --end ISO --run-id ID

Configuration comes from TIDEWATER_* variables (see tidewater.config.Settings). The last line of a
successful run is ``tidewater: result {json}``.
"""

import sys

from tidewater.cli import main

if __name__ == "__main__":
    sys.exit(main(["batch", *sys.argv[1:]]))
