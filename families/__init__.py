"""Built-in model families, each a plugin found through the ``vllm_srun`` entry points."""
