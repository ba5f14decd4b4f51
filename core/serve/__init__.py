"""The serve layer: HTTP surfaces over the loaded models (FastAPI on uvicorn).

- :mod:`.config`: the ``serve`` options and the models file;
- :mod:`.runtime`: models, their states and schedulers; answering a surface request;
- :mod:`.schemas`: the pydantic request and response models (the OpenAPI contract);
- :mod:`.app`: routes, errors, limits, ``Server-Timing``;
- :mod:`.metrics`: Prometheus metrics;
- :mod:`.main`: ``vllm-srun serve``: uvicorn over TCP or a Unix socket, signals.
"""
