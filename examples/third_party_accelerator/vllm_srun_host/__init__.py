"""Example third-party vllm-srun plugin: the CPU-backed ``host`` accelerator."""
