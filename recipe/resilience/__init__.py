"""Runs that lose nothing: checkpoint guards and manifests, preemption and held signals, the dump-folder
lock, non-finite guards and process-group teardown."""
