"""What the broker still retains of each topic a stream reads: the first offset of every partition.

Lag against the broker's end says how far behind a stream is; lag against what the broker *retains*
says how soon that turns into loss: once retention deletes records the stream has not read, they are
gone from Kafka (the source refuses, or with failOnDataLoss=false skips them). The progress records
carry both (``lag``, and ``retained``: the records each partition still holds), and the streams page
shows the unread share of each partition's retained log. The first offset is the one a fetch confirms
(:meth:`KafkaPythonClient.first_readable`, the Kafka source's rule too): a broker that misreports it
would otherwise have the page say records were deleted unread.

The broker is asked from a daemon thread once a minute, never from Spark's listener thread: a slow or
unreachable broker must not delay the heartbeat files the supervisor judges the driver by.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from tidewater.config import Settings
from tidewater.connectors.kafka_client import KafkaPythonClient, kafka_python_config

log = logging.getLogger(__name__)
LOOK_EVERY_SECONDS = 60.0


class RetentionWatch:
    """Keeps ``{"topic/partition": first retained offset}`` of ``topics`` fresh within a minute."""

    def __init__(self, settings: Settings, topics: Sequence[str], *, every_s: float = LOOK_EVERY_SECONDS) -> None:
        self._settings = settings
        self._topics = list(topics)
        self._every_s = every_s
        self._lock = threading.Lock()
        self._first: dict[str, int] = {}
        self._looked_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> RetentionWatch:
        self._thread = threading.Thread(target=self._loop, name="tidewater-retention-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)  # a look blocked on a dead broker ends with the process

    def snapshot(self) -> tuple[dict[str, int], float | None]:
        """The first retained offset per partition and when the broker said so (None: not yet)."""
        with self._lock:
            return dict(self._first), self._looked_at

    def look(self, client: KafkaPythonClient) -> None:
        """Ask the broker once (the loop calls this; a test may too)."""
        first: dict[str, int] = {}
        for topic in self._topics:
            partitions = client.partitions(topic)
            reported = client.earliest_offsets(topic, partitions)
            first |= {f"{topic}/{p}": client.first_readable(topic, p, o) for p, o in reported.items()}
        with self._lock:
            self._first, self._looked_at = first, time.time()

    def _loop(self) -> None:
        client = KafkaPythonClient(kafka_python_config(self._settings), stall_timeout_s=15)
        try:
            while not self._stop.is_set():
                try:
                    self.look(client)
                except Exception as error:  # a broker hiccup costs one look, not the stream
                    log.warning(
                        "retention watch: could not ask the broker (%s); the next look is in %.0f s",
                        str(error).splitlines()[0] if str(error) else type(error).__name__,
                        self._every_s,
                    )
                self._stop.wait(self._every_s)
        finally:
            client.close()
