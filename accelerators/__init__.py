"""Built-in accelerators: cpu, cuda, rocm, xpu, npu, mps.

Each module is one plugin, found through the ``vllm_srun`` entry points; it
imports ``vllm_srun.plugins`` and torch, never another accelerator.
"""
