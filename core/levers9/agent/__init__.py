"""The agent a joined machine runs (``levers9 agent``): it dials the controlplane and runs worker containers.

- :mod:`~levers9.agent.credentials`: the state directory and ``agent.json`` (the agent's credential, 0600);
- :mod:`~levers9.agent.connection`: the gRPC side: Join, the Connect stream, reconnecting with back-off;
- :mod:`~levers9.agent.docker_workers`: the Docker side: worker containers started, stopped and listed;
- :mod:`~levers9.agent.inventory`: what the machine has and runs, as the Inventory message reports it;
- :mod:`~levers9.agent.daemon`: the glue the CLI runs (orders dispatched, acknowledged once, inventories sent).

Docker and gRPC are imported by the modules that use them, never by this package's ``__init__``.
"""
