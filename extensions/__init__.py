"""Built-in surface extensions, each a plugin found through the ``vllm_srun`` entry points."""
