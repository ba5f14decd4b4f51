"""``python -m vllm_srun`` runs the ``vllm-srun`` command."""

from vllm_srun.cli import main

raise SystemExit(main())
