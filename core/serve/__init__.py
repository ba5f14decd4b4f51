"""The serve layer: HTTP surfaces over the loaded models (FastAPI on uvicorn).

- :mod:`.command`: the ``vllm-srun serve`` options and the config they make;
- :mod:`.config`: the serve config and the models file;
- :mod:`.runtime`: models, their states, loading and schedulers; answering a request;
- :mod:`.requests`: a request's ``Server-Timing`` phases and request-level errors;
- :mod:`.status`: ``/health`` and the ``/v1/models`` cards;
- :mod:`.schemas`: the pydantic request and response models (the OpenAPI contract);
- :mod:`.app`: the routes;
- :mod:`.envelope`: the body limit, ``Server-Timing`` and the error documents;
- :mod:`.bundle`: ``/v1/bundle``;
- :mod:`.responses`: JSON responses and per-request accounting in the metrics;
- :mod:`.metrics`: Prometheus metrics;
- :mod:`.autotune`: ``--autotune-cache``, set up before any model loads;
- :mod:`.main`: ``vllm-srun serve``: uvicorn over TCP or a Unix socket, signals.
"""
