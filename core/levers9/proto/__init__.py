"""Wire protocol of levers9: generated from the .proto files under proto/ (see scripts/protos)."""

#: the gRPC metadata key a worker's session names its worker id with (its token says which machine it is)
WORKER_ID_METADATA = "levers9-worker-id"
