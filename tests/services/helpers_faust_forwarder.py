"""A minimal Faust app for the smoke test (run as ``python helpers_faust_forwarder.py worker --without-web``).

Agent ``forward`` reads ``<id>-in``, counts records per key in table ``counts`` (changelog topic
``<id>-counts-changelog``) and sends ``"<value>|<count>"`` to ``<id>-out`` with the input headers
plus ``forwarded-by: faust``. Settings come from the environment: FLEETMEDIC_KAFKA_BOOTSTRAP,
FAUST_APP_ID, FAUST_DATADIR.
"""

from __future__ import annotations

import os
from typing import Any

import faust

APP_ID = os.environ["FAUST_APP_ID"]

app = faust.App(
    APP_ID,
    broker=f"kafka://{os.environ['FLEETMEDIC_KAFKA_BOOTSTRAP']}",
    store="memory://",
    datadir=os.environ["FAUST_DATADIR"],
    topic_partitions=1,
    topic_replication_factor=1,
    # `faust worker` enables the web server unless --without-web, whatever this says; and it
    # binds all interfaces by default. Keep it on loopback in case someone drops the flag.
    web_enabled=False,
    web_bind="127.0.0.1",
    broker_commit_every=1,
)
source = app.topic(f"{APP_ID}-in", key_type=str, value_type=str)
sink = app.topic(f"{APP_ID}-out", key_type=str, value_type=str)
counts = app.Table("counts", default=int, partitions=1, key_type=str, value_type=int)


@app.agent(source)
async def forward(stream: Any) -> None:
    async for event in stream.events():
        counts[event.key] += 1
        headers = {**dict(event.headers or {}), "forwarded-by": b"faust"}
        await sink.send(key=event.key, value=f"{event.value}|{counts[event.key]}", headers=headers)


if __name__ == "__main__":
    app.main()
