"""``python -m tms_autopreload``: the same as the ``tms-autopreload`` command."""

from .cli import main

raise SystemExit(main())
