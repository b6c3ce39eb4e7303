"""``fleetmedic dev``: placeholder replaced by the services work (issue 3)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    return None
