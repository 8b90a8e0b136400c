"""The gateway: deployed endpoints, queues, jobs and boxes over HTTP, on the controlplane's HTTP port.

It imports nothing from :mod:`levers9.controlplane`: deployments, tasks and
workspaces are reached through :mod:`levers9.services`, and errors are answered
with :mod:`levers9.services.errors` and :mod:`levers9.runner.http_errors`.

- :mod:`~levers9.gateway.routes`: the URLs, who may call them, and which deployment version answers;
- :mod:`~levers9.gateway.autoscaler`: each served stub's ready containers, the bounded wait for one,
  and how many to run (scale up with demand, down to the floor after ``keep_warm``);
- :mod:`~levers9.gateway.upstream`: the hop from the gateway to a container's HTTP server.
"""
