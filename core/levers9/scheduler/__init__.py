"""The scheduler: placing requests on workers in GPU preference order, and getting workers when none fit.

- :mod:`~levers9.scheduler.pools` — pools as the scheduler sees them;
- :mod:`~levers9.scheduler.request` — what a request asks for;
- :mod:`~levers9.scheduler.candidates` — which pools may take a request, in what order;
- :mod:`~levers9.scheduler.availability` — (pool, GPU type, region) a provider just said no to;
- :mod:`~levers9.scheduler.planner` — starting machines for work that fits nowhere, with failover;
- :mod:`~levers9.scheduler.controller` — per-pool upkeep: warm minimum, idle release, reconciliation;
- :mod:`~levers9.scheduler.service` — the loops that tie them together.
"""
