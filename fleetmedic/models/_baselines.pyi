from typing import Any

def step_baselines_at(
    shape: tuple[int, int, int], rows: int, y: Any, planes: Any, idx: Any, sign: Any, z_warning: Any,
    z_critical: Any, min_delta: Any, std_floor: Any, alpha: float, warmup: float, min_std: float, protect_z: float,
    continuity: float, cusum_k: float, cusum_h: float, z: Any, deviation: Any, baseline: Any, flags: Any,
) -> None: ...

def signals_at(
    shape: tuple[int, int, int, int, int], rows: int, x: Any, prev: Any, idx: Any, dt: Any, reset: Any, medians: Any,
    residual_rows: Any, watched_rows: Any, group_starts: Any, group_members: Any, max_gap_s: float, out: Any,
) -> None: ...
