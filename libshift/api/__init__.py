"""Generated gRPC stubs of proto/shift/v1 (regenerate with `make proto`; do not edit)."""
