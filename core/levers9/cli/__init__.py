"""The ``levers9`` command line: a composition root, the one place besides the server that may import anything.

- :mod:`~levers9.cli.main`: the typer app and its command groups;
- :mod:`~levers9.cli.server_cmd`: ``server``, ``up``, ``worker`` and the operator's offline commands (tokens);
- :mod:`~levers9.cli.client_cmds`: listings against a controlplane (``tasks``, ``pools``, ``workers``, ``cancel``);
- :mod:`~levers9.cli.run_cmd`, :mod:`~levers9.cli.deploy_cmd`: running and deploying an app file;
- :mod:`~levers9.cli.secret_cmd`, :mod:`~levers9.cli.context_cmd`: secrets and client contexts;
- :mod:`~levers9.cli.plugins_cmd`, :mod:`~levers9.cli.config_cmd`, :mod:`~levers9.cli.gpu_cmd`: plugins,
  the config file and the GPU catalog, offline;
- :mod:`~levers9.cli.output`: every listing's output: whole values in a terminal, tab-separated when
  piped, ``--json`` everywhere.
"""
