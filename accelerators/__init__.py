"""Built-in accelerators (cpu, cuda, rocm, xpu, npu, mps), each a plugin found through the ``vllm_srun`` entry points.

Each module is self-contained: it imports ``vllm_srun.plugins`` and torch, never another accelerator.
"""
