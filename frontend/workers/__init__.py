"""Runtime workers: one per replica, managed (a supervised ``vllm-srun serve --uds``
process) or attached (an endpoint someone else runs)."""
