"""Client keys and teams managed at run time (``/admin/keys``, ``/admin/teams``): records,
their index, where they are kept (this process, or Redis shared by every replica) and the
audit of every operation."""
