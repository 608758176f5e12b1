"""Interpreter start-up entry: run by ``tms_autopreload.pth`` (and ``tms_autopreload.start``).

This module is imported only when a flag variable exists (the ``.pth`` line checks first), and
imports nothing beyond ``os`` and ``sys`` until :func:`process_startup` finds a flag set. It is
idempotent: in a venv on Python 3.10-3.13 site-packages is scanned twice, so the ``.pth`` runs
twice per start (CPython #75723), and coverage.py's ``process_startup`` guards the same way.
"""

import os
import sys

_started = False


def process_startup() -> None:
    """Apply the preload hook to this process when SLIME_OFFLOAD_TRAIN or TMS_AUTOPRELOAD asks."""
    global _started
    if _started:
        return
    _started = True
    if sys.platform != "linux":
        return
    if not (os.environ.get("SLIME_OFFLOAD_TRAIN") or os.environ.get("TMS_AUTOPRELOAD")):
        return
    from .hook import run

    run()
