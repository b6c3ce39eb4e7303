"""The executor's node track: :mod:`.plan` and :mod:`.long_plan` (pure) decide what a command means
for a node, :mod:`.apply` (``CommandExecutor``) and :mod:`.long_apply` carry it out."""
