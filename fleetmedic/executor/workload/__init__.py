"""The executor's job track: :mod:`.plan` and :mod:`.placement_plan` (pure) plan a workload's restart
and its placement; :mod:`.api`, :mod:`.apply`, :mod:`.jobset`, :mod:`.kueue` and
:mod:`.placement_apply` carry it out through the API server."""
