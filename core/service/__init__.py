"""The service layer: the model set and the answering of its requests, without HTTP.

- :mod:`.runtime`: :class:`~.runtime.Runtime`, the models with their states, loading
  with retries, resolving the model a request names, and stopping;
- :mod:`.model`: :class:`~.model.ModelService`, one ready model's planner, scheduler and
  finishing stage, with ``answer()`` and ``cancel()``;
- :mod:`.scheduler`: the per-model queue and forward thread;
- :mod:`.finish`: the per-model finishing thread (the family's ``finish``, off the
  forward thread and the event loop);
- :mod:`.drain`: :class:`~.drain.Drain`, the shutdown, in one object;
- :mod:`.timing`: a request's phase timings;
- :mod:`.metrics`: the Prometheus metrics.

It serves what :mod:`vllm_srun.compose` makes; :mod:`vllm_srun.serve` puts it on HTTP.
"""
