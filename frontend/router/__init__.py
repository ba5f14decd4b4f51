"""Router mode: OpenAI Chat traffic routed by signals and decisions to LLM backends.

One request flows one way through these modules:

- :mod:`.texts`: the texts a request's messages give the signals (evaluation text,
  whole text, history);
- :mod:`.deadline`: when the signals must have answered;
- :mod:`.signals`: each configured signal kind evaluated (keywords and context here,
  model-backed kinds through the deployments' pools), concurrently, under the deadline;
- :mod:`.decisions`: the rule trees evaluated three-valued, ``on_unknown`` applied, the
  matched decisions ranked;
- :mod:`.selection`: the model chosen and the request rewritten (plugins, reasoning);
- :mod:`.forward`: the rewritten request sent to a backend, JSON or SSE relayed;
- :mod:`.chat`: the listener routes (``/v1/chat/completions``, ``/v1/models``), headers
  and the OpenAI error envelope; :mod:`.preview`: the management preview.

Nothing here imports the runtime: model-backed signals reach workers over HTTP only.
"""
