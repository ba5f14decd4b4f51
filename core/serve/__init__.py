"""The serve layer: HTTP over the service's models (FastAPI on uvicorn), and nothing else.

- :mod:`.command`: the ``vllm-srun serve`` options and the config they make;
- :mod:`.requests`: what one HTTP request carries: request-level errors and their statuses;
- :mod:`.status`: ``/health`` and the ``/v1/models`` cards;
- :mod:`.schemas`: the pydantic request and response models (the OpenAPI contract);
- :mod:`.app`: the routes, each calling a model's service (plan, admit, ``answer``);
- :mod:`.envelope`: the body limit, ``Server-Timing``, the error documents, and the
  requests in flight reported to the service's drain;
- :mod:`.bundle`: ``/v1/bundle``; :mod:`.systemone` and :mod:`.jev`: System One's schemas;
- :mod:`.responses`: JSON responses and per-request accounting in the metrics;
- :mod:`.autotune`: ``--autotune-cache``, set up before any model loads;
- :mod:`.main`: ``vllm-srun serve``: uvicorn over TCP or a Unix socket, signals.
"""
