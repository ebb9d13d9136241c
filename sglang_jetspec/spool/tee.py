"""The worker side of shadow verification: sample finished requests and spool them, never blocking.

    tee = ShadowTee(SpoolWriter(spool_dir), sample_rate=policy.shadow.sample_rate, registry=registry)
    tee.start()
    ...
    if tee.sampled():                 # cheap coin flip first: build records only for sampled requests
        tee.offer(record)             # returns at once; False (and counted) when the queue is full
    ...
    tee.close()

The serving thread only flips a coin and puts the record on a bounded queue; one writer thread
serialises and fsyncs. A full queue or a failing disk drops records (counted in
`jetspec_shadow_spool_dropped_total`), never stalls decoding. Any engine can call it: the record is
the engine-agnostic ShadowRecord.
"""

from __future__ import annotations

import logging
import queue
import random
import threading

from prometheus_client import CollectorRegistry, Counter

from .record import ShadowRecord
from .writer import SpoolWriter

log = logging.getLogger(__name__)

_STOP = object()


class SpoolMetrics:
    def __init__(self, registry: CollectorRegistry | None):
        self.spooled = Counter("jetspec_shadow_spooled", "Shadow records written to the spool", registry=registry)
        self.dropped = Counter(
            "jetspec_shadow_spool_dropped",
            "Shadow records dropped (queue full or spool write failed)",
            registry=registry,
        )
        self.unchecked = Counter(
            "jetspec_shadow_unchecked",
            "Finished requests never teed: the checker cannot rebuild their distribution",
            ["reason"],
            registry=registry,
        )


class ShadowTee:
    def __init__(
        self,
        writer: SpoolWriter,
        sample_rate: float,
        registry: CollectorRegistry | None = None,
        capacity: int = 1024,
        rng: random.Random | None = None,
    ):
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"sample_rate={sample_rate}: must be in [0, 1] (policy shadow.sample_rate)")
        self._writer = writer
        self.sample_rate = sample_rate
        self.metrics = SpoolMetrics(registry)
        self._queue: queue.Queue = queue.Queue(maxsize=capacity)
        self._rng = rng or random.Random()
        self._thread = threading.Thread(target=self._drain, name="jetspec-shadow-spool", daemon=True)

    def start(self) -> ShadowTee:
        self._thread.start()
        return self

    def sampled(self) -> bool:
        """Whether to tee the request that just finished (probability `sample_rate`)."""
        return self._rng.random() < self.sample_rate

    def offer(self, record: ShadowRecord) -> bool:
        """Queue a record for the spool without waiting; False if it was dropped."""
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.metrics.dropped.inc()
            return False
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued (up to `timeout_s`), then close the spool file."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout_s)
        self._writer.close()

    def _drain(self) -> None:
        while (record := self._queue.get()) is not _STOP:
            try:
                self._writer.write(record)
            except OSError as exc:
                self.metrics.dropped.inc()
                log.warning("shadow spool write failed, record %s dropped: %s", record.request_id, exc)
            else:
                self.metrics.spooled.inc()
