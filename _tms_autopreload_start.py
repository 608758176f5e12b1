# Written by tools/pthfile.py from the tms_autopreload package's source; do not edit.
"""tms_autopreload's start-up entry, imported by tms_autopreload.pth where a flag is set."""

try:
    from tms_autopreload import process_startup
except ImportError:  # the package is gone, its .pth left over: say so once, with the fix
    import _tms_autopreload_left_over  # noqa: F401 - it runs on import
else:
    process_startup()
