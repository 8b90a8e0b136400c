"""The operator's ``levers9 machine create --ssh``: joining a box to a pool by installing ``levers9 agent`` on it.

This runs on the operator's machine, called by :mod:`levers9.cli.machine_cmd`;
nothing here runs in the agent (:mod:`levers9.agent`) or the controlplane. The
steps, in the order :func:`levers9.cli.machine_install.join.join_over_ssh` runs
them: :mod:`~levers9.cli.machine_install.remote` (connect; the session and the
errors every step shares), :mod:`~levers9.cli.machine_install.checks` (check the
box, choose the agent software), :mod:`~levers9.cli.machine_install.service`
(the token file, the start script, the service). What the steps hand each other
is in :mod:`~levers9.cli.machine_install.box`. Import the modules themselves:
this package's ``__init__`` imports nothing, so importing one step loads no other.
"""
