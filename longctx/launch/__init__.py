"""Starting the worker processes of one launch: on this host, or as a Slurm job step."""
