"""Built-in engines (native PyTorch, ONNX Runtime), each a plugin found through the ``vllm_srun`` entry points."""
