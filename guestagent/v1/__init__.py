"""Generated protobuf and gRPC modules for guestagent.v1 (built from protos/, not edited)."""
