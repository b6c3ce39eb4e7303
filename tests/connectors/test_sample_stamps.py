"""A sample stamped in seconds where milliseconds are expected (the exposition format's integer
timestamps, remote write's ``timestamp``) would date its record in January 1970: it is skipped and
counted with that reason, on both paths; a sample stamped in milliseconds is read as before."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fleetmedic.config import Settings
from fleetmedic.connectors.prometheus.text import ExpositionReader
from fleetmedic.connectors.remote_write.assembler import SampleCounts, write_request_samples
from fleetmedic.connectors.remote_write.codec import decode_request, encode_request

HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
           "X-Prometheus-Remote-Write-Version": "0.1.0"}
LABELS = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", "Hostname": "n1"}
SECONDS = 1_790_000_000
REASON = "DCGM_FI_DEV_GPU_TEMP: timestamp in seconds where milliseconds are expected"


def _remote_write(points: list[tuple[float, int]]) -> tuple[list[Any], SampleCounts, Counter[str]]:
    counts, skipped = SampleCounts(), Counter[str]()
    request = decode_request(encode_request([(LABELS, points)]), HEADERS, 1 << 20, 8 << 20)
    return list(write_request_samples(request, skipped, counts)), counts, skipped


def test_a_remote_write_sample_stamped_in_seconds_is_skipped_with_its_reason() -> None:
    samples, counts, skipped = _remote_write([(50.0, SECONDS), (51.0, SECONDS * 1000 + 15_000)])
    assert [(s[2], s[3]) for s in samples] == [(51.0, SECONDS + 15.0)]  # no record dated 1970
    assert counts.skipped == 1 and skipped == Counter({REASON: 1})


def test_an_exposition_sample_stamped_in_seconds_is_skipped_with_its_reason() -> None:
    reader = ExpositionReader.for_settings(Settings())
    text = [f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="n1"}} 50 {SECONDS}',
            f'DCGM_FI_DEV_GPU_TEMP{{gpu="1",Hostname="n1"}} 51 {SECONDS * 1000}']
    samples = list(reader.parse(text))
    assert [(s[2], s[3]) for s in samples] == [(51.0, float(SECONDS))]
    assert reader.skipped == Counter({REASON: 1})
    # OpenMetrics' integer timestamps are seconds: read as they are
    om = ExpositionReader.for_settings(Settings())
    assert [s[3] for s in om.parse(text[:1], openmetrics=True)] == [float(SECONDS)] and not om.skipped
