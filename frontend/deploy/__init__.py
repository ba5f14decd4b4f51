"""The two ways ``vllm-sr serve`` runs the runtime somewhere other than this process:
:mod:`.container` (``vllm-srun serve`` in a Docker or Podman container, in the
foreground) and :mod:`.kubernetes` (``--target kubernetes``: a kustomize overlay over
the bases shipped in :mod:`.kubernetes.manifests`). Both reach the runtime only through a
container CLI or files, never by import.
"""
