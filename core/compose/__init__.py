"""The compose layer: everything that makes one served model, before any request.

- :mod:`.registry`: what bytes a served model is made of, and whether they can be trusted;
- :mod:`.adapters`: adapter packages merged into the base model they record;
- :mod:`.placement`: ``--device`` turned into an accelerator, a device and weights' dtype;
- :mod:`.extended`: the surface extensions attached to a loaded model;
- :mod:`.batching`: the forward shapes a model is served with (batch bounds, the
  ``exact`` profile's edges), shared by the probes, the Python API and the scheduler;
- :mod:`.probes` and :mod:`.probe_cache`: load-time probes (batch invariance, the cost
  of a forward), the latter kept per machine;
- :mod:`.loader`: the composition itself (:func:`~.loader.load_model`);
- :mod:`.golden`: the golden self-check a loaded model passes before it serves.

Nothing here answers requests or knows HTTP: the service layer
(:mod:`vllm_srun.service`) serves what this layer makes.
"""
