"""Generated protobuf and gRPC code for levers9.v1; edit proto/ and run scripts/protos."""
