"""Generated gRPC/protobuf code of the aaren service (source: proto/aaren/)."""
