"""``tms-autopreload doctor`` in its rooms: the command, and one module for each of its modes.

:mod:`.command` is the command (its parser, its modes' rules); :mod:`.document` the report of one process and
its JSON document; :mod:`.deep` ``--deep``; :mod:`.ray_cluster` ``--ray``, with :mod:`.ray_driver`, the Ray
driver it starts; :mod:`.nodes` ``--nodes``; :mod:`.node_table` the rows both of those show; :mod:`.driver` the
NVIDIA driver check every report makes.
"""
