"""The worker's front door, over the one engine: ``basics`` (init/shutdown), ``context``, ``collectives``,
``process_sets``, ``topology``, ``launch_env``, and the policy every binding shares.

``basics`` starts and stops Horovod in this process (init/shutdown/rank/size) and holds its one ``context``;
``collectives`` turns numpy buffers into named requests and returns handles; ``process_sets``, ``topology`` (who this
worker is) and ``launch_env`` (workers started by mpirun/srun/torchrun) live beside them, and so does the policy every
binding shares (``gradient_policy``, ``collective_gradients``, ``compression``, ``binding_api``).

Invariants: this layer imports the engine (``horovod.core``) and the ground floor (``horovod.common``), never a
framework, a binding or the launcher; bindings (torch, tensorflow, keras, numpy, jax) sit on top of it and only
convert tensors. Importing it starts nothing: the engine starts in ``init``.
"""
