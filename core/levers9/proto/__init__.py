"""Wire protocol of levers9: generated from the .proto files under proto/ (see scripts/protos)."""
