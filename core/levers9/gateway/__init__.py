"""The gateway: deployed endpoints, queues, jobs and boxes over HTTP, on the controlplane's HTTP port.

- :mod:`~levers9.gateway.routes`: the URLs, who may call them, and which deployment version answers;
- :mod:`~levers9.gateway.autoscaler`: each served stub's ready containers, the bounded wait for one,
  and how many to run (scale up with demand, down to the floor after ``keep_warm``);
- :mod:`~levers9.gateway.upstream`: the hop from the gateway to a container's HTTP server.
"""
