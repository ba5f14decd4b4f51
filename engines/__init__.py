"""Built-in engines (native PyTorch, ONNX Runtime), each a plugin found through entry points."""
