"""Example third-party vllm-srun plugin: the NanoGuard prompt-injection classifier family."""
