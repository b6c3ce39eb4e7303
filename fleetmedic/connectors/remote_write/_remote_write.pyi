from collections.abc import Iterator
from typing import Any

def hold_inline(series: Iterator[bytes], prefixes: dict[bytes, Any], stamps: dict[bytes, float], /
                ) -> tuple[bytes | None, int, int, int]: ...
