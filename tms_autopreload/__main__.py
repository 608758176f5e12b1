"""``python -m tms_autopreload``: the same as the ``tms-autopreload`` command.

One of the two places the hook's wing hands over to the commands' wing (:mod:`tms_autopreload.commands`),
with :mod:`tms_autopreload.cli`."""

from .commands.main import main

raise SystemExit(main())
