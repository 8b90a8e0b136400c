"""The program that runs inside a user's container, apart from the worker daemon that starts it.

Standard library only, plus cloudpickle to load the handler and pickle results
(tests/worker/test_runner_stdlib.py enforces it): it is mounted read-only into
images that have nothing else of levers9's dependencies, and it is the one part
of levers9 that user code can reach, with :mod:`levers9.payloads`,
``levers9/__init__.py`` and ``levers9.ready()``: nothing else of levers9 is in a
container (:mod:`levers9.worker.warm.launch`, tests/worker/test_container_boundary.py). It owns the runner (:mod:`~levers9.runner.main`,
``python -m levers9.runner``), the framed wire protocol it speaks with its
worker (:mod:`~levers9.runner.frames`), the HTTP server of serving containers
(:mod:`~levers9.runner.serving`) and the HTTP error answers that server and the
gateway share (:mod:`~levers9.runner.http_errors`).
"""
