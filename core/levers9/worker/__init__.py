"""The worker: what runs containers on a machine for the controlplane.

- :mod:`~levers9.worker.session`: ``levers9 worker``, the session with the controlplane;
- :mod:`~levers9.worker.outbox`: what goes up the session, batched;
- :mod:`~levers9.worker.calls`: calls and outcomes, independent of the wire;
- :mod:`~levers9.worker.warm`: the warm pool of containers that run the calls;
- :mod:`~levers9.worker.credentials`, :mod:`~levers9.worker.leftovers`: the
  worker's token file, and what a crashed worker left behind;
- :mod:`~levers9.worker.identity`: the machine identity shown at the first
  registration, where the provider binds join tokens to machines.

The code inside the containers is :mod:`levers9.runner`; checkpoints are
:mod:`levers9.checkpoint`. The worker talks to the controlplane only through
the protocol: it imports neither ``levers9.state`` nor ``levers9.sdk``, nor the
engine's internals (the layering rule in docs/architecture.md, section 4).
"""
