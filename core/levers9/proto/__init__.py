"""The wire protocol of levers9, and the client helpers every side of it shares.

- ``v1/``: generated from the .proto files under proto/ (``scripts/protos``; never edited by hand);
- :mod:`~levers9.proto.target`: parsing the controlplane URL (or list of replicas) a client or worker dials;
- :mod:`~levers9.proto.tls`: the CA certificates a client or worker trusts when it dials over TLS;
- :mod:`~levers9.proto.blobs`: uploading and downloading big payloads in chunks (``PutBlob``/``GetBlob``),
  used by the SDK and the worker alike, so neither imports the other.
"""

#: the gRPC metadata key a worker's session names its worker id with (its token says which machine it is)
WORKER_ID_METADATA = "levers9-worker-id"
